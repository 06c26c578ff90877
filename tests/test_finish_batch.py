"""[LIFE-10] The finishes of one decode batch: several decoding requests released in order
inside one free group, as a scheduler processes a decode batch's results.

The reference's batch, a seeded bug the step checks catch, the misuse every engine must
refuse, and the capability's plumbing: the protocol, the replay and the trace format."""

import json
from dataclasses import replace

import pytest

from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay, unmet_requirements
from kvspec.conformance.harness.trace import Trace, TraceError, TraceStep, parse
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.invariants import engine_violations
from kvspec.spec.outcomes import InvalidRequest, Outcome
from kvspec.spec.snapshot import EngineConfig, Step, two_pool_observables
from kvspec.spec.window import Policy


def config():
    return EngineConfig(page_size=4, window=8, size_full=256, size_swa=64, max_requests=4, policy=Policy("sglang-0.5.23", 1))


def decoded(engine_class, decodes=12):
    """a (28 tokens) and b (its first 22) prefilled and decoded past their window, so each
    released SWA below its cursor: their finishes insert one shared path, tombstones and all."""
    engine = engine_class(config())
    for rid, length in (("a", 28), ("b", 22)):
        engine.admit(rid, [0] * length)
        assert engine.prefill_chunk(rid, length, 0) is None
    for _ in range(decodes):
        for rid in ("a", "b"):
            assert engine.decode(rid, 0) is None
    return engine


FINISHES = [{"rid": "a", "trim": 2}, {"rid": "b", "trim": 0}]


def test_a_batch_of_finishes_that_share_a_path_conforms_and_ends_as_the_finishes_one_by_one():
    """[LIFE-10] The group only defers the frees: b's insert meets the path a's inserted, with a's
    frees still queued, and the batch ends where the finishes one by one do."""
    batched, one_by_one = decoded(TwoPoolEngine), decoded(TwoPoolEngine)
    before = batched.snapshot()
    batched.finish_batch(FINISHES)
    step = Step("finish_batch", None, Outcome.OK, batch=("a", "b"))
    assert engine_violations(before, step, batched.snapshot()) == []
    for finish in FINISHES:
        one_by_one.finish(finish["rid"], finish["trim"])
    assert batched.snapshot().requests == () and two_pool_observables(batched.snapshot(), "ok") == \
        two_pool_observables(one_by_one.snapshot(), "ok")


class FirstFinishOnly(TwoPoolEngine):
    """Seeded: the batch's loop releases its first request and forgets the others' rows."""

    def finish_batch(self, finishes):
        first, *rest = finishes
        self.finish(first["rid"], first["trim"])
        for finish in rest:
            del self.requests[finish["rid"]]


def test_a_batch_that_drops_a_request_without_releasing_it_leaks():
    engine = decoded(FirstFinishOnly)
    before = engine.snapshot()
    engine.finish_batch(FINISHES)
    found = engine_violations(before, Step("finish_batch", None, Outcome.OK, batch=("a", "b")), engine.snapshot())
    assert "I2" in {v.clause for v in found}, found


@pytest.mark.parametrize("finishes, says", [
    ([], "a finish batch needs at least one finish"),
    ([{"rid": "a", "trim": 0}, {"rid": "a", "trim": 0}], "names request 'a' twice"),
    ([{"rid": "a", "trim": 0}, {"rid": "c", "trim": 0}], "unknown request 'c'"),
    ([{"rid": "a", "trim": 0}, {"rid": "p", "trim": 0}], "cannot finish during prefill"),
    ([{"rid": "b", "trim": 99}], "trim 99 must lie within its own tokens"),
])
def test_a_batch_that_finish_alone_would_refuse_is_refused_and_changes_nothing(finishes, says):
    """[LIFE-10, LIFE-1] Empty, a request twice, or a finish that finish would refuse."""
    engine = decoded(TwoPoolEngine, decodes=2)
    engine.admit("p", [1] * 5)
    before = engine.snapshot()
    with pytest.raises(InvalidRequest, match=says):
        engine.finish_batch(finishes)
    assert engine.snapshot() == before


def trace(*steps):
    config = {"page_size": 4, "window": 8, "size_full": 256, "size_swa": 64, "max_requests": 4,
              "policy": {"version": "sglang-0.5.23", "decode_eviction_interval": 1, "chunk_release": True}}
    return Trace("engine", config, "finish batch", tuple(steps))


def test_a_trace_with_a_finish_batch_needs_the_capability_and_replays_on_the_reference():
    steps = (TraceStep("admit", {"rid": "a", "prompt": [0] * 9}), TraceStep("prefill_chunk", {"rid": "a", "chunk": 9, "token": 0}),
             TraceStep("admit", {"rid": "b", "prompt": [0] * 6}), TraceStep("prefill_chunk", {"rid": "b", "chunk": 6, "token": 0}),
             TraceStep("decode", {"rid": "a", "token": 0}), TraceStep("decode", {"rid": "b", "token": 0}),
             TraceStep("finish_batch", {"finishes": FINISHES[:1] + [{"rid": "b", "trim": 1}]}), TraceStep("drain", {}))
    batch = trace(*steps)
    reference = load_adapter("reference")
    assert unmet_requirements(batch, reference) == []
    lacking = replace(reference, capabilities=frozenset(reference.capabilities) - {"batched_finish"})
    assert unmet_requirements(batch, lacking) == ["capability batched_finish"]
    assert replay(parse(batch.dumps()), reference).conforms


def test_an_empty_finish_batch_is_a_malformed_trace():
    header, *steps = trace(TraceStep("finish_batch", {"finishes": [{"rid": "a", "trim": 0}]})).dumps().splitlines()
    step = json.loads(steps[-1])
    step["args"]["finishes"] = []
    with pytest.raises(TraceError, match="finishes"):
        parse("\n".join([header, json.dumps(step)]) + "\n")
