"""Every known place where real vLLM 0.33.0 differs from kvspec's spec
(kvspec.adapters.divergence: what an entry is). `tests/test_vllm_divergences.py`
replays every trace (`vectors/divergences/vllm/<id>.jsonl`) on every adapter it names and requires
the divergence to still reproduce. Each trace carries the reference's expectations (OBS-3:
its shared block pool, chapter 08), up to the diverging step.

`kvspec check --adapter vllm --differential reference --profile ci` (CI runs it) compares
vLLM with the reference step for step: it finds no difference. The one it found while the
reference's block pool was built, the vLLM adapter dropping the scheduler's
`shared_prefix_boundary`, was an adapter bug, fixed (tests/test_vllm_differential.py).

Not a divergence, although it looks like one: an `allocate_slots` that returns None
(OutOfMemory) has already released the request's out-of-window sliding-window blocks
(`remove_skipped_blocks` runs before the capacity check). The spec allows exactly that:
`I15` lets the window release that runs before an allocation move the request's cursor
in a failed step, and `BLOCK-6` says the release happens at every allocation.
`tests/test_vllm_adapter.py` shows it happening and conforming.

`python -m kvspec.adapters.vllm.divergences` records the traces again (needs vLLM).
"""

import sys
from functools import partial

from kvspec.adapters.divergence import DIVERGENCES, KnownDivergence, main
from kvspec.conformance.harness.scheduler_machine import scheduler_config_json
from kvspec.conformance.harness.trace import engine_config_json
from kvspec.spec.scheduler import SchedulerConfig
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import VLLM_0_33, Policy

REPORT_FULL = "kvspec.adapters.vllm:VLLM_REPORT_FULL"
SCHEDULERS = ("vllm-scheduler", "vllm-scheduler-dense")
PRESSURE = ("the capability preempts_only_when_needed, which the vllm-scheduler adapters lack: their scheduler "
            "runs give every request room of its own, so that no plan preempts (no vLLM option changes the loop)")


def submit(rid: str, token: int, prompt: int, outputs: int) -> tuple[str, dict]:
    """A request of `prompt` tokens, all `token` (one token per request: no prefix is shared),
    that ends after `outputs` outputs, its limit."""
    return "submit", {"rid": rid, "prompt": [token] * prompt, "max_new_tokens": outputs, "outputs": [token] * outputs}


STEP = ("step", {})
VllmDivergence = partial(KnownDivergence, folder=DIVERGENCES / "vllm")
"""Upstream paths are vLLM 0.33.0's (vllm/...)."""

KNOWN_DIVERGENCES: tuple[KnownDivergence, ...] = (
    VllmDivergence(
        "VLLM-1", ("BLOCK-8",), "kv_cache_report_mode=\"full\" stores a cached block again on every hit",
        "A request that asks for full KV-event reports (SamplingParams.extra_args kv_cache_report_mode=\"full\") "
        "gets, at every prefix lookup that hits, a BlockStored event for each hit block, although those blocks are "
        "already cached and the map does not change; no BlockRemoved balances it. vLLM does it on purpose (\"so "
        "that external consumers (e.g. gateway) can learn about them\"), but the stream then no longer says what "
        "is cached: replaying it counts each hit block's key once more per hit, and since the map may hold one key "
        "for several blocks, a consumer cannot tell a report from a second copy. It believes a key is cached after "
        "its blocks were evicted. The default report mode publishes only changes and replays exactly (BLOCK-8 "
        "holds for the vllm adapters, which keep it).",
        "v1/core/kv_cache_manager.py:309-317 get_computed_blocks (coordinator.emit_cached_block_events when "
        "kv_cache_report_mode == \"full\"); v1/request.py:126",
        "engine", engine_config_json(EngineConfig(4, 6, 64, 32, 4, Policy(VLLM_0_33, 4))),
        (("admit", {"rid": "a", "prompt": list(range(12))}), ("prefill_chunk", {"rid": "a", "chunk": 12, "token": 0}),
         ("finish", {"rid": "a", "trim": 0}), ("admit", {"rid": "b", "prompt": list(range(12))})),
        adapters=(REPORT_FULL,), steered_by="the vllm adapters keep vLLM's default kv_cache_report_mode"),
    VllmDivergence(
        "VLLM-2", ("SCHED-7",), "a running request that cannot grow preempts itself, though no row needs its pages",
        "When a running request's allocate_slots fails, vLLM's scheduler preempts the lowest-priority running "
        "request (FCFS: the last of `running`) and tries again, until the allocation succeeds or the victim is the "
        "request itself: \"No more request to preempt. Cannot schedule this request.\" The request then gives "
        "back its blocks, recomputed later from a prefix hit, although no row of the plan uses them: it is the "
        "last running request, so none is scheduled after it, and a step that preempted admits no waiting "
        "request. The same plan without the preemption (the request left running, not forwarded) would have "
        "been as good; its pages serve only later plans. Trace: a and b (4-token prompts, P=4, 6 pages) fill "
        "4 pages; at their first decode a takes the last 2 free pages, b's allocation fails and b preempts "
        "itself: 2 pages given back, 2 free after the plan.",
        "v1/core/sched/scheduler.py:913-981 schedule (the allocate_slots retry loop; the victim is "
        "self.running.pop(); `if preempted_req == request: break`); :1050 (no waiting request is admitted in a "
        "step that preempted)",
        "scheduler", scheduler_config_json(SchedulerConfig(4, 7, 6, max_batch_size=2, max_scheduled_tokens=8)),
        (submit("a", 0, 4, 3), submit("b", 1, 4, 3), STEP, STEP), adapters=SCHEDULERS, steered_by=PRESSURE),
    VllmDivergence(
        "VLLM-3", ("SCHED-7",), "a preemption decided before the same step's window releases, which would have "
        "sufficed",
        "vLLM releases a request's out-of-window sliding-window blocks only inside its own allocate_slots "
        "(remove_skipped_blocks, before the capacity check). schedule() allocates for the running requests one "
        "after another, so when one of them cannot allocate it preempts a victim before the requests after it "
        "have released theirs; once they do, the plan ends with as many pages free as the victim gave back: "
        "released first, those blocks would have served the rows without the preemption. Trace (P=2, W=3, 13 "
        "pages): x (4 tokens), y (5) and z (2) prefill, 1 page free; at the next decode x needs 2 pages and "
        "preempts z (2 pages), then y's allocation releases its first sliding-window block and needs none: 2 "
        "pages free after the plan, enough for x without preempting z.",
        "v1/core/kv_cache_manager.py:556-586 allocate_slots (remove_skipped_blocks for this request only, then the "
        "capacity check); v1/core/sched/scheduler.py:913-981 schedule (preempts on the first failure)",
        "scheduler", scheduler_config_json(SchedulerConfig(2, 3, 13, max_batch_size=3, max_scheduled_tokens=12)),
        (submit("x", 0, 4, 3), submit("y", 1, 5, 3), submit("z", 2, 2, 3), STEP, STEP), adapters=SCHEDULERS,
        steered_by=PRESSURE),
)


if __name__ == "__main__":
    main(KNOWN_DIVERGENCES, sys.argv[1:])
