"""[BLOCK-11] Group layouts: a shared block pool of any layout of attention groups (full
attention only, a window only, several groups of one kind), in the spec, the reference,
the engine machine that draws them, traces, and real vLLM (the pinned release, and the
members of the vllm@ family CI installs).

The seeded bugs that only a layout shows are in the zoo (adapters/mutants/block_pool.py:
layout-ignored, first-window-group-only; tests/test_mutants.py catches each)."""

import importlib.util
import json
import os

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.harness.declarations import Capability
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.engine_machine import LAYOUTS, engine_machine
from kvspec.conformance.harness.needs import derived_needs
from kvspec.conformance.harness.trace import TraceError, TraceStep, engine_config_json, parse
from kvspec.reference.block_pool_engine import BlockPoolEngine
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.block_pool import NULL_BLOCK
from kvspec.spec.group_layouts import kind_cached, layout_hit_blocks, layout_problems
from kvspec.spec.models import BLOCK_POOL, model_for
from kvspec.spec.outcomes import InvalidConfig
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import FULL, SGLANG_0_5_23, SWA, VLLM_0_33, VLLM_0_33_DENSE, Policy

PROMPT = [1, 2, 3, 1] * 4
"""Four whole blocks at page size 4."""


def config(layout, version=VLLM_0_33_DENSE) -> EngineConfig:
    return EngineConfig(4, 4, 64, 64, 4, Policy(version, 4), layout=layout)


# -- the spec's definitions ------------------------------------------------------------------


def test_a_layout_names_one_to_four_groups_of_the_two_kinds():
    assert layout_problems((FULL,)) == [] and layout_problems((SWA, SWA, FULL, FULL)) == []
    for bad in ((), ("mamba",), (FULL,) * 5):
        assert "layout must name 1 to 4 attention groups" in layout_problems(bad)[0]


def test_a_hit_adopts_a_block_in_every_group_of_a_kind_or_in_none():
    """[BLOCK-9, BLOCK-11] A kind caches a block only where every group of it does; a
    kind the layout lacks constrains nothing."""
    cached = [[True] * 4, [True, True, True, True], [True, True, False, True]]
    assert kind_cached((FULL, SWA, SWA), cached, SWA, 4) == [True, True, False, True]
    assert kind_cached((FULL, SWA, SWA), cached, FULL, 4) == [True] * 4
    assert kind_cached((FULL,), cached[:1], SWA, 4) == [True] * 4
    # a window of one block: the hit ends after the last block every SWA group caches
    assert layout_hit_blocks((FULL, SWA, SWA), cached, 1, 4) == 4
    assert layout_hit_blocks((FULL, SWA, SWA), cached, 2, 4) == 2  # blocks 2-3 are not both cached
    assert layout_hit_blocks((FULL, SWA), cached[:2], 2, 4) == 4
    # full attention only: its leading run; a window only: its last run of `run` blocks
    assert layout_hit_blocks((FULL,), [[True, True, False, True]], 2, 4) == 2
    assert layout_hit_blocks((SWA,), [[False, True, True, False]], 2, 4) == 3


# -- the reference --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_reference_keeps_every_layout_and_conforms(layout):
    engine = BlockPoolEngine(config(layout))
    engine.admit("a", PROMPT)
    engine.prefill_chunk("a", 16, 1)
    for _ in range(6):
        engine.decode("a", 2)
    snapshot = engine.check_invariants()
    view = snapshot.block_pool
    assert view.groups == layout and len(view.requests[0].tables) == len(layout)
    for kind, table in zip(layout, view.requests[0].tables):
        assert (NULL_BLOCK in table) == (kind == SWA), "only sliding-window tables release what left the window"
    engine.finish("a")
    engine.admit("b", [*PROMPT, 3])
    assert engine.snapshot().requests[0].kv_committed_len == 16
    engine.check_invariants(snapshot)


def test_a_hit_stops_where_one_window_group_lost_its_key():
    """[BLOCK-11] Two sliding-window groups: an eviction of one block's worth of SWA keys
    drops one group's key of the prompt's last window block, and a hit may no longer end
    there, though the other group still caches it."""
    hits = []
    for evicted in (0, 4):
        engine = BlockPoolEngine(config((FULL, SWA, SWA)))
        engine.admit("a", [*PROMPT, 1])
        engine.prefill_chunk("a", 17, 1)
        engine.finish("a")
        assert engine.evict(0, evicted) == (0, evicted)
        engine.admit("b", [*PROMPT, 1])
        engine.check_invariants()
        hits.append(engine.snapshot().requests[0].kv_committed_len)
    assert hits[0] == 16 and hits[1] < 16


def test_the_two_pool_model_has_one_layout():
    with pytest.raises(InvalidConfig, match="a layout of other groups"):
        TwoPoolEngine(EngineConfig(4, 4, 64, 64, 4, Policy(SGLANG_0_5_23, 4), layout=(FULL,)))
    with pytest.raises(InvalidConfig, match="layout must name"):
        BlockPoolEngine(config(("mamba",)))


# -- the runs and traces ---------------------------------------------------------------------


def test_the_block_pool_runs_draw_every_layout_with_the_capability_and_none_without():
    """The engine machine draws the layout like any other configuration, only for a
    block-pool adapter that declares group_layouts."""
    for capabilities, expected in (({Capability.CHUNKED_PREFILL, Capability.GROUP_LAYOUTS}, set(LAYOUTS)),
                                   ({Capability.CHUNKED_PREFILL}, {LAYOUTS[0]})):
        drawn = set()

        def make_engine(engine_config):
            drawn.add(engine_config.layout)
            return BlockPoolEngine(engine_config)

        machine = engine_machine(make_engine, 4, 6, Policy(VLLM_0_33, 4), capabilities,
                                 BLOCK_POOL.observables, model=BLOCK_POOL)
        run_state_machine_as_test(seed(0)(machine), settings=settings(max_examples=100, database=None, deadline=None,
                                                             suppress_health_check=list(HealthCheck)))
        assert drawn == expected


def trace_text(layout, version=VLLM_0_33) -> str:
    fields = engine_config_json(EngineConfig(4, 4, 64, 64, 4, Policy(version, 4), layout=layout))
    header = {"kvspec_trace": 1, "kvspec_version": "0.1.0", "tier": "engine", "config": fields,
              "adapter": "reference"}
    step = {"op": "admit", "args": {"rid": "r1", "prompt": [1, 2, 3]}}
    return json.dumps(header) + "\n" + json.dumps(step) + "\n"


def test_a_trace_writes_a_layout_only_where_it_is_not_the_default_and_needs_the_capability():
    assert "layout" not in json.loads(trace_text((FULL, SWA)).splitlines()[0])["config"]
    trace = parse(trace_text((SWA, SWA)))
    assert trace.engine_config().layout == (SWA, SWA)
    assert Capability.GROUP_LAYOUTS in derived_needs(trace)
    assert Capability.GROUP_LAYOUTS not in derived_needs(parse(trace_text((FULL, SWA))))


def test_a_trace_with_a_layout_of_the_two_pool_model_or_of_unknown_groups_is_refused():
    with pytest.raises(TraceError, match="is a shared block pool's"):
        parse(trace_text((FULL,), SGLANG_0_5_23))
    bad = trace_text((FULL,)).replace('"layout": ["full"]', '"layout": ["mamba"]')
    with pytest.raises(TraceError, match="layout"):
        parse(bad)


# -- real vLLM --------------------------------------------------------------------------------


needs_vllm = pytest.mark.skipif(os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt")


@needs_vllm
@pytest.mark.parametrize("layout", LAYOUTS)
def test_vllm_builds_every_layout_and_steps_as_the_reference_does(layout):
    """[OBS-3, BLOCK-11] vLLM 0.33.0 built with each layout: one manager group per
    attention group, and every step agrees with the reference on what the spec fixes."""
    from kvspec.adapters.vllm.engine import VllmEngine

    engine_config = config(layout, VLLM_0_33)
    model = model_for(BLOCK_POOL, engine_config)
    vllm, reference = (EngineDriver(VllmEngine(engine_config, retention=0), model, frozenset(BLOCK_POOL.observables)),
                       EngineDriver(BlockPoolEngine(engine_config), model, frozenset(BLOCK_POOL.observables)))
    steps = [("admit", {"rid": "a", "prompt": [*PROMPT, 1]}), ("prefill_chunk", {"rid": "a", "chunk": 9, "token": 2}),
             ("prefill_chunk", {"rid": "a", "chunk": 9, "token": 2}), ("decode", {"rid": "a", "token": 3}),
             ("finish", {"rid": "a", "trim": 0}), ("admit", {"rid": "b", "prompt": [*PROMPT, 1]}),
             ("prefill_chunk", {"rid": "b", "chunk": 4, "token": 2}), ("evict", {"full_tokens": 8, "swa_tokens": 8}),
             ("abort", {"rid": "b"})]
    for op, args in steps:
        observed = [driver.apply(TraceStep(op, args)) for driver in (vllm, reference)]
        assert observed[0] == observed[1], f"{op}{args}"
    assert vllm.previous.block_pool.groups == layout
