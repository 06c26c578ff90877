"""Chapter 09, recurrent state: the reference's state pool and state component on worked
examples, and each STATE check failing on a snapshot with one seeded fault (the zoo's
mutants, tests/test_mutants.py, break the same clauses from inside an engine)."""

from dataclasses import replace

import pytest

from kvspec.adapters.mutants import MUTANTS
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay, with_expectations
from kvspec.conformance.runs.vectors import state_walkthrough
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.invariants import engine_violations
from kvspec.spec.models import TWO_POOL, TWO_POOL_STATE, model_for
from kvspec.spec.outcomes import InvalidConfig
from kvspec.spec.snapshot import EngineConfig, Step
from kvspec.spec.state import (
    HybridStateSnapshot,
    StateValue,
    advance_state,
    checkpoint_violations,
    locked_checkpoint_violations,
    min_state_slots,
    released_state_violations,
    state_conservation_violations,
    state_digest,
    state_drained_violations,
    state_in_use_violations,
    state_lock_violations,
    state_ownership_violations,
    state_prefix_hit_violations,
    working_slot_violations,
    working_state_violations,
)
from kvspec.spec.window import Policy

PROMPT = [1, 2, 0, 1, 2, 2, 0, 1, 1, 0]


def engine(page_size=2, grid=4, window=5, max_requests=4, state_slots=None) -> TwoPoolEngine:
    return TwoPoolEngine(EngineConfig(page_size, window, 64, 32, max_requests,
                               state_slots=state_slots or min_state_slots(max_requests), state_grid=grid))


def checked(engine: TwoPoolEngine, previous=None, step=None) -> HybridStateSnapshot:
    now = engine.snapshot()
    assert isinstance(now, HybridStateSnapshot)
    assert engine_violations(previous, step, now) == []
    return now


def prefill(engine: TwoPoolEngine, rid: str, prompt, chunks) -> HybridStateSnapshot:
    previous = checked(engine)
    assert engine.admit(rid, prompt) is None
    previous = checked(engine, previous, Step("admit", rid))
    for chunk in chunks:
        assert engine.prefill_chunk(rid, chunk) is None
        previous = checked(engine, previous, Step("prefill_chunk", rid))
    return previous


def test_the_state_model_extends_the_two_pool_model():
    # [OBS-1] an engine with a state pool shows the two-pool snapshot and its state: every
    # two-pool check applies to it, and the STATE checks besides
    config = EngineConfig(2, 5, 64, 32, 4, state_slots=9, state_grid=4)
    assert model_for(TWO_POOL, config) is TWO_POOL_STATE
    assert model_for(TWO_POOL, replace(config, state_slots=0)) is TWO_POOL
    assert issubclass(TWO_POOL_STATE.snapshot_type, TWO_POOL.snapshot_type)


def test_the_state_stand_in_depends_on_every_token_and_their_order():
    # [STATE-4] what the checks compare slots by
    assert state_digest([]) == 0
    assert state_digest([1, 2]) == advance_state(advance_state(0, 1), 2)
    assert state_digest([1, 2]) != state_digest([2, 1])
    assert state_digest([0]) != state_digest([])


def test_a_checkpoint_is_taken_only_on_the_grid_and_holds_the_state_of_its_path():
    # [STATE-3] chunks of 2 then 2 (grid 4: a checkpoint at 4) then 3 (ends at 7: none)
    e = engine()
    now = prefill(e, "a", PROMPT, [2, 2, 3])
    nodes = {n.node_id: n for n in now.nodes}
    ends = sorted(nodes[node_id].end for node_id, _ in now.state.checkpoints)
    assert ends == [4]
    (node_id, value), = now.state.checkpoints
    assert (value.length, value.digest) == (4, state_digest(PROMPT[:4]))
    # [STATE-4] the working state has read every computed token
    working = now.state.requests[0].values[0]
    assert (working.length, working.digest) == (7, state_digest(PROMPT[:7]))


def test_a_hit_ends_at_the_deepest_checkpoint_and_copies_it():
    # [STATE-5] the full KV of a matches 8 tokens of b's prompt; only 4 have a checkpoint
    e = engine()
    prefill(e, "a", PROMPT, [4, 4, 2])
    previous = checked(e)
    assert e.decode("a") is None  # a runs on, its lock on the node at 8
    previous = checked(e, previous, Step("decode", "a"))
    other = PROMPT[:6] + [0, 0, 0, 0]
    assert e.admit("b", other) is None
    now = checked(e, previous, Step("admit", "b"))
    b = next(r for r in now.requests if r.rid == "b")
    assert b.cache_protected_len == 4
    working = next(r for r in now.state.requests if r.rid == "b").values[0]
    checkpoint = dict(now.state.checkpoints)[b.last_node]
    assert working.slot != checkpoint.slot  # copy-on-write: its own slot
    assert (working.length, working.digest) == (checkpoint.length, checkpoint.digest) == (4, state_digest(PROMPT[:4]))


def test_a_finish_donates_its_state_on_the_grid_and_frees_it_off_the_grid():
    # [STATE-9] a finish at 8 computed tokens (grid 4) donates the working slot; at 10 it frees it
    e = engine()
    prefill(e, "a", PROMPT[:7], [7])  # its insert ends at 6, off the grid: no checkpoint yet
    previous = checked(e)
    assert e.decode("a") is None  # 8 tokens computed
    previous = checked(e, previous, Step("decode", "a"))
    assert previous.state.checkpoints == ()
    slot = previous.state.requests[0].values[0].slot
    e.finish("a")
    now = checked(e, previous, Step("finish", "a"))
    assert slot in {value.slot for _, value in now.state.checkpoints}
    e2 = engine()
    prefill(e2, "a", PROMPT, [10])
    previous = checked(e2)
    e2.finish("a")
    now = checked(e2, previous, Step("finish", "a"))
    assert len(now.state.free_slots) == now.state.num_slots - len(now.state.checkpoints)
    e2.evict(64, 32)
    assert state_drained_violations(e2.snapshot()) == []


def test_a_tight_state_pool_evicts_unlocked_checkpoints_and_never_a_locked_one():
    # [STATE-8] 1 request, 3 slots: a working slot, its locked checkpoint, and one more
    e = engine(max_requests=1)
    assert e.config.state_slots == 3
    prefill(e, "a", PROMPT + PROMPT, [4, 4, 4, 4])
    now = checked(e)
    assert len(now.state.checkpoints) == 2  # the locked one at 16, and the newest unlocked one
    locked = dict(now.state.locks)
    assert all(locked.get(node_id, 0) <= 1 for node_id, _ in now.state.checkpoints)


def test_a_state_pool_below_its_minimum_is_refused():
    # [STATE-2] MODEL-4: a configuration the spec does not allow
    with pytest.raises(InvalidConfig, match="at least 9 slots"):
        engine(state_slots=8)
    with pytest.raises(InvalidConfig, match="multiple of the page size"):
        engine(grid=3)


# -- each check fails on one seeded fault -------------------------------------------------

@pytest.fixture
def running() -> tuple[TwoPoolEngine, HybridStateSnapshot]:
    e = engine()
    prefill(e, "a", PROMPT, [4, 4])
    return e, checked(e)


def with_state(snapshot: HybridStateSnapshot, **changes) -> HybridStateSnapshot:
    return replace(snapshot, state=replace(snapshot.state, **changes))


def test_state_1_a_lost_slot_is_a_leak(running):
    _, now = running
    lost = with_state(now, free_slots=now.state.free_slots[1:])
    assert [v.clause for v in state_conservation_violations(lost)] == ["STATE-1"]


def test_state_2_a_slot_held_twice_or_held_and_free(running):
    _, now = running
    r = now.state.requests[0]
    (node_id, checkpoint), *_ = now.state.checkpoints
    shared = with_state(now, requests=(replace(r, values=(replace(r.values[0], slot=checkpoint.slot),)),))
    assert any("held by" in v.message for v in state_ownership_violations(shared))
    freed = with_state(now, free_slots=(*now.state.free_slots, r.values[0].slot))
    assert any("free but held" in v.message for v in state_ownership_violations(freed))
    padding = with_state(now, free_slots=(*now.state.free_slots, 0))
    assert any("padding" in v.message for v in state_ownership_violations(padding))


def test_state_2_a_request_without_a_working_slot(running):
    _, now = running
    assert [v.clause for v in working_slot_violations(with_state(now, requests=()))] == ["STATE-2"]


def test_state_3_a_checkpoint_off_the_grid_or_of_other_tokens(running):
    _, now = running
    (node_id, value), *rest = now.state.checkpoints
    wrong = with_state(now, checkpoints=((node_id, replace(value, digest=value.digest + 1)), *rest))
    assert [v.clause for v in checkpoint_violations(wrong)] == ["STATE-3"]
    off_grid = with_state(now, grid=3)
    assert any("off the checkpoint grid" in v.message for v in checkpoint_violations(off_grid))


def test_state_4_a_working_state_that_has_not_read_the_computed_tokens(running):
    _, now = running
    r = now.state.requests[0]
    stale = with_state(now, requests=(replace(r, values=(StateValue(r.values[0].slot, 4, state_digest(PROMPT[:4])),)),))
    assert [v.clause for v in working_state_violations(stale)] == ["STATE-4"]


def test_state_5_a_hit_with_no_checkpoint_at_its_end():
    e = engine()
    prefill(e, "a", PROMPT, [4, 4])
    previous = checked(e)
    e.admit("b", PROMPT[:8] + [0, 0])
    now = e.snapshot()
    assert state_prefix_hit_violations(previous, Step("admit", "b"), now) == []
    uncheckpointed = with_state(now, checkpoints=())
    assert [v.clause for v in state_prefix_hit_violations(previous, Step("admit", "b"), uncheckpointed)] == ["STATE-5"]


def test_state_6_a_lock_on_a_node_no_request_ends_at_and_a_wrong_ledger(running):
    _, now = running
    root = next(n.node_id for n in now.nodes if n.parent is None)
    other = next(n.node_id for n in now.nodes if n.parent == root)
    locked = with_state(now, locks=(*now.state.locks, (other, 1)))
    assert any(v.clause == "STATE-6" for v in state_lock_violations(locked))
    ledger = with_state(now, evictable=now.state.evictable + 1)
    assert [v.clause for v in state_lock_violations(ledger)] == ["STATE-6"]


def test_state_7_a_running_request_whose_working_state_was_freed(running):
    _, previous = running
    slot = previous.state.requests[0].values[0].slot
    freed = with_state(previous, free_slots=(*previous.state.free_slots, slot))
    assert [v.clause for v in state_in_use_violations(previous, Step("decode", "a"), freed)] == ["STATE-7"]


def test_state_8_a_locked_checkpoint_evicted(running):
    _, previous = running
    assert previous.state.locks
    gone = with_state(previous, checkpoints=tuple(c for c in previous.state.checkpoints
                                                  if c[0] not in dict(previous.state.locks)))
    assert [v.clause for v in locked_checkpoint_violations(previous, Step("evict"), gone)] == ["STATE-8"]


def test_state_8_in_a_batch_a_lock_moved_by_an_earlier_checkpoint_protects_nothing():
    """A prefill batch checkpoints its requests one after another (LIFE-9): r3's checkpoint
    moves r3's lock off the node it matched, and r4's checkpoint, short of a slot, then
    evicts that node's checkpoint. Legal; STATE-8 reading only the locks before the step
    called it a violation (the reference and both SGLang cores do the same). A checkpoint
    locked by a request that kept its lock still may not go."""
    e = TwoPoolEngine(EngineConfig(1, 3, 21, 16, 3, Policy(decode_eviction_interval=4), state_slots=7, state_grid=1))
    previous = checked(e)
    for step, call in [(Step("admit", "r1"), lambda: e.admit("r1", [0])),
                       (Step("prefill_chunk", "r1"), lambda: e.prefill_chunk("r1", 1)),
                       (Step("admit", "r2"), lambda: e.admit("r2", [0, 0])),
                       (Step("abort", "r1"), lambda: e.abort("r1")),
                       (Step("admit", "r3"), lambda: e.admit("r3", [0] * 9)),
                       (Step("admit", "r4"), lambda: e.admit("r4", [0] * 7)),
                       (Step("prefill_batch", batch=("r2", "r3")),
                        lambda: e.prefill_batch([{"rid": "r2", "chunk": 19, "token": 0},
                                                 {"rid": "r3", "chunk": 2, "token": 0}]))]:
        assert call() is None
        previous = checked(e, previous, step)
    r3_matched = next(r.last_node for r in previous.requests if r.rid == "r3")
    batch = Step("prefill_batch", batch=("r3", "r4"))
    assert e.prefill_batch([{"rid": "r3", "chunk": 19, "token": 0}, {"rid": "r4", "chunk": 19, "token": 0}]) is None
    now = checked(e, previous, batch)  # the step the old reading flagged
    assert r3_matched not in dict(now.state.checkpoints)  # r4's checkpoint took it
    r2_node = next(r.last_node for r in now.requests if r.rid == "r2")
    assert dict(now.state.locks)[r2_node] == 1 and r2_node in dict(now.state.checkpoints)
    taken = with_state(now, checkpoints=tuple(c for c in now.state.checkpoints if c[0] != r2_node))
    assert [v.clause for v in locked_checkpoint_violations(previous, batch, taken)] == ["STATE-8"]


def test_state_9_an_abort_that_keeps_a_slot(running):
    e, previous = running
    e.abort("a")
    now = e.snapshot()
    assert released_state_violations(previous, Step("abort", "a"), now) == []
    slot = previous.state.requests[0].values[0].slot
    kept = with_state(now, free_slots=tuple(s for s in now.state.free_slots if s != slot))
    assert [v.clause for v in released_state_violations(previous, Step("abort", "a"), kept)] == ["STATE-9"]
    assert "STATE-9" in [v.clause for v in state_drained_violations(kept)]


@pytest.mark.parametrize("slug", ["no-copy-on-hit", "shared-state-on-hit", "hit-without-checkpoint"])
def test_the_state_walkthrough_vector_passes_the_reference_and_fails_each_hit_mutant(slug):
    """spec/09-state.md's worked example as a vector (`kvspec vectors` writes it): the
    reference takes every step; a mutant of the hit's copy-on-write fails it at r2's
    admission or its next chunk, by its clause."""
    reference = load_adapter("reference")
    vector = with_expectations(state_walkthrough()["walkthrough-9-state-hit"], reference)
    assert replay(vector, reference).conforms
    mutant = MUTANTS[slug]
    result = replay(vector, load_adapter(mutant.name))
    assert result.failure is not None and mutant.clause in result.failure.clauses, result.verdict()
    assert result.stopped_at in (5, 6)
