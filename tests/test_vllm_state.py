"""Recurrent state in a shared block pool (spec chapter 09, STATE-10 .. STATE-14) on real
vLLM 0.33.0: a Mamba group in align mode beside the full and sliding-window groups.
Each check of kvspec.spec.block_pool_state fails on a seeded fault of a real snapshot;
the chapter-08 view of a state engine is the pool less the state group's blocks; the
state runs pass on unpatched vLLM; the state mutants are caught by their class.

Needs vLLM installed (adapters/vllm/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_VLLM=1, which turns a missing vLLM into a failure instead of a skip."""

import importlib.util
import os
from dataclasses import replace

import pytest

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.vllm import VLLM, VLLM_DENSE
from kvspec.adapters.vllm.engine import VllmEngine
from kvspec.adapters.vllm.mutants import STATE_MUTANTS
from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.declarations import STATE_CONFIGS, Run
from kvspec.conformance.harness.engine_machine import engine_machine
from kvspec.conformance.harness.profiles import profile
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.spec.block_pool import NULL_BLOCK, PartialBlocks
from kvspec.spec.block_pool_state import (
    BlockPoolStateSnapshot,
    block_state_violations,
    running_entry,
    state_hit_violations,
    state_reference_violations,
    state_sizing_violations,
    state_table_violations,
)
from kvspec.spec.invariants import INVARIANTS, applicable, engine_violations
from kvspec.spec.models import BLOCK_POOL, BLOCK_POOL_STATE, model_for, with_state
from kvspec.spec.snapshot import EngineConfig, Step
from kvspec.spec.state import StateValue
from kvspec.spec.window import VLLM_0_33, Policy

SEED = 0
SETTINGS = settings(profile("quick"), max_examples=60, database=None, phases=[Phase.explicit, Phase.generate])


def engine(page_size=1, grid=1, retention=None) -> VllmEngine:
    config = EngineConfig(page_size=page_size, window=3 * page_size, size_full=64 * page_size,
                          size_swa=32 * page_size, max_requests=4, policy=Policy(VLLM_0_33), state_slots=9,
                          state_grid=grid)
    return VllmEngine(config, retention=retention)


def checked(e: VllmEngine, previous, operation: str, *args):
    """Run one step and check it with every invariant of the state model."""
    getattr(e, operation)(*args)
    now = e.snapshot()
    found = engine_violations(previous, Step(operation, args[0] if args else None), now)
    assert not found, found
    return now


@pytest.fixture(scope="module")
def hit():
    """A request prefills and decodes, finishes, and a second one hits its cached state:
    (the snapshot before the hit, the snapshot after it)."""
    e = engine()
    now = e.snapshot()
    prompt = list(range(1, 7))
    now = checked(e, now, "admit", "a", prompt)
    now = checked(e, now, "prefill_chunk", "a", 3, 0)
    while "a" not in e.finished_prefill:  # vLLM's scheduler stops a chunk at the prompt's last cacheable state
        now = checked(e, now, "prefill_chunk", "a", 100, 0)
    now = checked(e, now, "decode", "a", 5)
    now = checked(e, now, "finish", "a")
    before = now
    after = checked(e, now, "admit", "b", prompt + [9])
    assert e.requests["b"].num_computed_tokens == 6
    return before, after


def test_with_state_of_the_block_pool_model_is_the_block_pool_state_model():
    assert with_state(BLOCK_POOL) is BLOCK_POOL_STATE
    assert BLOCK_POOL_STATE.snapshot_type is BlockPoolStateSnapshot
    config = engine().config
    assert model_for(BLOCK_POOL, config) is BLOCK_POOL_STATE
    clauses = {check.clause for check in applicable(BlockPoolStateSnapshot)}
    assert {f"BLOCK-{n}" for n in range(1, 9)} <= clauses  # chapter 08's checks all still apply
    assert {f"STATE-{n}" for n in range(10, 15)} <= clauses
    assert not {f"STATE-{n}" for n in range(1, 10)} & clauses  # those read the two-pool snapshot


def test_the_attention_view_is_the_pool_less_the_state_blocks(hit):
    _, now = hit
    pool, state = now.block_pool, now.state
    assert isinstance(pool.blocks, PartialBlocks)
    state_ids = {block.block_id for block in state.blocks}
    assert state_ids and not state_ids & set(pool.blocks)
    assert set(pool.blocks) | state_ids == set(range(len(pool.blocks)))
    assert all(group != state.group for _, group, _ in pool.cache_map)
    assert pool.free_count == len(pool.free_queue) + len(state.free_blocks)


def test_a_hit_ends_at_a_cached_state_of_exactly_the_hit(hit):
    _, now = hit
    table = next(t for t in now.state.tables if t.rid == "b")
    block = next(b for b in now.state.blocks if b.block_id == table.table[-1])
    assert block.key_length == 6 and block.value == block.promised
    assert table.table[:-1] == (NULL_BLOCK,) * 5


def test_state_10_a_running_state_in_the_null_block_or_an_extra_uncached_state(hit):
    _, now = hit
    t = next(t for t in now.state.tables if t.rid == "b")
    nulled = replace(now, state=replace(now.state, tables=(replace(t, table=t.table[:-1] + (NULL_BLOCK,)),)))
    assert any("running state" in v.message for v in state_table_violations(nulled))
    short = replace(now, state=replace(now.state, tables=(replace(t, table=t.table[1:]),)))
    assert any("entries" in v.message for v in state_table_violations(short))
    uncached = [b.block_id for b in now.state.blocks if b.key is None]
    extra = uncached[:2] if len(uncached) >= 2 else [b.block_id for b in now.state.blocks if b.key is None][:1]
    if len(extra) == 2:
        seeded = replace(t, table=(extra[0], extra[1]) + t.table[2:])
        assert any(v.clause == "STATE-10" for v in state_table_violations(
            replace(now, state=replace(now.state, tables=(seeded,)))))
    assert running_entry(6, 1) == 5 and running_entry(6, 4) == 1


def test_state_11_a_running_state_or_a_cached_state_that_has_not_read_its_tokens(hit):
    _, now = hit
    blocks = list(now.state.blocks)
    t = next(t for t in now.state.tables if t.rid == "b")
    index = next(i for i, b in enumerate(blocks) if b.block_id == t.table[-1])
    stale = replace(blocks[index], value=StateValue(blocks[index].block_id, 5, blocks[index].value.digest))
    seeded = replace(now, state=replace(now.state, blocks=tuple(blocks[:index] + [stale] + blocks[index + 1:])))
    messages = [v.message for v in block_state_violations(seeded)]
    assert any("running state" in m for m in messages) and any("cached as the state" in m for m in messages)


def test_state_12_a_hit_that_no_cached_state_ends(hit):
    before, now = hit
    step = Step("admit", "b")
    assert not state_hit_violations(before, step, now)
    uncached = replace(now, state=replace(now.state, blocks=tuple(
        replace(b, key=None, key_length=None, promised=None) for b in now.state.blocks)))
    assert any(v.clause == "STATE-12" for v in state_hit_violations(before, step, uncached))
    wrong_length = replace(now, state=replace(now.state, blocks=tuple(
        replace(b, key_length=b.key_length and b.key_length - 1) for b in now.state.blocks)))
    assert any("cached for 5" in v.message for v in state_hit_violations(before, step, wrong_length))


def test_state_13_a_state_block_counted_wrong_free_while_held_or_cached_for_another_group(hit):
    _, now = hit
    assert not state_reference_violations(now)
    held = next(b for b in now.state.blocks if b.ref_cnt)
    for fault in (dict(ref_cnt=held.ref_cnt + 1), dict(key=(1, 0))):
        blocks = tuple(replace(b, **fault) if b is held else b for b in now.state.blocks)
        assert any(v.clause == "STATE-13" for v in state_reference_violations(
            replace(now, state=replace(now.state, blocks=blocks))))
    free = replace(now, state=replace(now.state, free_blocks=now.state.free_blocks + (held.block_id,)))
    assert any("free queue" in v.message for v in state_reference_violations(free))
    unreplayed = replace(now, state=replace(now.state, replayed_map=()))
    assert any("KV events" in v.message for v in state_reference_violations(unreplayed))


def test_state_14_more_state_blocks_than_the_engine_budgets(hit):
    _, now = hit
    assert now.state.blocks_per_request == 2
    t = next(t for t in now.state.tables if t.rid == "b")
    others = [b.block_id for b in now.state.blocks if b.block_id not in t.table][:2]
    seeded = replace(t, table=tuple(others) + t.table[len(others):])
    assert any(v.clause == "STATE-14" for v in state_sizing_violations(
        replace(now, state=replace(now.state, tables=(seeded,)))))


def machine_for(adapter, run: Run):
    policy = Policy(adapter.policy_version, decode_eviction_interval=run.interval)
    machine = engine_machine(adapter.make_engine, run.page_size, run.window, policy, adapter.capabilities,
                             adapter.observables, model=adapter.model, state_grid=run.state_grid)
    machine.reset_counters()
    return seed(SEED)(machine)


@pytest.mark.parametrize("adapter", [VLLM, VLLM_DENSE], ids=["vllm", "vllm-dense"])
@pytest.mark.parametrize("config", STATE_CONFIGS, ids=lambda c: "P={} W={} I={} G={}".format(*c))
def test_the_state_runs_pass_on_vllm(adapter, config):
    run_state_machine_as_test(machine_for(load_adapter(adapter.name), Run(*config)), settings=SETTINGS)


@pytest.mark.parametrize("slug", sorted(STATE_MUTANTS))
def test_each_state_mutant_is_caught_by_its_class(slug):
    """[STATE-11, STATE-13] Each state mutant's `exposed_by` run stops at an invariant
    violation of its class."""
    mutant = STATE_MUTANTS[slug]
    adapter = load_adapter(mutant.name)
    with pytest.raises(Exception) as caught:
        run_state_machine_as_test(machine_for(adapter, mutant.exposed_by), settings=SETTINGS)
    violations = [e for e in [caught.value, *getattr(caught.value, "exceptions", ())]
                  if isinstance(e, InvariantViolation)]
    assert violations, caught.value
    class_of = {check.clause: check.invariant_class for check in INVARIANTS}
    assert any(class_of[clause] == mutant.invariant_class for e in violations for clause in e.clauses), violations
