"""The reference scheduler's recurrent-state group (reference/scheduler_state.py, SCHED-9):
on a scripted case a row reads the empty state, its own state in place, its checkpoint
and a hit's copy of it, each the state of exactly the tokens before it; the
scheduler+state runs pass on the reference; and the seeded bug that shares a hit's
checkpoint instead of copying it is caught by SCHED-9."""

from pathlib import Path

import pytest

from kvspec.adapters.mutants import MUTANTS
from kvspec.adapters.reference import ADAPTER
from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.scheduler_driver import SchedulerDriver
from kvspec.conformance.harness.trace import TraceStep
from kvspec.conformance.runs.plan import plan
from kvspec.conformance.runs.runner import Job, check_job
from kvspec.reference.scheduler import ReferenceScheduler
from kvspec.spec.block_pool import FULL, NULL_BLOCK, SWA, PartialBlocks
from kvspec.spec.scheduler import STATE, SchedulerConfig
from kvspec.spec.state import state_digest

CONFIG = SchedulerConfig(page_size=4, window=7, pages=40, groups=(FULL, SWA, STATE), max_batch_size=2,
                         max_scheduled_tokens=16)
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
"""Its checkpoint is the state of its first 8 tokens: its last whole block short of its last token."""
STATE_GROUP = CONFIG.groups.index(STATE)


def driver(scheduler_class=ReferenceScheduler, config: SchedulerConfig = CONFIG) -> SchedulerDriver:
    """Every plan, result and end checked: SCHED-2 .. SCHED-9, and chapter 08's checks on the
    attention groups' snapshot, as `kvspec check` drives the reference."""
    reference = load_adapter(ADAPTER.name)
    return SchedulerDriver(scheduler_class(config), config, reference.model, reference.observables)


def submit(d: SchedulerDriver, rid: str, prompt: list[int], outputs: int) -> None:
    d.apply(TraceStep("submit", {"rid": rid, "prompt": prompt, "max_new_tokens": outputs, "outputs": [0] * outputs}))


def test_sched_9_a_row_reads_the_state_of_the_tokens_before_it():
    """[SCHED-9] `a` (10 tokens) is prefilled in two rows, cut at its checkpoint (8): the
    first writes a fresh page from the empty state, the second reads that page and moves
    on to a fresh one, and the page read stays cached as the state of 8 tokens. `b`, the
    same first 9 tokens and another, hits 8 tokens: its first row reads `a`'s checkpoint
    and writes a copy of its own; every later row advances its own page in place."""
    d = driver()
    submit(d, "a", PROMPT, 3)
    (first,) = d.plan_once().rows
    running = first.tables[STATE_GROUP][1]
    assert (first.start, first.tokens, first.tables[STATE_GROUP]) == (0, 8, (NULL_BLOCK, running))
    assert first.state_read == state_digest(())
    (second,) = d.plan_once().rows
    checkpoint, running = running, second.tables[STATE_GROUP][1]
    assert (second.start, second.tokens, second.tables[STATE_GROUP]) == (8, 2, (checkpoint, running))
    assert second.state_read == state_digest(PROMPT[:8])
    scheduler = d.scheduler
    assert scheduler.state.table("a") == (NULL_BLOCK, running)  # the page read is given back, cached
    assert scheduler.engine.pool.key_of(checkpoint) == (scheduler.engine.requests["a"].hashes[1], STATE_GROUP)
    (decode,) = d.plan_once().rows
    assert (decode.start, decode.tables[STATE_GROUP]) == (10, (NULL_BLOCK, running))
    assert decode.state_read == state_digest(PROMPT)

    submit(d, "b", [*PROMPT[:9], 20], 2)
    rows = {row.rid: row for row in d.plan_once().rows}
    hit = rows["b"]
    assert (hit.start, hit.tables[STATE_GROUP][0]) == (8, checkpoint)
    assert hit.tables[STATE_GROUP][1] not in (NULL_BLOCK, checkpoint, running)  # a copy: a page of its own
    assert hit.state_read == state_digest(PROMPT[:8])
    d.drain()  # every row after it is checked the same way, and every page comes back
    assert d.scheduler.snapshot().pool.held == 0


def test_the_memory_snapshot_hides_the_state_group_from_chapter_08():
    """[SCHED-5, SCHED-9] The pool counts the state pages as held (one pool); chapter 08's
    snapshot of the attention groups is a partial view without them (OBS-4), so BLOCK-2's
    reference counts read only the attention tables."""
    d = driver()
    submit(d, "a", PROMPT, 3)
    d.plan_once()
    d.plan_once()
    view = d.scheduler.snapshot()
    state_pages = {page for _, tables in view.tables for page in tables[STATE_GROUP] if page != NULL_BLOCK}
    attention = {page for _, tables in view.tables for table in tables[:STATE_GROUP] for page in table
                 if page != NULL_BLOCK}
    assert view.pool.held == len(attention) + len(state_pages)
    blocks = view.memory.block_pool.blocks
    assert isinstance(blocks, PartialBlocks) and not state_pages & set(blocks)


def test_without_a_state_group_nothing_changes_and_a_wrong_group_is_refused():
    """[SCHED-1] The reference scheduler's groups: full and sliding window, and a state
    group after them; anything else is refused, saying what it builds."""
    plain = ReferenceScheduler(SchedulerConfig(4, 7, 40))
    assert plain.state is None
    plain.submit("a", PROMPT, 2)
    assert all(len(row.tables) == 2 and row.state_read is None for row in plain.plan().rows)
    with pytest.raises(ValueError, match="a 'state' group after them"):
        ReferenceScheduler(SchedulerConfig(4, 7, 40, groups=(FULL, STATE, SWA)))


def test_sched_9_the_reference_runs_its_state_runs(tmp_path):
    """[SCHED-9] The reference declares state_group: its scheduler+state runs are made, not
    skipped, and one passes at the quick profile with every state check counted."""
    reference = load_adapter("reference")
    planned = plan(reference)
    assert "state_group" in reference.capabilities and "state_group" not in [s.what for s in planned.skipped]
    assert {"scheduler+state P=1 W=3", "scheduler+state P=4 W=7"} <= set(planned.labels)
    result = check_job(Job("reference", planned.named("scheduler+state P=4 W=7"), "quick", 0, str(tmp_path)))
    assert result.verdict == "ok", result.message
    assert result.tallies["state"].checked > 0 and result.tallies["state"].violated == 0


def test_sched_9_a_hit_that_shares_its_checkpoint_is_caught():
    """[SCHED-9] The seeded bug `scheduler-hit-shares-state`: two requests that hit `a`'s
    checkpoint in one plan both run on its page, so each writes a state the other's table
    holds; SCHED-9 says so at that plan. The reference copies, and passes the same steps.
    (Their prompts are longer than `a`'s: a request whose own checkpoint is where its hit
    ends moves to a fresh page there anyway, and the bug does not show.)"""
    mutant = MUTANTS["scheduler-hit-shares-state"]
    assert (mutant.clause, mutant.exposed_by.label) == ("SCHED-9", "scheduler+state P=4 W=7")

    def steps(d: SchedulerDriver) -> None:
        submit(d, "a", PROMPT, 1)
        d.drain()
        submit(d, "b", [*PROMPT[:9], 20, 21, 22, 23, 24], 2)
        submit(d, "c", [*PROMPT[:9], 25, 26, 27, 28, 29], 2)
        d.plan_once()
        d.drain()

    steps(driver())
    with pytest.raises(InvariantViolation, match=r"\[SCHED-9\] request b: the row writes its state to page \d+, "
                                                 r"which \['c'\] hold too"):
        steps(driver(mutant.make_scheduler))


def test_the_state_vectors_need_state_group_and_replay_on_the_reference():
    """[SCHED-9] vectors/ holds the reference's random arrivals with a state group, one set
    per scheduler+state run's configuration: the reference replays them, every plan
    checked, and an adapter without state_group has them skipped, not failed."""
    from dataclasses import replace

    from kvspec.conformance.harness.declarations import SCHEDULER_STATE_CONFIGS
    from kvspec.conformance.harness.replay import replay, unmet_requirements
    from kvspec.conformance.harness.trace import load

    reference = load_adapter(ADAPTER.name)
    without = replace(reference, capabilities=reference.capabilities - {"state_group"})
    vectors = Path(__file__).parent.parent / "vectors" / "conformance" / "scheduler"
    for page_size, window in SCHEDULER_STATE_CONFIGS:
        trace = load(vectors / f"scheduler-state-P{page_size}-W{window}-1.jsonl")
        assert STATE in trace.config["groups"]
        assert unmet_requirements(trace, reference) == []
        assert "capability state_group" in unmet_requirements(trace, without)
        assert replay(trace, reference).conforms
