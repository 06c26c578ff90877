"""[LIFE-11] Flushing the cache: an idle engine drops its whole prefix cache, as SGLang's
`flush_cache` does, and every page of every pool is free after it.

The reference's flush, the misuse every engine must refuse, two seeded bugs the engine
machine finds through its flush steps, and the capability's plumbing: the replay and the
trace format."""

import json
from dataclasses import replace

import pytest
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.engine_machine import ALL, engine_machine
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay, unmet_requirements
from kvspec.conformance.harness.trace import Trace, TraceError, TraceStep, parse
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.invariants import engine_violations
from kvspec.spec.outcomes import InvalidRequest, Outcome
from kvspec.spec.snapshot import EngineConfig, Step, two_pool_drained_violations
from kvspec.spec.window import Policy

POLICY = Policy("sglang-0.5.23", 1)


def config():
    return EngineConfig(page_size=4, window=8, size_full=256, size_swa=64, max_requests=4, policy=POLICY)


def finished(engine_class):
    """a (28 tokens) prefilled, decoded past its window and finished: the tree holds its path,
    tombstones and all; b retracted while decoding: it holds nothing and waits."""
    engine = engine_class(config())
    for rid in ("a", "b"):
        engine.admit(rid, [0] * 28)
        assert engine.prefill_chunk(rid, 28, 0) is None
        for _ in range(12):
            assert engine.decode(rid, 0) is None
    engine.finish("a", 0)
    engine.retract("b")
    return engine


def test_a_flush_frees_every_page_and_the_next_admission_matches_nothing():
    engine = finished(TwoPoolEngine)
    before = engine.snapshot()
    assert two_pool_drained_violations(before) != [], "a's path is cached before the flush"
    engine.flush()
    after = engine.snapshot()
    assert engine_violations(before, Step("flush", None, Outcome.OK), after) == []
    assert two_pool_drained_violations(after) == [] and len(after.nodes) == 1  # the root alone
    engine.admit("c", [0] * 28)
    engine.admit("b")  # retracted before the flush: admitted again with its tokens, matching nothing
    assert [(r.rid, r.cache_protected_len) for r in engine.snapshot().requests] == [("c", 0), ("b", 0)]


def test_a_flush_with_a_request_running_is_refused_and_changes_nothing():
    """[LIFE-11, LIFE-1] SGLang's flush_cache does nothing while a request runs or waits."""
    engine = finished(TwoPoolEngine)
    engine.admit("c", [0] * 5)
    before = engine.snapshot()
    with pytest.raises(InvalidRequest, match=r"flush while requests are running \(c\)"):
        engine.flush()
    assert engine.snapshot() == before


class KeepsThePools(TwoPoolEngine):
    """Seeded: the flush resets the tree but forgets to clear the pools (its pages leak)."""

    def flush(self):
        self.refuse_misuse("flush")
        self.states, self.tree = self.empty_cache()


class KeepsEverything(TwoPoolEngine):
    """Seeded: the flush refuses what it must and does nothing else; every invariant of a
    step holds after it (the tree still owns its pages), only the flush's own end state,
    every page free, does not."""

    def flush(self):
        self.refuse_misuse("flush")


class KeepsTheTree(TwoPoolEngine):
    """Seeded: the flush clears the pools but keeps the tree, which now holds free slots."""

    def flush(self):
        self.refuse_misuse("flush")
        self.allocator.clear()


RUNS = settings(max_examples=30, stateful_step_count=30, database=None, deadline=None, phases=[Phase.generate])


@pytest.mark.parametrize("engine_class, says", [
    (KeepsThePools, r"\[I2\] full pool: .* \(leaked pages\)"),  # pages nothing holds
    (KeepsEverything, r"after flushing the cache:\n\[I2\] \d+ full pages are not free \(leak\)"),  # LIFE-11's end
    (KeepsTheTree, r"\[I5\] position \d+ \(full slot \d+\) has live SWA KV but maps to 0"),  # the tree's, unmapped
])
def test_the_engine_machine_finds_a_flush_that_forgets_half_the_cache(engine_class, says):
    machine = engine_machine(engine_class, 4, 8, POLICY, ALL | {"flush"})
    with pytest.raises(InvariantViolation, match=says):
        run_state_machine_as_test(seed(0)(machine), settings=RUNS)


def test_the_engine_machine_flushes_only_with_the_capability():
    """Without `flush` the runs draw as before: no flush step, and the seeded bugs go unseen."""
    steps = []
    machine = engine_machine(KeepsThePools, 4, 8, POLICY, ALL)
    machine.journal = staticmethod(lambda kind, what: steps.append(what))
    run_state_machine_as_test(seed(0)(machine), settings=settings(RUNS, max_examples=10))
    assert steps and not any(step.op == "flush" for step in steps if hasattr(step, "op"))


def trace(*steps):
    config = {"page_size": 4, "window": 8, "size_full": 256, "size_swa": 64, "max_requests": 4,
              "policy": {"version": "sglang-0.5.23", "decode_eviction_interval": 1, "chunk_release": True}}
    return Trace("engine", config, "flush", tuple(steps))


def test_a_trace_with_a_flush_needs_the_capability_and_replays_on_the_reference():
    steps = (TraceStep("admit", {"rid": "a", "prompt": [0] * 9}), TraceStep("prefill_chunk", {"rid": "a", "chunk": 9, "token": 0}),
             TraceStep("finish", {"rid": "a", "trim": 0}), TraceStep("flush", {}),
             TraceStep("admit", {"rid": "b", "prompt": [0] * 9}), TraceStep("flush", {}, refuse=True),
             TraceStep("drain", {}))
    flushes = trace(*steps)
    reference = load_adapter("reference")
    assert unmet_requirements(flushes, reference) == []
    lacking = replace(reference, capabilities=frozenset(reference.capabilities) - {"flush"})
    assert unmet_requirements(flushes, lacking) == ["capability flush"]
    assert replay(parse(flushes.dumps()), reference).conforms


def test_a_flush_with_arguments_is_a_malformed_trace():
    header, step = trace(TraceStep("flush", {})).dumps().splitlines()
    step = json.loads(step)
    step["args"] = {"rid": "a"}
    with pytest.raises(TraceError, match="line 2: args: .* is expected to be empty"):
        parse("\n".join([header, json.dumps(step)]) + "\n")
