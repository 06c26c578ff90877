"""vLLM 0.33.0's own v1 Scheduler at the scheduler tier (adapters/vllm/scheduler.py): a
check passes; the plans carry what vLLM did (a prefix hit, a chunked prompt, a
preemption by recompute and the request computed again); requests end as vLLM ends
them; and the memory of its KV cache manager is checked too (chapter 08): a bug seeded
into vLLM is caught at this tier by the clause it breaks.

Needs vLLM installed (adapters/vllm/requirements.txt); KVSPEC_REQUIRE_VLLM=1 turns a
missing vLLM into a failure instead of a skip."""

import importlib.util
import os
from collections import Counter

import pytest

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.patching import Patched
from kvspec.adapters.vllm import mutants
from kvspec.adapters.vllm.scheduler import VllmScheduler
from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.scheduler_driver import SchedulerDriver
from kvspec.conformance.harness.trace import TraceStep
from kvspec.conformance.runs.plan import plan
from kvspec.conformance.runs.runner import Job, check_job
from kvspec.spec.block_pool import NULL_BLOCK, BlockPoolSnapshot
from kvspec.spec.scheduler import Plan, Preempted, Preemption, SchedulerConfig


def driver(config: SchedulerConfig, adapter: str = "vllm-scheduler", scheduler=None) -> SchedulerDriver:
    loaded = load_adapter(adapter)
    return SchedulerDriver(scheduler or loaded.make_scheduler(config), config, loaded.model, loaded.observables)


def submit(d: SchedulerDriver, rid: str, prompt: list[int], outputs: int, limit: int | None = None) -> None:
    d.apply(TraceStep("submit", {"rid": rid, "prompt": prompt, "max_new_tokens": limit or outputs,
                                 "outputs": [0] * outputs}))


def rows(plan: Plan) -> list[tuple[str, int, int]]:
    return [(row.rid, row.start, row.tokens) for row in plan.rows]


def vllm_of(d: SchedulerDriver):
    """vLLM's own Scheduler behind the driver."""
    return d.scheduler.scheduler


@pytest.mark.parametrize("adapter", ["vllm-scheduler", "vllm-scheduler-dense"])
def test_a_check_passes_with_the_scheduler_and_block_pool_checks(adapter, tmp_path):
    """[SCHED-2 .. SCHED-8, BLOCK-1 .. BLOCK-8] One scheduler run of `kvspec check` at the
    quick profile (in this process: vLLM is imported once for the module), every plan,
    result and end checked, and the memory snapshot by chapter 08's checks: no violation,
    nothing skipped, no check of the two-pool model counted."""
    result = check_job(Job(adapter, plan(load_adapter(adapter)).named("scheduler P=4 W=8"), "quick", 0, str(tmp_path)))
    assert result.verdict == "ok", result.message
    for checked in ("scheduling", "mapping", "window-bound", "window-liveness", "leak", "ownership", "alignment"):
        assert result.tallies[checked].checked > 0 and result.tallies[checked].violated == 0, checked
    assert "locks" not in result.tallies and not result.skipped_because


def test_a_prefix_hit_starts_the_first_row_past_zero():
    """[SCHED-2] A prompt that shares a finished request's first two blocks is admitted at
    vLLM's hit: its first row starts at 8, and its tables share the two full blocks."""
    d = driver(SchedulerConfig(4, 7, 40, max_batch_size=2, max_scheduled_tokens=32))
    stem = [0, 1, 2, 0, 1, 2, 0, 1]
    submit(d, "first", stem + [2, 2, 1], 2)
    first = d.plan_once()
    shared = first.rows[0].tables[0][:2]
    d.drain()
    submit(d, "second", stem + [1, 0, 0, 2], 2)
    (row,) = d.plan_once().rows
    assert (row.rid, row.start, row.tokens) == ("second", 8, 4)
    assert row.tables[0][:2] == shared


def test_a_long_prompt_is_prefilled_in_chunks():
    """[SCHED-2] With 8 tokens a plan, a 20-token prompt is three rows of one request, the
    last one sampling; every row's tables cover what it computes (SCHED-3)."""
    d = driver(SchedulerConfig(4, 7, 40, max_batch_size=2, max_scheduled_tokens=8))
    submit(d, "long", [1] * 20, 2)
    plans = [d.plan_once() for _ in range(4)]
    assert [rows(plan) for plan in plans] == [[("long", 0, 8)], [("long", 8, 8)], [("long", 16, 4)],
                                              [("long", 20, 1)]]
    assert [len(plan.rows[0].tables[0]) for plan in plans] == [2, 4, 5, 6]


def test_page_pressure_preempts_by_recompute_and_the_request_is_computed_again():
    """[SCHED-7] Six pages: a (4 tokens) holds two, b (8 tokens) four. At a's first decode
    it needs two more: vLLM preempts b (the last running request; by recompute: its
    blocks freed, its computed tokens 0), and a takes two of the four. Once a has ended,
    b is admitted again at the hit its first cached block gives it (4 tokens), and
    computes the rest of its prompt and its output in one row."""
    d = driver(SchedulerConfig(4, 7, 6, max_batch_size=2, max_scheduled_tokens=16))
    submit(d, "a", [0] * 4, 3)
    submit(d, "b", [1] * 8, 3)
    assert rows(d.plan_once()) == [("a", 0, 4), ("b", 0, 8)]
    pressed = d.plan_once()
    assert rows(pressed) == [("a", 4, 1)] and pressed.preempted == (Preemption("b", Preempted.RECOMPUTE),)
    assert vllm_of(d).requests["b"].num_preemptions == 1 and d.ledger["b"].computed == 0
    assert d.previous.view.pool.free == 2  # fewer than b gave back: a needed them
    assert [rows(d.plan_once()) for _ in range(3)] == [[("a", 5, 1)], [("b", 4, 5)], [("b", 9, 1)]]
    assert not d.ledger


def test_a_request_at_its_limit_is_ended_by_vllm_one_that_stops_sooner_by_finish():
    """The last output at max_new_tokens: vLLM ends the request itself in update_from_output
    (FINISHED_LENGTH_CAPPED) and finish() finds it gone. A stop before the limit: finish()
    ends it with finish_requests(FINISHED_STOPPED). Either way its blocks are free and
    nothing of it is left in vLLM."""
    config = SchedulerConfig(4, 7, 20, max_batch_size=2, max_scheduled_tokens=16)
    scheduler = VllmScheduler(config)
    d = driver(config, scheduler=scheduler)
    submit(d, "limit", [0] * 5, 2)
    submit(d, "stop", [1] * 5, 2, limit=4)
    d.plan_once()
    ended = []
    original = scheduler.finish
    scheduler.finish = lambda rid: (ended.append((rid, dict(scheduler.ended), rid in vllm_of(d).requests)),
                                    original(rid))
    d.plan_once()
    assert ended == [("limit", {"limit": "LENGTH"}, False), ("stop", {}, True)]
    assert not vllm_of(d).requests and not vllm_of(d).running
    assert vllm_of(d).kv_cache_manager.block_pool.get_num_free_blocks() == config.pages


def test_an_abort_mid_prefill_frees_the_request():
    """abort() is vLLM's finish_requests(FINISHED_ABORTED), wherever the request stands."""
    d = driver(SchedulerConfig(4, 7, 20, max_batch_size=2, max_scheduled_tokens=8))
    submit(d, "a", [2] * 20, 3)
    d.plan_once()
    assert d.previous.view.pool.held == 4
    d.apply(TraceStep("abort", {"rid": "a"}))
    assert not vllm_of(d).requests and d.previous.view.pool.held == 0 and not d.previous.view.tables


def test_the_memory_snapshot_is_the_scheduler_managers_own():
    """[OBS-1] The view's memory is chapter 08's snapshot of the scheduler's own KV cache
    manager: the same tables as the view, the same free count, and the KV events vLLM
    publishes (replayed) giving its cache map (BLOCK-8)."""
    d = driver(SchedulerConfig(2, 3, 30, max_batch_size=2, max_scheduled_tokens=6))
    submit(d, "a", [0, 1, 2, 0, 1, 2, 0, 1, 2], 4)
    submit(d, "b", [0, 1, 2, 0, 1, 1], 3)
    for _ in range(3):
        d.plan_once()
    view = d.previous.view
    memory = view.memory
    assert isinstance(memory, BlockPoolSnapshot)
    assert {r.rid: r.tables for r in memory.block_pool.requests} == dict(view.tables)
    assert memory.block_pool.free_count == view.pool.free
    assert any(NULL_BLOCK in table for _, tables in view.tables for table in tables[1:])  # a released window
    cached = Counter((h, g) for h, g, _ in memory.block_pool.cache_map)
    assert cached and sorted(memory.block_pool.replayed_map) == sorted((h, g, n) for (h, g), n in cached.items())


def seeded(mutant, config: SchedulerConfig) -> SchedulerDriver:
    """vLLM's scheduler with one of the vLLM zoo's patches on during every call."""
    return driver(config, scheduler=Patched((mutant.patch,), VllmScheduler, config))


@pytest.mark.parametrize("mutant,clause", [(mutants.HIT_WITHOUT_REFERENCE, "BLOCK-2"),
                                           (mutants.NO_REMOVED_EVENT, "BLOCK-8")])
def test_a_bug_seeded_into_vllms_memory_is_caught_at_this_tier(mutant, clause):
    """[BLOCK-2, BLOCK-8] Bugs no plan shows (a prefix hit that takes no reference; an
    eviction that publishes no removal) are caught through the memory snapshot, by the
    clause each breaks, at the plan where vLLM's scheduler runs into them."""
    d = seeded(mutant, SchedulerConfig(4, 7, 12, max_batch_size=2, max_scheduled_tokens=16))
    stem = [0, 1, 2, 0, 1, 2, 0, 1]
    with pytest.raises(InvariantViolation) as caught:
        submit(d, "a", stem + [2], 1)
        d.drain()
        submit(d, "b", stem + [0], 1)  # a hit on a's cached blocks
        d.drain()
        for rid in "cdefg":  # other prompts, which take the cached blocks from the pool
            submit(d, rid, [ord(rid) % 3 + 3] * 16, 1)
            d.drain()
    assert clause in caught.value.clauses, str(caught.value)


def test_a_bug_in_the_window_release_is_caught_by_the_plan_and_the_memory():
    """[SCHED-4, BLOCK-6] vLLM releasing nothing that left the window: the plan's row keeps
    pages its window no longer reads (SCHED-4), and the manager's table holds more than
    chapter 08 allows (BLOCK-6), both at the first plan past the window."""
    d = seeded(mutants.NO_WINDOW_RELEASE, SchedulerConfig(2, 3, 30, max_batch_size=2, max_scheduled_tokens=4))
    with pytest.raises(InvariantViolation) as caught:
        submit(d, "a", [0] * 12, 1)
        d.drain()
    assert {"SCHED-4", "BLOCK-6"} <= set(caught.value.clauses), str(caught.value)


@pytest.mark.parametrize("groups", [("full",), ("swa", "full"), ("full", "swa", "swa")])
def test_any_groups_the_tier_allows_are_built_in_their_order(groups):
    """[SCHED-1] A configuration of full attention only, or with its groups in another order
    or repeated, is vLLM's KV cache config with those groups in that order: the row's
    tables follow them, and two requests drain with every check passing."""
    d = driver(SchedulerConfig(2, 3, 60, groups=groups, max_batch_size=2, max_scheduled_tokens=8))
    submit(d, "a", [0, 1, 2] * 4, 5)
    submit(d, "b", [0, 1, 2] * 3, 5)
    first = d.plan_once()
    assert [len(table) for table in first.rows[0].tables] == [4] * len(groups)
    d.drain()
    assert d.previous.view.pool.held == 0
