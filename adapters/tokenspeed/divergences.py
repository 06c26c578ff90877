"""Every known place where TokenSpeed's scheduler 0.1.42 differs from kvspec's spec
(kvspec.adapters.divergence: what an entry is). `tests/test_tokenspeed_divergences.py`
replays every trace (`divergences/<id>.jsonl`) on every adapter it names and requires
the divergence to still reproduce. A scheduler-tier trace carries no expectations: the
spec fixes no plan.

`python -m kvspec.adapters.tokenspeed.divergences` records the traces again (needs
tokenspeed-scheduler installed).
"""

import sys
from functools import partial
from pathlib import Path

from kvspec.adapters.divergence import KnownDivergence, main
from kvspec.conformance.harness.scheduler_machine import scheduler_config_json
from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.scheduler import STATE, SchedulerConfig


def submit(rid: str, prompt: list[int], max_new_tokens: int, outputs: list[int]) -> tuple[str, dict]:
    return "submit", {"rid": rid, "prompt": prompt, "max_new_tokens": max_new_tokens, "outputs": outputs}


STEP = ("step", {})
STEPS_1 = (
    submit("r1", [1], 5, [0] * 5), *[STEP] * 5,
    submit("r2", [0, 2, 0, 0, 0, 0, 0, 0], 5, [0] * 5), STEP,
    submit("r3", [0, 2, 0, 0, 0], 5, [0] * 5), submit("r4", [0, 2, 0, 1, 0, 0, 0, 0, 0], 6, [0] * 5), *[STEP] * 4,
    submit("r5", [0, 2, 0, 1, 0, 0, 0, 0, 0], 6, [0] * 5), STEP,
    submit("r6", [0, 2, 0, 0], 6, [0] * 5), *[STEP] * 4,
    submit("r7", [0], 5, [0] * 5), *[STEP] * 4,
    submit("r8", [0], 5, [2, 0, 0, 0, 0]), *[STEP] * 4,
    submit("r9", [0], 7, [2, 0, 0, 0, 0]), *[STEP] * 4,
)
"""TOKENSPEED-1's steps, as `kvspec check` shrank them (scheduler+state P=1 W=3, CI's seed)."""
TokenSpeedDivergence = partial(KnownDivergence, folder=Path(__file__).parent / "divergences")
"""Upstream paths are those of the tokenspeed-scheduler 0.1.42 sdist (csrc/...)."""

KNOWN_DIVERGENCES: tuple[KnownDivergence, ...] = (
    TokenSpeedDivergence(
        "TOKENSPEED-1", ("SCHED-7",), "with a state group, a retraction where the plan's own page dedup would "
        "have made room",
        "A decode row whose last token completed a page publishes that page to the prefix cache in the same "
        "admission that grows its tables; where the page's tokens are already cached, the publication dedups it "
        "(the table names the cached page instead, and the row's own page is freed). TokenSpeed's admission "
        "checks that the growth fits before that publication, and counts none of the pages it frees: with no "
        "page free, the decodes cannot grow, the round runs nothing, and the empty-round retraction sets a "
        "running request aside; the decodes then run, their dedup frees their own copies, and the plan ends with "
        "as many pages free as the retraction gave back. Published first, the freed copies would have served the "
        "rows, and the retracted request (its image copied out and back) could have kept running. With a "
        "`State` group every first decode rotates the request's state onto a fresh page, which admission did not "
        "reserve, so decodes need pages and this is reached; in runs of full and sliding-window groups alone, "
        "where admission reserves every page a decode needs, it was never met (seven ci-profile checks of both "
        "adapters). Trace (P=1, W=3, 41 pages, a state group): r8 and r9 decode on shared pages with no page "
        "free; the plan retracts r5 (21 pages given back), r9's dedup frees 2 of its pages, and 21 are free "
        "after the plan.",
        "csrc/scheduler/operations/forward.cpp:656-672 scheduleDecode (a decode with completed pages admits "
        "through admitWithKvEventTracking, growth and publication together); csrc/cache/coordinator/"
        "cache_admission.cpp:606-613 AdmissionPlanner::fits (empty parents, reclaimable and evictable blocks; "
        "no block the publication will dedup); csrc/cache/prefix/prefix_index.h:139-157 RegisterFullBlocks (\"a "
        "block that dedupes against an existing canonical entry is replaced in place\"); csrc/scheduler/"
        "operations/forward.cpp:966-1060 maybeRetractForCapacity (the empty-round retraction, then the round's "
        "decodes)",
        "scheduler", scheduler_config_json(SchedulerConfig(1, 3, 41, (FULL, SWA, STATE), max_batch_size=3,
                                                           max_scheduled_tokens=10)),
        STEPS_1,
        adapters=("tokenspeed-state",),
        steered_by="the capability preempts_only_when_needed, which tokenspeed-state (the adapter with a state "
                   "group) lacks: its runs give every request room of its own; tokenspeed and tokenspeed-aborts, "
                   "which press on the pool, have no state group"),
)


if __name__ == "__main__":
    main(KNOWN_DIVERGENCES, sys.argv[1:])
