"""Every known place where TokenSpeed's scheduler 0.1.42 differs from kvspec's spec
(kvspec.adapters.divergence: what an entry is). `tests/test_tokenspeed_divergences.py`
replays every trace (`vectors/divergences/tokenspeed/<id>.jsonl`) on every adapter it names and requires
the divergence to still reproduce. A scheduler-tier trace carries no expectations: the
spec fixes no plan.

`python -m kvspec.adapters.tokenspeed.divergences` records the traces again (needs
tokenspeed-scheduler installed).
"""

import sys
from functools import partial

from kvspec.adapters.divergence import DIVERGENCES, KnownDivergence, main
from kvspec.conformance.harness.scheduler_machine import scheduler_config_json
from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.scheduler import SchedulerConfig


def submit(rid: str, prompt: list[int], max_new_tokens: int, outputs: list[int]) -> tuple[str, dict]:
    return "submit", {"rid": rid, "prompt": prompt, "max_new_tokens": max_new_tokens, "outputs": outputs}


STEERED_BY = ("the capability preempts_only_when_needed, which tokenspeed (a snapshot pool: it retracts) lacks: its "
              "runs give every request room of their own. tokenspeed-aborts keeps it, its runs the only ones of "
              "TokenSpeed that press on the pool, and meets this rarely (none of 38 ci-profile checks of scheduler "
              "P=2 W=5 and P=4 W=7, against 3 of 13 with a snapshot pool): CI checks it at --seed 0, which passes; "
              "a check at another seed can stop here")

TokenSpeedDivergence = partial(KnownDivergence, folder=DIVERGENCES / "tokenspeed")
"""Upstream paths are those of the tokenspeed-scheduler 0.1.42 sdist (csrc/...)."""

KNOWN_DIVERGENCES: tuple[KnownDivergence, ...] = (
    TokenSpeedDivergence(
        "TOKENSPEED-1", ("SCHED-7",), "a preemption where the plan's own page dedup would have made room",
        "A decode row whose last token completed a page publishes that page to the prefix cache in the same "
        "admission that grows its tables; where those tokens are cached already, the publication dedups the page "
        "(the table names the cached page instead, and the row's own copy is freed). The admission's fit counts "
        "empty pages, the request's own expired ones and evictable cache entries, not the copies its publication "
        "will free: with no page free, the decodes cannot grow, the round runs nothing, and the empty-round path "
        "preempts a running request (with a snapshot pool it retracts it, its image copied out and back; without "
        "one it aborts it, and the client loses the request); then the decodes run, their dedup frees their "
        "copies, and the plan ends with as many pages free as the preemption gave back. Published first, the "
        "copies would have served the rows. Trace (P=2, W=5, 32 pages, every token 0): two one-token requests "
        "r2 and r3 decode, then r1 (20 tokens) is admitted on their cached first pages and takes the last 20 "
        "pages for its first chunk; at the next plan r2 and r3 each need a sliding-window page and none is free, "
        "so the plan preempts r1 (the incomplete prefill ranks first for a retraction; the newest resident is "
        "the one aborted), their publication dedups their pages, and 20 pages are free after the plan, all r1 "
        "held. Found by CI's ci-profile check at a random seed, with and without a state group; shrunk from seed "
        "11 of `scheduler P=2 W=5` to 4 steps, then varied (page count, prompt length, arrival order) until one "
        "trace showed it on both builds. The victims differ: with a snapshot pool, decodes are ranked by the "
        "pages they newly free; without one, no image fits and the newest resident is aborted, which in random "
        "runs is more often one of the blocked decodes, whose pages the plan then needs (see steered_by for "
        "how often checks met it).",
        "csrc/scheduler/operations/forward.cpp:656-672 scheduleDecode (a decode with completed pages admits "
        "through admitWithKvEventTracking, growth and publication together); csrc/cache/coordinator/"
        "cache_admission.cpp:607-614 AdmissionPlanner::fits (empty parents, the request's reclaimable and the "
        "cache's evictable blocks; no block the publication will dedup); csrc/cache/prefix/prefix_index.h:140-157 "
        "RegisterFullBlocks (\"a block that dedupes against an existing canonical entry is replaced in place\"); "
        "csrc/scheduler/operations/forward.cpp:967-1063 maybeRetractForCapacity (the empty-round preemption, "
        "then the round's decodes); csrc/scheduler/operations/forward.cpp:745-803 chooseVictim (an incomplete "
        "prefill first, then decodes by the pages they newly free, among those whose image fits; where none "
        "fits, as always without a snapshot pool, the newest resident, aborted)",
        "scheduler", scheduler_config_json(SchedulerConfig(2, 5, 32, (FULL, SWA), max_batch_size=3,
                                                           max_scheduled_tokens=8)),
        (submit("r2", [0], 9, [0] * 9), submit("r3", [0], 9, [0] * 9), submit("r1", [0] * 20, 9, [0] * 9),
         ("drain", {})),
        adapters=("tokenspeed", "tokenspeed-aborts"),
        steered_by=STEERED_BY),
)


if __name__ == "__main__":
    main(KNOWN_DIVERGENCES, sys.argv[1:])
