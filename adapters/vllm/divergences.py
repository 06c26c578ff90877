"""Every known place where real vLLM 0.33.0 differs from kvspec's spec
(kvspec.adapters.divergence: what an entry is). `tests/test_vllm_divergences.py`
replays every trace (`divergences/<id>.jsonl`) on every adapter it names and requires
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
from pathlib import Path

from kvspec.adapters.divergence import KnownDivergence, main
from kvspec.conformance.harness.trace import engine_config_json
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import VLLM_0_33, Policy

REPORT_FULL = "kvspec.adapters.vllm:VLLM_REPORT_FULL"
VllmDivergence = partial(KnownDivergence, folder=Path(__file__).parent / "divergences")
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
)


if __name__ == "__main__":
    main(KNOWN_DIVERGENCES, sys.argv[1:])
