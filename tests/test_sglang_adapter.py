"""The sglang adapters drive real SGLang 0.5.23: both tree cores agree step for step,
what SGLang cannot show is reported skipped, and bad configurations get a clear error.
(Bugs patched into SGLang's own code: tests/test_sglang_mutants.py.)

Needs SGLang installed (adapters/sglang/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_SGLANG=1, which turns a missing SGLang into a failure instead of a skip."""

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

if os.environ.get("KVSPEC_REQUIRE_SGLANG") != "1" and importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed: pip install --no-deps -r adapters/sglang/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.sglang.runtime import sglang
from kvspec.conformance.harness.protocol import AdapterError, load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.trace import load
from kvspec.conformance.runs.runner import probe
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy


@pytest.mark.parametrize("adapter", ["sglang", "sglang-python"])
def test_a_quick_check_of_real_sglang_passes(adapter, tmp_path):
    result = subprocess.run(["kvspec", "check", "--adapter", adapter, "--profile", "quick", "--seed", "1",
                             "--run", "allocator P=4", "--run", "engine P=4 W=6", "-n", "2"],
                            check=False, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 ok" in result.stdout


def test_the_rust_and_python_tree_cores_agree_step_for_step(tmp_path):
    """Differential: every step on the Rust core also runs on the Python core (whose tree
    is checked in full), and the observables the spec fixes must be equal."""
    result = subprocess.run(["kvspec", "check", "--adapter", "sglang", "--differential", "sglang-python",
                             "--profile", "quick", "--seed", "2", "--run", "engine P=16 W=5", "--run", "engine P=2 W=5"],
                            check=False, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "against sglang-python" in result.stdout


def test_the_rust_core_reports_tree_checks_skipped_not_passed(tmp_path):
    result = subprocess.run(["kvspec", "check", "--adapter", "sglang", "--profile", "quick", "--seed", "1",
                             "--run", "engine P=4 W=6"], check=False, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "adapter lacks observable tree" in result.stdout
    assert "adapter lacks capability refuses_misuse" in result.stdout


def test_an_engine_sglang_cannot_be_is_a_clear_error():
    adapter = load_adapter("sglang-python")
    with pytest.raises(AdapterError, match="policy 'sglang-0.5.23', not 'no-prefix-sharing'"):
        adapter.make_engine(EngineConfig(4, 6, 64, 32, 4, Policy("no-prefix-sharing", 4)))
    with pytest.raises(AdapterError, match="window"):
        adapter.make_engine(EngineConfig(4, 0, 64, 32, 4, Policy("sglang-0.5.23", 4)))
    probe(adapter)  # a valid one builds


def test_the_torchvision_stub_only_stands_in_and_never_runs():
    """SGLang's imports go through; anything of the stub that is called raises."""
    sglang()
    import torchvision

    if getattr(torchvision, "__version__", "").endswith("kvspec.stub"):
        with pytest.raises(RuntimeError, match="stub"):
            torchvision.transforms.Resize(4)


@pytest.mark.parametrize("adapter", ["sglang", "sglang-python"])
def test_a_partial_snapshot_of_sglang_is_the_whole_one_less_free_lists_and_unheld_mapping(adapter):
    """[OBS-4] With large pools SGLang is checked on partial snapshots: free counts read
    off its free and release pages, the mapping at the held slots."""
    from kvspec.conformance.harness.checks import Checks, Tally
    from kvspec.spec.accounting import PartialMapping
    from kvspec.spec.models import fixed_observables
    from kvspec.spec.snapshot import POOL_CHECK_SLOTS

    size = 16 * POOL_CHECK_SLOTS
    adapter = load_adapter(adapter)
    engine = adapter.make_engine(EngineConfig(4, 8, size, size, 4, Policy()))
    engine.admit("a", [1, 2, 3] * 10)
    engine.prefill_chunk("a", 30, 7)
    for token in range(12):
        engine.decode("a", token)
    engine.finish("a", 0)
    engine.admit("b", [1, 2, 3] * 6)
    engine.prefill_chunk("b", 18, 7)
    whole, partial = engine.snapshot(), engine.partial_snapshot()
    assert partial.requests == whole.requests and partial.nodes == whole.nodes and partial.ledgers == whole.ledgers
    for pool in ("full", "swa"):
        shown, hidden = getattr(whole.allocator, pool), getattr(partial.allocator, pool)
        assert hidden.free_pages is None and hidden.free_count == len(shown.free_pages)
    held = {slot for r in whole.requests for slot in r.row} | {slot for n in whole.nodes for slot in n.full_value}
    assert isinstance(partial.allocator.mapping, PartialMapping) and set(partial.allocator.mapping.entries) == held
    assert all(whole.allocator.mapping[slot] == peer for slot, peer in partial.allocator.mapping.entries.items())
    assert fixed_observables(partial, "ok") == fixed_observables(whole, "ok")
    for snapshot in (whole, partial):  # what the adapter shows (the Rust core: no tree)
        assert Checks(adapter.model.snapshot_type, adapter.observables).violations(Tally(), snapshot) == []


@pytest.mark.parametrize("adapter", ["sglang-python", "sglang", "reference"])
def test_a_branch_insert_over_live_and_recovered_nodes_keeps_i9(adapter):
    """vectors/tests/i9-branch-insert.jsonl: CI's differential run found I9 reading a
    chunk's cursor from live nodes the chunk did not publish (a spec mistake, fixed in
    spec.invariants.window.insert_cursor); SGLang's trees and the reference conform on it.
    tests/test_engine_invariants.py has the same case on hand-built snapshots."""
    trace = load(Path(__file__).parents[1] / "vectors" / "tests" / "i9-branch-insert.jsonl")
    result = replay(trace, load_adapter(adapter))
    assert result.conforms, result.verdict()


@pytest.mark.parametrize("adapter", ["sglang-python", "sglang"])
@pytest.mark.parametrize("vector", ["finish-batch-shared-path", "flush-forgets-the-cache",
                                    "waiting-match-splits-and-refreshes", "prefill-batch-finishes"])
def test_the_schedulers_batch_finishes_flushes_and_waiting_matches_replay_with_the_references_observables(adapter, vector):
    """[LIFE-10, LIFE-11, LIFE-12, LIFE-9] process_batch_result_decode's one free group around a
    batch's finishes, Scheduler.flush_cache of an idle server, a cache-aware policy's match of
    waiting requests (a split, and the recency an eviction then reads), and a request released
    in its own prefill batch: both trees show what the reference does at every step."""
    trace = load(Path(__file__).parents[1] / "vectors" / "tests" / f"{vector}.jsonl")
    result = replay(trace, load_adapter(adapter))
    assert result.conforms, result.verdict()
