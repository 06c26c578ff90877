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
from kvspec.spec.scheduler import SchedulerConfig


def submit(rid: str, prompt: list[int], max_new_tokens: int, outputs: list[int]) -> tuple[str, dict]:
    return "submit", {"rid": rid, "prompt": prompt, "max_new_tokens": max_new_tokens, "outputs": outputs}


TokenSpeedDivergence = partial(KnownDivergence, folder=Path(__file__).parent / "divergences")
"""Upstream paths are those of the tokenspeed-scheduler 0.1.42 sdist (csrc/...)."""

KNOWN_DIVERGENCES: tuple[KnownDivergence, ...] = (
    TokenSpeedDivergence(
        "TOKENSPEED-1", ("SCHED-7",), "a retraction where the plan's own page dedup would have made room",
        "A decode row whose last token completed a page publishes that page to the prefix cache in the same "
        "admission that grows its tables; where those tokens are cached already, the publication dedups the page "
        "(the table names the cached page instead, and the row's own copy is freed). The admission's fit counts "
        "empty pages, the request's own expired ones and evictable cache entries, not the copies its publication "
        "will free: with no page free, the decodes cannot grow, the round runs nothing, and the empty-round "
        "retraction sets a running request aside; then the decodes run, their dedup frees their copies, and the "
        "plan ends with as many pages free as the retraction gave back. Published first, the copies would have "
        "served the rows, and the retracted request (its image copied out and back) could have kept running. "
        "Trace (P=2, W=5, 28 pages, every token 0): r1 (16 tokens) and two one-token requests r2 and r3, which "
        "decode on pages holding what r1's first pages hold; with no page free, r2 and r3 each need one "
        "sliding-window page, the plan retracts r1 (15 pages), their publication dedups 3 of their pages onto "
        "r1's, and 15 pages are free after the plan. Found by CI's ci-profile check at random seeds, with and "
        "without a state group (shrunk from seed 11 of `scheduler P=2 W=5`); in 13 checks of these runs it "
        "showed at 3 seeds with a snapshot pool, and at none without one (tokenspeed-aborts: the capacity abort "
        "is reached by the same empty-round path, but its admissions set pages aside differently; not "
        "investigated further).",
        "csrc/scheduler/operations/forward.cpp:656-672 scheduleDecode (a decode with completed pages admits "
        "through admitWithKvEventTracking, growth and publication together); csrc/cache/coordinator/"
        "cache_admission.cpp:607-614 AdmissionPlanner::fits (empty parents, the request's reclaimable and the "
        "cache's evictable blocks; no block the publication will dedup); csrc/cache/prefix/prefix_index.h:140-157 "
        "RegisterFullBlocks (\"a block that dedupes against an existing canonical entry is replaced in place\"); "
        "csrc/scheduler/operations/forward.cpp:967-1063 maybeRetractForCapacity (the empty-round retraction, "
        "then the round's decodes)",
        "scheduler", scheduler_config_json(SchedulerConfig(2, 5, 28, (FULL, SWA), max_batch_size=3,
                                                           max_scheduled_tokens=8)),
        (submit("r1", [0] * 16, 9, [0] * 9), submit("r2", [0], 9, [0] * 9), submit("r3", [0], 9, [0] * 9),
         ("drain", {})),
        adapters=("tokenspeed",),
        steered_by="the capability preempts_only_when_needed, which tokenspeed (a snapshot pool: it retracts) "
                   "lacks: its runs give every request room of its own; tokenspeed-aborts, which presses on the "
                   "pool, takes the same steps without it"),
)


if __name__ == "__main__":
    main(KNOWN_DIVERGENCES, sys.argv[1:])
