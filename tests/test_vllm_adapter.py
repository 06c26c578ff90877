"""The vllm adapters drive real vLLM 0.33.0's KV cache manager: a check passes in both
prefix-cache retention modes with the two-pool checks reported skipped, what the
adapter shows is vLLM's own state (the scripted trace of docs/engines/vllm.md §7, block for
block), a failed allocation's early window release conforms, and bad input is a clear
error.

Needs vLLM installed (adapters/vllm/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_VLLM=1, which turns a missing vLLM into a failure instead of a skip."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.vllm import runtime
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.protocol import AdapterError, load_adapter
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.block_pool import NULL_BLOCK, SWA, PartialBlocks, swa_block_bound
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import SGLANG_0_5_23, VLLM_0_33, Policy


def driver(adapter: str, page_size: int, window: int, size_full: int, size_swa: int) -> EngineDriver:
    loaded = load_adapter(adapter)
    config = EngineConfig(page_size, window, size_full, size_swa, 4, Policy(VLLM_0_33, 4))
    return EngineDriver(loaded.make_engine(config), loaded.model, loaded.observables)


def swa_table(d: EngineDriver, rid: str) -> list:
    view = d.previous.block_pool
    request = next(r for r in view.requests if r.rid == rid)
    return ["." if b == NULL_BLOCK else b for b in request.tables[view.groups.index(SWA)]]


def free_blocks(d: EngineDriver) -> int:
    return len(d.previous.block_pool.free_queue)


@pytest.mark.parametrize("adapter", ["vllm", "vllm-dense"])
def test_a_check_passes_and_runs_only_the_block_pool_checks(adapter, tmp_path):
    """[BLOCK-1, BLOCK-5, BLOCK-6, OBS-1] One engine run at the quick profile, every step
    checked: conformant, the block-pool clauses checked, and no check of the two-pool
    model counted at all (the tree's locks, the pools' leak checks): it does not apply to
    a shared block pool, so nothing is skipped either."""
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", adapter,
                           "--profile", "quick", "--run", "engine P=4 W=7 I=1", "--seed", "0", "--json", str(report),
                           "--traces", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    classes = json.loads(report.read_text())["classes"]
    assert classes["window-bound"]["checked"] > 0 and classes["window-bound"]["violated"] == 0
    assert classes["locks"]["checked"] == 0, "no block-pool invariant is of the locks class: a two-pool check ran"
    assert classes["leak"]["checked"] > 0 and all(counts["skipped"] == 0 for counts in classes.values())


def test_the_view_is_vllms_own_state_the_scripted_trace():
    """[BLOCK-4, BLOCK-6] The scripted trace of docs/engines/vllm.md §7 (block size 4, vLLM
    sliding_window 8 = the spec's window 7, 64 blocks, chunks of 8): the same SWA tables,
    null blocks where the window released them, and the same free counts, read through
    the adapter after every step."""
    d = driver("vllm-dense", 4, 7, 128, 124)  # 63 blocks + the null block
    d.call("admit", {"rid": "A", "prompt": [t % 5 for t in range(30)]})
    seen = []
    for chunk in (8, 8, 8, 8):
        d.call("prefill_chunk", {"rid": "A", "chunk": chunk, "token": 1})
        seen.append((free_blocks(d), swa_table(d, "A")))
    for _ in range(3):
        d.call("decode", {"rid": "A", "token": 1})
        seen.append((free_blocks(d), swa_table(d, "A")))
    assert seen == [
        (59, [3, 4]),
        (55, [3, 4, 7, 8]),
        (53, [".", ".", 7, 8, 11, 12]),
        (51, [".", ".", ".", ".", 11, 12, 15, 16]),
        (52, [".", ".", ".", ".", ".", 12, 15, 16]),
        (53, [".", ".", ".", ".", ".", ".", 15, 16]),
        (51, [".", ".", ".", ".", ".", ".", 15, 16, 18]),
    ]
    # decode: 3 real SWA blocks, the tight bound 1 + cdiv(W, block_size) reached
    assert len([b for b in seen[4][1] if b != "."]) == swa_block_bound(7, 1, 4) == 3
    full = next(r for r in d.previous.block_pool.requests if r.rid == "A").tables[0]
    row = next(r for r in d.previous.requests if r.rid == "A").row
    assert row == tuple(full[i // 4] * 4 + i % 4 for i in range(33))  # slot = block * block_size + offset


def test_a_failed_allocation_releases_the_window_first_and_conforms():
    """[I15, BLOCK-6] Not a divergence: vLLM's allocate_slots releases the request's
    out-of-window SWA blocks before its capacity check, so a chunk that ends in
    OutOfMemory has freed two blocks and moved the request's released range. I15 allows
    exactly that (the window release before an allocation may move the cursor), and
    BLOCK-6 requires the release at every allocation; every check passes on the step."""
    d = driver("vllm-dense", 4, 7, 28, 16)  # 11 blocks + the null block
    d.call("admit", {"rid": "A", "prompt": list(range(24))})
    d.call("prefill_chunk", {"rid": "A", "chunk": 8, "token": 0})
    d.call("prefill_chunk", {"rid": "A", "chunk": 8, "token": 0})
    d.call("admit", {"rid": "B", "prompt": [9, 9, 9, 9]})
    d.call("prefill_chunk", {"rid": "B", "chunk": 4, "token": 0})
    assert (free_blocks(d), swa_table(d, "A")) == (1, [3, 4, 7, 8])
    assert d.call("prefill_chunk", {"rid": "A", "chunk": 8, "token": 0}) == "out_of_memory"
    assert (free_blocks(d), swa_table(d, "A")) == (3, [".", ".", 7, 8])
    after = next(r for r in d.previous.requests if r.rid == "A")
    assert (after.kv_committed_len, after.swa_evicted_seqlen) == (16, 8)


def test_misuse_is_refused():
    """[LIFE-1] What vLLM's manager would not notice (a decode during prefill, an unknown
    request, finishing twice) the adapter refuses, as vLLM's scheduler never asks it."""
    d = driver("vllm", 4, 6, 64, 32)
    d.call("admit", {"rid": "a", "prompt": [1, 2, 3]})
    for op, args in (("decode", {"rid": "a", "token": 0}), ("decode", {"rid": "nobody", "token": 0}),
                     ("finish", {"rid": "a", "trim": 0}), ("admit", {"rid": "a", "prompt": [1]}),
                     ("admit", {"rid": "c", "prompt": []}), ("evict", {"full_tokens": -1, "swa_tokens": 0})):
        with pytest.raises(InvalidRequest):
            getattr(d.engine, op)(*args.values())


def test_a_pd_decode_admission_loads_the_prompt_through_the_connector_path_as_the_reference_does():
    """[LIFE-6, OBS-3] pd_admit is vLLM's scheduler admitting a request whose prompt a KV
    connector loads: its local hit, an allocation of the rest as external computed tokens
    with caching delayed, and the blocks cached once loaded. Step by step what the spec
    fixes is the reference's: a hit on a prompt already cached, the sliding-window group
    holding blocks from the window on only, the loaded blocks a later request hits."""
    from kvspec.conformance.harness.trace import TraceStep
    from kvspec.reference.block_pool_engine import BlockPoolEngine
    from kvspec.spec.models import BLOCK_POOL

    config = EngineConfig(4, 6, 64, 64, 4, Policy(VLLM_0_33, 4))
    vllm = EngineDriver(load_adapter("vllm").make_engine(config), BLOCK_POOL, frozenset(BLOCK_POOL.observables))
    reference = EngineDriver(BlockPoolEngine(config), BLOCK_POOL, frozenset(BLOCK_POOL.observables))
    prompt = [1, 2, 3, 1] * 5
    for op, args in (("pd_admit", {"rid": "a", "prompt": prompt, "first_output": 7}), ("decode", {"rid": "a", "token": 8}),
                     ("pd_admit", {"rid": "b", "prompt": [*prompt, 5], "first_output": 7}),
                     ("finish", {"rid": "a", "trim": 0}), ("admit", {"rid": "c", "prompt": [*prompt, 6]}),
                     ("prefill_chunk", {"rid": "c", "chunk": 4, "token": 1})):
        assert vllm.apply(TraceStep(op, args)) == reference.apply(TraceStep(op, args)), op
    assert swa_table(vllm, "b")[0] == ".", "the window of b's loaded prompt starts past its first block"
    rows = {r.rid: r for r in vllm.previous.requests}
    assert rows["b"].kv_committed_len == 21 and rows["c"].kv_committed_len == 21
    assert "pd_decode" in load_adapter("vllm").capabilities
    from kvspec.adapters.vllm.releases.catalog import capabilities  # members' (loading one imports its release)
    assert "pd_decode" not in capabilities("0.17.1") and "pd_decode" in capabilities("0.18.0")


def test_an_engine_configuration_vllm_cannot_take_is_a_clear_error():
    """[WIN-1, MODEL-4] The two-pool policy versions are not vLLM's; nor are sizes off the block size."""
    make = load_adapter("vllm").make_engine
    with pytest.raises(AdapterError, match="implements policy 'vllm-0.33'"):
        make(EngineConfig(4, 6, 64, 32, 4, Policy(SGLANG_0_5_23)))
    with pytest.raises(AdapterError, match="multiple of the page size"):
        make(EngineConfig(4, 6, 62, 32, 4, Policy(VLLM_0_33)))
    with pytest.raises(InvalidConfig, match="two-pool model"):  # and the reference is not vLLM's either
        TwoPoolEngine(EngineConfig(4, 6, 64, 32, 4, Policy(VLLM_0_33)))


def test_a_missing_vllm_says_how_to_install_it(monkeypatch):
    """Without vLLM, building the adapter's engine fails with the install command."""
    runtime.vllm.cache_clear()
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_manager", None)
    try:
        with pytest.raises(AdapterError, match="pip install --no-deps -r adapters/vllm/requirements.txt"):
            load_adapter("vllm").make_engine(EngineConfig(4, 6, 64, 32, 4, Policy(VLLM_0_33)))
    finally:
        runtime.vllm.cache_clear()


def test_traces_of_the_two_pool_model_are_skipped_not_failed(tmp_path):
    """[WIN-1] kvspec's conformance vectors (vectors/conformance/) are the reference's:
    replaying them on vLLM replays those of its policy version (the reference's shared
    block pool) and skips every other with the reason; where nothing is left to check,
    that exits 2, and 0 with --allow-skipped."""
    vectors = Path(__file__).parents[1] / "vectors" / "conformance"
    replay = [sys.executable, "-m", "kvspec.conformance.cli", "replay", str(vectors), "--adapter", "vllm"]
    done = subprocess.run(replay, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lacks policy version sglang-0.5.23 (it implements vllm-0.33)" in done.stdout
    assert "24 of 24 trace(s) replayed in full" in done.stdout
    two_pool = tmp_path / "two-pool"
    two_pool.mkdir()
    walkthrough = vectors / "engine" / "two-pool" / "sglang-0.5.23" / "walkthrough-4.3-chunked-prefill.jsonl"
    (two_pool / "a.jsonl").write_bytes(walkthrough.read_bytes())
    replay[4] = str(two_pool)
    refused = subprocess.run(replay, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and "nothing was replayed" in refused.stderr, refused.stdout + refused.stderr
    done = subprocess.run([*replay, "--allow-skipped"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "0 of 0 trace(s) replayed" in done.stdout, done.stdout + done.stderr


# -- partial views [OBS-4] ---------------------------------------------------------------

def first_failure(adapter_name: str, page_size: int, window: int, partial: bool, seed: int):
    """The first step of the benchmark's workload at which a check fails, and its clauses;
    with `partial`, every view after the first is a partial one."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from workload import Workload, small_pools

    from kvspec.conformance.harness.checks import StepFailure
    adapter = load_adapter(adapter_name)
    workload = Workload(adapter, small_pools(page_size, window, Policy(VLLM_0_33, 4)), seed, check=True)
    if partial:
        workload.driver.period = 1 << 30
    for index in range(400):
        try:
            workload.one()
        except StepFailure as failure:
            return index, failure.clauses
    return None


@pytest.mark.parametrize("mutant", ["hit-left-in-free-queue", "hit-without-reference", "window-release-without-free",
                                    "null-block-freed", "evicted-key-stays-mapped", "no-removed-event",
                                    "free-forgets-a-group", "table-one-block-short", "no-window-release"])
def test_partial_views_find_each_seeded_bug_at_the_step_whole_views_do(mutant):
    """A partial view shows what a step could change: the blocks the tables name now or
    named at the last view, those an evict dropped, every cache key the events touched or
    a shown block carries or lost. On every vLLM mutant its first failing step, and what
    it breaks, are those of whole views (no-removed-event: a key whose block lost it)."""
    page_size, window = (2, 5) if mutant in ("hit-left-in-free-queue", "hit-without-reference",
                                            "window-release-without-free", "null-block-freed",
                                            "no-window-release") else (4, 6)
    whole = first_failure(f"vllm-mutant-{mutant}", page_size, window, False, 0)
    assert whole is not None, "the mutant's bug is not reached by the workload at seed 0"
    assert first_failure(f"vllm-mutant-{mutant}", page_size, window, True, 0) == whole


def test_a_partial_view_is_the_whole_one_where_it_shows_it_and_large_pools_use_it():
    d = driver("vllm", 1, 24, 1 << 16, 1 << 16)
    assert d.period == 32
    d.call("admit", {"rid": "a", "prompt": list(range(60))})
    d.call("prefill_chunk", {"rid": "a", "chunk": 60, "token": 7})
    for token in range(10):
        d.call("decode", {"rid": "a", "token": token})
    assert isinstance(d.previous.block_pool.blocks, PartialBlocks)  # the driver's schedule: partial between whole ones
    partial, whole = d.engine.partial_snapshot().block_pool, d.engine.snapshot().block_pool
    assert isinstance(partial.blocks, PartialBlocks) and len(partial.blocks) == len(whole.blocks)
    assert 1 < len(partial.blocks.keys()) < len(whole.blocks) // 100
    assert all(whole.blocks[i] == block for i, block in partial.blocks.items())
    assert partial.free_count == len(whole.free_queue) == whole.free_count
    assert set(partial.free_queue) == set(whole.free_queue) & partial.blocks.keys()
    assert partial.requests == whole.requests and set(partial.cache_map) <= set(whole.cache_map)
