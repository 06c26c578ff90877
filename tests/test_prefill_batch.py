"""[LIFE-9] A prefill batch: one chunk of each of several requests in one step, allocated
all or none, then checkpointed in order, the completing ones inside one free group.

The reference's batch, the step checks that read a batch's requests (I10, I15), the
grouped SWA free that reads the mapping too late (a seeded bug, and SGLang 0.5.18's:
tests/test_sglang_releases.py replays its vector), and the capability's plumbing: the
protocol, the replay and the trace format."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvspec.adapters.mutants.allocator import GroupEndMappingAllocator
from kvspec.adapters.mutants.seeding import engine_with_allocator
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import unmet_requirements
from kvspec.conformance.harness.trace import TraceError, load, parse
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.invariants import engine_violations
from kvspec.spec.invariants.atomicity import atomicity_violations
from kvspec.spec.invariants.window import insert_boundary_violations
from kvspec.spec.outcomes import Outcome, OutOfMemory
from kvspec.spec.snapshot import EngineConfig, Step, two_pool_observables
from kvspec.spec.window import Policy

VECTOR = "vectors/regressions/sglang/grouped-swa-free-remap.jsonl"


def config(window=8, size_full=256, size_swa=64, version="sglang-0.5.23", interval=1):
    return EngineConfig(page_size=4, window=window, size_full=size_full, size_swa=size_swa, max_requests=4,
                        policy=Policy(version, interval))


def batch(*chunks):
    return [{"rid": rid, "chunk": chunk, "token": 0} for rid, chunk in chunks]


def shared_prefix_batch(engine_class):
    """b's prompt is the first 22 of a's 28 tokens; both complete in one batch."""
    engine = engine_class(config())
    engine.admit("a", [0] * 28)
    engine.admit("b", [0] * 22)
    before = engine.snapshot()
    assert engine.prefill_batch(batch(("a", 28), ("b", 22))) is None
    return before, engine.snapshot()


def test_a_batch_whose_second_checkpoint_revives_the_firsts_tombstone_conforms():
    before, after = shared_prefix_batch(TwoPoolEngine)
    step = Step("prefill_batch", None, Outcome.OK, batch=("a", "b"))
    assert engine_violations(before, step, after) == []
    lengths = {r.rid: (r.cache_protected_len, r.swa_evicted_seqlen) for r in after.requests}
    assert lengths == {"a": (28, 16), "b": (20, 12)}  # b's insert revived [12, 16) onto its own SWA


def test_the_seeded_group_end_mapping_read_breaks_the_mapping():
    """The seeded bug (mutant group-end-mapping, SGLang 0.5.18): the group's end reads the
    mapping b's revive re-pointed and frees b's SWA under the live node."""
    before, after = shared_prefix_batch(engine_with_allocator(GroupEndMappingAllocator))
    step = Step("prefill_batch", None, Outcome.OK, batch=("a", "b"))
    clauses = {v.clause for v in engine_violations(before, step, after)}
    assert {"I3", "I5", "I13"} <= clauses


def test_a_batch_of_unrelated_prompts_ends_as_its_chunks_one_by_one():
    """Without shared prefixes a batch's allocation before the checkpoints changes nothing the
    spec fixes: free pages and request lengths are those of the same chunks one by one."""
    prompts = {"a": [1, 2] * 9, "b": [0] * 13, "c": [2, 1, 1] * 4}
    chunks = batch(("a", 18), ("b", 8), ("c", 30))
    one_by_one, batched = TwoPoolEngine(config()), TwoPoolEngine(config())
    for engine in (one_by_one, batched):
        for rid, prompt in prompts.items():
            engine.admit(rid, prompt)
    for chunk in chunks:
        one_by_one.prefill_chunk(chunk["rid"], chunk["chunk"], chunk["token"])
    batched.prefill_batch(chunks)
    assert two_pool_observables(batched.snapshot(), "ok") == two_pool_observables(one_by_one.snapshot(), "ok")


def test_a_batch_the_pools_cannot_hold_changes_no_request():
    """[LIFE-9, I15] All or none: each chunk fits alone, the two together do not."""
    engine = TwoPoolEngine(config(size_full=96, size_swa=24))
    engine.admit("a", [1] * 16)
    engine.admit("b", [2] * 16)
    before = engine.snapshot()
    assert isinstance(engine.prefill_batch(batch(("a", 16), ("b", 16))), OutOfMemory)
    assert engine.snapshot() == before
    assert engine.prefill_chunk("a", 16, 0) is None


def test_i15_reads_every_request_of_a_failed_batch():
    """[I15] Seeded: a 'failed' batch after which its second request had changed."""
    engine = TwoPoolEngine(config())
    engine.admit("a", [1] * 9)
    engine.admit("b", [2] * 9)
    before = engine.snapshot()
    engine.prefill_chunk("b", 4, 0)
    failed = Step("prefill_batch", None, Outcome.OUT_OF_MEMORY, batch=("a", "b"))
    found = atomicity_violations(before, failed, engine.snapshot())
    assert [v.clause for v in found] == ["I15"] and "request b changed" in found[0].message
    assert atomicity_violations(before, Step("prefill_batch", None, Outcome.OUT_OF_MEMORY, batch=("a",)),
                                engine.snapshot()) == []


def test_i10_reads_every_checkpoint_of_a_batch():
    """[I10] drop-margin leaves a short leaf where 1 <= W % P <= P - 2 (WIN-2): at P = 4,
    W = 5 a 10-token prompt's checkpoint does; the batch's second request is the one."""
    engine = TwoPoolEngine(config(window=5, version="drop-margin"))
    engine.admit("a", [1] * 3)
    engine.admit("b", [2] * 10)
    before = engine.snapshot()
    engine.prefill_batch(batch(("a", 3), ("b", 10)))
    found = insert_boundary_violations(before, Step("prefill_batch", None, Outcome.OK, batch=("a", "b")),
                                       engine.snapshot())
    assert found and all(v.clause == "I10" and "request b" in v.message for v in found)


def test_a_trace_with_a_batch_needs_the_capability():
    trace = load(VECTOR)
    reference = load_adapter("reference")
    assert unmet_requirements(trace, reference) == []
    lacking = replace(reference, capabilities=frozenset(reference.capabilities) - {"batched_prefill"})
    assert unmet_requirements(trace, lacking) == ["capability batched_prefill"]


def test_an_empty_batch_is_a_malformed_trace():
    lines = Path(VECTOR).read_text().splitlines()
    step = json.loads(lines[-1])
    step["args"]["chunks"] = []
    with pytest.raises(TraceError, match="chunks"):
        parse("\n".join(lines[:-1] + [json.dumps(step)]) + "\n")


def finishing_batch(engine_class):
    """a (28 tokens) ends with its first token, in the batch that completes b (its first 22)."""
    engine = engine_class(config())
    engine.admit("a", [0] * 28)
    engine.admit("b", [0] * 22)
    before = engine.snapshot()
    chunks = batch(("a", 28), ("b", 22))
    chunks[0]["finish"] = True
    assert engine.prefill_batch(chunks) is None
    return engine, before


def test_a_request_the_batch_finishes_is_released_in_its_place_and_keeps_its_window_in_the_cache():
    """[LIFE-9] a is released in the group, as a finish releases it, then b checkpoints; a's
    28 tokens go into the cache without a checkpoint's window eviction first: all their SWA
    KV stays live there (7 pages), where a checkpoint then a finish leaves 3 (the window)."""
    engine, before = finishing_batch(TwoPoolEngine)
    after = engine.snapshot()
    assert engine_violations(before, Step("prefill_batch", None, Outcome.OK, batch=("a", "b")), after) == []
    assert [(r.rid, r.cache_protected_len) for r in after.requests] == [("b", 20)]
    engine.admit("c", [0] * 29)
    assert {r.rid: r.cache_protected_len for r in engine.snapshot().requests}["c"] == 28
    free_swa = []
    for finish in (True, False):
        alone = TwoPoolEngine(config())
        alone.admit("a", [0] * 28)
        alone.prefill_batch([{"rid": "a", "chunk": 28, "token": 0, "finish": finish}])
        if not finish:
            alone.finish("a", 0)
        free_swa.append(alone.snapshot().allocator.swa.free_count)
    assert free_swa == [16 - 7, 16 - 3]


class FinishForgetsItsKV(TwoPoolEngine):
    """Seeded: a request the batch finishes is dropped from the running set, its KV neither
    cached nor freed."""

    def release(self, request, checkpoint, owned):
        if request.kv_committed_len == len(request.tokens) and not request.finished_prefill:
            self.tree.unlock(request.lock) if request.lock is not None else None
            self.drop(request)  # BUG: its pages stay allocated, held by no one
            return
        super().release(request, checkpoint, owned)


def test_a_batch_that_drops_a_finished_request_without_releasing_its_kv_leaks():
    engine, before = finishing_batch(FinishForgetsItsKV)
    found = engine_violations(before, Step("prefill_batch", None, Outcome.OK, batch=("a", "b")), engine.snapshot())
    assert {"I2", "I3"} <= {v.clause for v in found}, found


def test_a_node_only_a_finished_request_locked_may_be_revived_later_in_the_batch():
    """[I14, LIFE-9] a's prefill left [0, 4) a tombstone its lock holds; b (matched nothing,
    sharing that first page) chunks in the batch that finishes a. a's release gives its lock
    back, then b's checkpoint revives the tombstone with b's own slots and frees a's (TREE-3):
    no locked KV was freed. The same change with a still running (its lock held) is I14's."""
    a = [0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 2, 1, 0, 2, 0, 1, 2, 2, 2, 1, 1, 0, 1, 1, 2, 2]
    b = [0, 0, 0, 0, 0, 2, 0, 2, 0, 2, 2, 0, 0, 0, 1, 0, 2, 0, 1, 1]
    engine = TwoPoolEngine(config(size_full=128))
    engine.admit("a", a)
    engine.admit("b", b)
    engine.prefill_chunk("a", 13, 0)
    engine.prefill_chunk("a", 12, 0)
    before = engine.snapshot()
    engine.prefill_batch([{"rid": "b", "chunk": 7, "token": 0}, {"rid": "a", "chunk": 1, "token": 1, "finish": True}])
    after = engine.snapshot()
    head = lambda snapshot: next(n for n in snapshot.nodes if n.parent is not None and n.start == 0)  # noqa: E731
    assert head(before).swa_value is None and head(after).full_value != head(before).full_value  # revived anew
    step = Step("prefill_batch", None, Outcome.OK, batch=("b", "a"))
    assert engine_violations(before, step, after) == []
    still_running = replace(after, requests=after.requests + tuple(r for r in before.requests if r.rid == "a"))
    found = [v for v in engine_violations(before, step, still_running) if v.clause == "I14"]
    assert found and "full-locked node" in found[0].message


def test_a_request_the_batch_finished_may_be_admitted_again_under_its_id():
    """The trace alone shows a finish chunk's request gone (replay.unknown_request): admitted
    again, it is no request still running, as after a finish."""
    from kvspec.conformance.harness.replay import unknown_request
    from kvspec.conformance.harness.trace import Trace, TraceStep

    header = {"page_size": 4, "window": 8, "size_full": 256, "size_swa": 64, "max_requests": 4,
              "policy": {"version": "sglang-0.5.23", "decode_eviction_interval": 1}}
    steps = (TraceStep("admit", {"rid": "a", "prompt": [0] * 9}, expect={"outcome": "ok"}),
             TraceStep("admit", {"rid": "b", "prompt": [1] * 9}, expect={"outcome": "ok"}),
             TraceStep("prefill_batch", {"chunks": [{"rid": "a", "chunk": 9, "token": 0, "finish": True},
                                                    {"rid": "b", "chunk": 9, "token": 0}]}, expect={"outcome": "ok"}),
             TraceStep("admit", {"rid": "a", "prompt": [0] * 9}), TraceStep("admit", {"rid": "b", "prompt": [0] * 9}))
    trace = Trace("engine", header, "x", steps)
    assert unknown_request(trace, 3) is None
    assert "already running" in unknown_request(trace, 4)
