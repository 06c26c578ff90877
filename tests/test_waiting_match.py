"""[LIFE-12] A waiting request's match: the scheduler matches a prompt no request holds yet
(SGLang under its cache-aware policies, every round); the tree may split the node the match
ends in and refreshes the recency of the path, and nothing else changes.

The reference's match, its effect on what an eviction takes, the misuse every engine must
refuse, seeded bugs the step's own check (spec.invariants.tree.match_violations) and the
engine machine catch, and the capability's plumbing."""

from dataclasses import replace

import pytest
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.engine_machine import ALL, engine_machine
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay, unmet_requirements
from kvspec.conformance.harness.trace import Trace, TraceStep, parse
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.invariants.tree import match_violations
from kvspec.spec.models import TWO_POOL, model_for
from kvspec.spec.outcomes import InvalidRequest
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy

POLICY = Policy("sglang-0.5.23", 1)
A, B = [0] * 16, [0] * 8 + [1] * 8  # two paths below a shared node of 8 tokens


def config():
    return EngineConfig(page_size=4, window=8, size_full=128, size_swa=64, max_requests=4, policy=POLICY)


def cached(engine_class=TwoPoolEngine):
    """a's 16 tokens, then b's (the first 8 shared), each finished into the tree."""
    engine = engine_class(config())
    for rid, prompt in (("a", A + [2]), ("b", B + [2])):
        engine.admit(rid, prompt)
        assert engine.prefill_chunk(rid, len(prompt), 0) is None
        engine.finish(rid, 0)
    return engine


def shape(snapshot):
    return sorted((node.start, len(node.key)) for node in snapshot.nodes if node.parent is not None)


def test_a_match_that_ends_inside_a_node_splits_it_and_changes_nothing_else():
    engine = cached()
    before = engine.snapshot()
    engine.match(A[:12] + [1, 1, 1, 1])  # ends 4 tokens into a's own leaf [8, 16)
    after = engine.snapshot()
    assert shape(before) == [(0, 8), (8, 8), (8, 8)] and shape(after) == [(0, 8), (8, 4), (8, 8), (12, 4)]
    assert match_violations(before, after) == [] and after.requests == before.requests
    assert after.allocator == before.allocator


def test_a_match_makes_its_path_the_most_recent_so_an_eviction_takes_the_other_leaf():
    """[TREE-5] b's leaf was cached last; a match of a's prompt makes a's path the most
    recent, and the eviction of one leaf's worth now takes b's."""
    for matched, kept in ((None, B), (A, A)):
        engine = cached()
        if matched is not None:
            engine.match(matched + [2])
        engine.evict(8, 0)
        engine.admit("c", kept + [2])
        assert engine.snapshot().requests[0].cache_protected_len == 16, (matched, kept)


def test_a_match_of_an_empty_prompt_is_refused_and_changes_nothing():
    engine = cached()
    before = engine.snapshot()
    with pytest.raises(InvalidRequest, match="a match needs a prompt of at least one token"):
        engine.match([])
    assert engine.snapshot() == before


class LocksTheMatch(TwoPoolEngine):
    """Seeded: the match locks the node it ends on, as an admission would, and no one
    unlocks it: the path can never be evicted."""

    def match(self, prompt):
        self.refuse_misuse("match", prompt=prompt)
        node, _ = self.tree.match(prompt)
        self.tree.lock(node)


class EvictsWhatItPasses(TwoPoolEngine):
    """Seeded: the match evicts the least recently used leaf to make room for the request it
    has not admitted (an allocation's eviction, run a step early)."""

    def match(self, prompt):
        super().match(prompt)
        self.tree.evict(self.page_size, 0)


@pytest.mark.parametrize("engine_class, says", [
    (LocksTheMatch, r"\[I11\] node \d+: full lock ref 1, .* but 0 requests lock a path through it"),
    (EvictsWhatItPasses, r"\[LIFE-12\] a match changed the full pool's free pages"),
])
def test_the_checks_catch_a_match_that_changes_more_than_a_split(engine_class, says):
    """A lock no request holds is I11's; freed pages are the match's own check's."""
    driver = EngineDriver(cached(engine_class), model_for(TWO_POOL, config()), TWO_POOL.observables)
    with pytest.raises(InvariantViolation, match=says):
        driver.call("match", {"prompt": A + [2]})


def test_the_matchs_own_check_reads_every_token_of_the_tree():
    """A node gone (evicted, its pages freed) and a node tombstoned (shown with its SWA gone)
    are changes to the tree's tokens, each named by its full slot, whatever the nodes' shape."""
    engine = cached()
    before = engine.snapshot()
    engine.tree.evict(0, 4)  # deletes the least recently used leaf, a's
    found = match_violations(before, engine.snapshot())
    assert {v.clause for v in found} == {"LIFE-12"} and any("the SWA pool's free pages" in v.message for v in found)
    assert sum("before, not in the tree after" in v.message for v in found) == 8
    leaf = max(before.nodes, key=lambda node: node.node_id)
    tombstoned = replace(before, nodes=tuple(replace(node, swa_value=None) if node is leaf else node for node in before.nodes))
    found = match_violations(before, tombstoned)
    assert len(found) == len(leaf.key) and all(", None, 0, 0) after" in v.message for v in found), found


RUNS = settings(max_examples=30, stateful_step_count=30, database=None, deadline=None, phases=[Phase.generate])


@pytest.mark.parametrize("engine_class", [LocksTheMatch, EvictsWhatItPasses])
def test_the_engine_machine_finds_a_match_that_changes_more_than_a_split(engine_class):
    machine = engine_machine(engine_class, 4, 8, POLICY, ALL | {"waiting_matches"})
    with pytest.raises(InvariantViolation, match=r"\[LIFE-12\]|\[I11\]"):
        run_state_machine_as_test(seed(0)(machine), settings=settings(RUNS, max_examples=200))
    run_state_machine_as_test(seed(0)(engine_machine(engine_class, 4, 8, POLICY, ALL)),
                              settings=settings(RUNS, max_examples=10))  # without the capability: no match, no find


def test_a_trace_with_a_match_needs_the_capability_and_replays_on_the_reference():
    config = {"page_size": 4, "window": 8, "size_full": 128, "size_swa": 64, "max_requests": 4,
              "policy": {"version": "sglang-0.5.23", "decode_eviction_interval": 1, "chunk_release": True}}
    steps = (TraceStep("admit", {"rid": "a", "prompt": A + [2]}), TraceStep("prefill_chunk", {"rid": "a", "chunk": 17, "token": 0}),
             TraceStep("finish", {"rid": "a", "trim": 0}), TraceStep("match", {"prompt": A[:12] + [1] * 4}),
             TraceStep("drain", {}))
    matches = Trace("engine", config, "match", steps)
    reference = load_adapter("reference")
    assert unmet_requirements(matches, reference) == []
    lacking = replace(reference, capabilities=frozenset(reference.capabilities) - {"waiting_matches"})
    assert unmet_requirements(matches, lacking) == ["capability waiting_matches"]
    assert replay(parse(matches.dumps()), reference).conforms
