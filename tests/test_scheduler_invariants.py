"""The checks of the scheduler tier (spec chapter 10, SCHED-1 .. SCHED-8) on hand-built
snapshots: each conforming case passes, and each seeded bug is caught by its clause and
by no other."""

import pytest

from kvspec.spec.registry import violations
from kvspec.spec.scheduler import (
    PagePool,
    Plan,
    Preempted,
    Preemption,
    Row,
    ScheduledRequest,
    SchedulerConfig,
    SchedulerSnapshot,
    SchedulerView,
    Status,
    after_plan,
    after_preemption,
    after_result,
    covered_blocks,
    drain_bound,
    empty_plan_violations,
    freed_by,
    page_accounting_violations,
    plan_violations,
    preemption_violations,
    row_coverage_violations,
    row_release_violations,
    samples,
    validate_scheduler_config,
)

CONFIG = SchedulerConfig(page_size=4, window=7, pages=24, max_batch_size=2, max_scheduled_tokens=8)
A_TABLES = ((1, 2, 3, 4), (5, 6, 7))
"""A request of 8 prompt tokens, limit 8, after its first chunk (the worked example)."""


def request(rid="a", prompt_len=8, max_new_tokens=8, outputs=0, computed=0, status=Status.WAITING):
    return ScheduledRequest(rid, prompt_len, max_new_tokens, outputs, computed, status)


def snapshot(requests=(), tables=(), free=24, held=0, plan=None):
    return SchedulerSnapshot(CONFIG, tuple(requests), SchedulerView(PagePool(24, free, held), tuple(tables)), plan)


def clauses(found) -> set[str]:
    return {violation.clause for violation in found}


def test_sched_1_a_configuration_is_validated_and_the_ledger_moves_with_plans_and_results():
    """[SCHED-1]"""
    assert validate_scheduler_config(CONFIG) == []
    assert validate_scheduler_config(SchedulerConfig(0, 7, 24)) and validate_scheduler_config(
        SchedulerConfig(4, 7, 24, groups=("swa",))) and validate_scheduler_config(SchedulerConfig(4, 7, 24, groups=()))
    waiting = request()
    row = Row("a", 0, 8, A_TABLES)
    (running,) = after_plan((waiting,), Plan((row,)))
    assert running.status is Status.RUNNING and samples(running, row)
    done = after_result(running, row)
    assert (done.computed, done.outputs, done.known) == (8, 1, 9)
    assert after_plan((done,), Plan(preempted=(Preemption("a", Preempted.ABORT),))) == ()
    assert after_preemption(done, Preempted.RETRACT).computed == 8
    assert after_preemption(done, Preempted.RECOMPUTE) == request(outputs=1, computed=0)


@pytest.mark.parametrize("row, why", [
    (Row("a", 12, 4, A_TABLES), "starts at 12"),                     # skips tokens
    (Row("a", 4, 4, A_TABLES), "starts at 4"),                       # computes tokens again
    (Row("a", 8, 9, A_TABLES), "16 are known"),                      # a token not yet known
    (Row("nobody", 0, 1, A_TABLES), "not submitted"),
])
def test_sched_2_a_row_continues_where_the_ledger_says(row, why):
    """[SCHED-2] A request of a 16-token prompt, its first chunk of 8 computed."""
    ledger = [request(prompt_len=16, computed=8, status=Status.RUNNING)]
    before = snapshot(ledger, [("a", A_TABLES)], 17, 7)
    good = Plan((Row("a", 8, 8, A_TABLES),))
    assert plan_violations(before, None, snapshot(ledger, [("a", A_TABLES)], 17, 7, good)) == []
    found = plan_violations(before, None, snapshot(ledger, [("a", A_TABLES)], 17, 7, Plan((row,))))
    assert clauses(found) == {"SCHED-2"} and why in str(found[0]), found


def test_sched_2_a_waiting_request_may_start_at_a_hit_and_the_budget_holds():
    """[SCHED-2]"""
    before = snapshot([request("a"), request("b", prompt_len=11)])
    hit = Plan((Row("b", 8, 3, ((1, 2, 8, 9), (5, 6, 10, 11))),))
    assert plan_violations(before, None, snapshot(before.requests, plan=hit)) == []
    past_the_prompt = Plan((Row("b", 11, 1, ((1, 2, 8, 9), (5, 6, 10, 11))),))
    assert clauses(plan_violations(before, None, snapshot(before.requests, plan=past_the_prompt))) == {"SCHED-2"}
    twice = Plan((Row("a", 0, 4, A_TABLES), Row("a", 4, 4, A_TABLES)))
    assert "2 times" in str(plan_violations(before, None, snapshot(before.requests, plan=twice)))
    over_budget = Plan((Row("a", 0, 8, A_TABLES), Row("b", 0, 4, ((9,), (10,)))))
    assert "max_scheduled_tokens" in str(plan_violations(before, None, snapshot(before.requests, plan=over_budget)))


def test_sched_3_every_token_a_row_computes_or_reads_has_a_real_page():
    """[SCHED-3] Position 11 reads from 4 on: swa entries 1 and 2 must be real, entry 0 need not."""
    assert list(covered_blocks(Row("a", 11, 1, A_TABLES), "swa", 7, 4)) == [1, 2]
    assert list(covered_blocks(Row("a", 11, 1, A_TABLES), "full", 7, 4)) == [0, 1, 2]
    good = snapshot(plan=Plan((Row("a", 11, 1, ((1, 2, 3, 4), (0, 6, 7))),)))
    assert row_coverage_violations(good) == []
    released_too_soon = snapshot(plan=Plan((Row("a", 11, 1, ((1, 2, 3, 4), (0, 0, 7))),)))
    too_short = snapshot(plan=Plan((Row("a", 11, 1, ((1, 2), (0, 6, 7))),)))
    null_in_full = snapshot(plan=Plan((Row("a", 11, 1, ((1, 0, 3, 4), (0, 6, 7))),)))
    for bug in (released_too_soon, too_short, null_in_full):
        assert clauses(row_coverage_violations(bug)) == {"SCHED-3"}


def test_sched_4_what_the_window_no_longer_reads_is_released_unless_shared():
    """[SCHED-4] At start 11 the first swa entry is due."""
    ledger = [request(outputs=4, computed=11, status=Status.RUNNING)]
    row = Row("a", 11, 1, ((1, 2, 3, 4), (5, 6, 7)))
    alone = snapshot(ledger, [("a", row.tables)], 17, 7, Plan((row,)))
    assert "neither released nor shared" in str(row_release_violations(alone, None, alone))
    shared_before = snapshot(ledger, [("a", row.tables), ("b", ((1, 2, 8, 9), (5, 6, 10, 11)))], 13, 11)
    after = snapshot(ledger, [("a", row.tables), ("b", ((1, 2, 12, 9), (0, 6, 13, 11)))], 13, 11, Plan((row,)))
    assert row_release_violations(shared_before, None, after) == []  # the worked example's deferral
    released = Row("a", 11, 1, ((1, 2, 3, 4), (0, 6, 7)))
    assert row_release_violations(alone, None, snapshot(ledger, [("a", released.tables)], 18, 6,
                                                        Plan((released,)))) == []
    past_the_limit = Row("a", 11, 1, ((1, 2, 3, 4, 8), (0, 6, 7)))  # 8 + 8 tokens: 4 pages at most
    found = row_release_violations(alone, None, snapshot(ledger, [("a", past_the_limit.tables)], 17, 7,
                                                         Plan((past_the_limit,))))
    assert clauses(found) == {"SCHED-4"} and "token limit" in str(found[0])


@pytest.mark.parametrize("tables, free, held, why", [
    ([("a", A_TABLES)], 18, 7, "18 free + 7 held"),
    ([("a", ((1, 2, 3, 4), (5, 6, 6)))], 17, 7, "more than once"),
    ([("a", ((1, 2, 3, 4), (4, 6, 7)))], 17, 7, "groups [0, 1]"),
    ([("a", ((1, 2, 3, 4), (5, 6, 25)))], 17, 7, "not real pages"),
    ([("a", A_TABLES)], 18, 6, "the pool counts 6 held"),
])
def test_sched_5_one_pool_counted(tables, free, held, why):
    """[SCHED-5]"""
    assert page_accounting_violations(snapshot([], [("a", A_TABLES)], 17, 7)) == []
    found = page_accounting_violations(snapshot([], tables, free, held))
    assert clauses(found) == {"SCHED-5"} and why in str(found), found


def test_sched_6_only_a_running_request_holds_pages():
    """[SCHED-6]"""
    from kvspec.spec.scheduler import ended_request_violations

    running = [request(outputs=1, computed=8, status=Status.RUNNING)]
    assert ended_request_violations(snapshot(running, [("a", A_TABLES)], 17, 7)) == []
    assert ended_request_violations(snapshot([], [], 24, 0)) == []
    ended_with_a_table = ended_request_violations(snapshot([], [("a", A_TABLES)], 17, 7))
    leaked = ended_request_violations(snapshot([], [], 23, 1))
    retracted = ended_request_violations(snapshot([request(computed=8, status=Status.RETRACTED)],
                                                  [("a", A_TABLES)], 17, 7))
    for found in (ended_with_a_table, leaked, retracted):
        assert clauses(found) == {"SCHED-6"}
    assert "leak" in str(leaked[0])


def test_sched_7_a_preemption_must_free_pages_the_rows_need():
    """[SCHED-7] `b` holds 4 pages of its own and 4 shared with `a`."""
    b_tables = ((1, 2, 8, 9), (5, 6, 10, 11))
    tables = {"a": A_TABLES, "b": b_tables}
    assert freed_by("b", {"b"}, tables, tables) == 4
    assert freed_by("a", {"a", "b"}, tables, {}) == 7  # shared with another victim: freed too
    # `a` released page 5, which `b` shares, in the same plan: preempting `b` gives it back too
    assert freed_by("b", {"b"}, tables, {"a": ((1, 2, 3, 4), (0, 6, 7))}) == 5
    ledger = [request(outputs=1, computed=8, status=Status.RUNNING),
              request("b", 11, 2, 1, 11, Status.RUNNING)]
    before = snapshot(ledger, [("a", A_TABLES), ("b", b_tables)], 13, 11)
    needed = Plan((Row("a", 8, 1, A_TABLES),), (Preemption("b", Preempted.RECOMPUTE),))
    assert preemption_violations(before, None, snapshot(ledger, [("a", A_TABLES)], 3, 21, needed)) == []
    assert "did not need" in str(preemption_violations(before, None, snapshot(ledger, [("a", A_TABLES)], 17, 7,
                                                                              needed)))
    # two victims where one was needed: the other's pages are still free after the plan
    c_tables = ((12, 13), (14,))
    ledger3 = [*ledger, request("c", 4, 2, 1, 4, Status.RUNNING)]
    before3 = snapshot(ledger3, [("a", A_TABLES), ("b", b_tables), ("c", c_tables)], 10, 14)
    both = Plan((Row("a", 8, 1, A_TABLES),), (Preemption("b", Preempted.RECOMPUTE), Preemption("c", Preempted.RECOMPUTE)))
    found = preemption_violations(before3, None, snapshot(ledger3, [("a", A_TABLES)], 3, 21, both))
    assert [v.message.split(",")[0] for v in found] == ["the plan preempts c"]


def test_sched_8_an_empty_plan_while_every_page_is_free_starves_the_waiting():
    """[SCHED-8]"""
    waiting = [request()]
    assert clauses(empty_plan_violations(snapshot(waiting, [], 24, 0, Plan()))) == {"SCHED-8"}
    assert empty_plan_violations(snapshot(waiting, [("b", A_TABLES)], 17, 7, Plan())) == []  # the pool is busy
    assert empty_plan_violations(snapshot(waiting, [], 24, 0, None)) == []  # no plan was made
    assert drain_bound(waiting, [8], 8) == 4 * (8 + 8) + 16


def test_every_check_of_the_tier_is_registered_under_its_clause():
    """[SCHED-2 .. SCHED-9] The registry runs them on every scheduler snapshot."""
    from kvspec.spec.invariants import applicable

    registered = {check.clause for check in applicable(SchedulerSnapshot)}
    assert registered == {f"SCHED-{n}" for n in range(2, 10)}
    assert violations(applicable(SchedulerSnapshot), snapshot()) == []


def test_sched_9_a_row_reads_the_state_of_the_tokens_before_it_and_writes_its_own():
    """[SCHED-9] Groups full, sliding window and state; `a` has computed its 8-token prompt."""
    from kvspec.spec.scheduler import STATE, row_state_violations
    from kvspec.spec.state import state_digest

    config = SchedulerConfig(4, 7, 24, groups=("full", "swa", STATE), max_batch_size=2, max_scheduled_tokens=8)
    prompt = tuple(range(1, 9))
    ledger = [ScheduledRequest("a", 8, 8, 1, 8, Status.RUNNING, (*prompt, 50))]
    tables = ((1, 2, 3), (4, 5, 6), (7, 8))

    def plan_snapshot(read, state_table=(7, 8), others=()):
        row = Row("a", 8, 1, (*tables[:2], state_table), read)
        return SchedulerSnapshot(config, tuple(ledger), SchedulerView(PagePool(24, 16, 8), (("a", row.tables),
                                                                                             *others)), Plan((row,)))

    before = SchedulerSnapshot(config, tuple(ledger), SchedulerView(PagePool(24, 16, 8), (("a", tables),)))
    right = plan_snapshot(state_digest(prompt))
    assert row_state_violations(before, None, right) == []
    stale = row_state_violations(before, None, plan_snapshot(state_digest(prompt[:4])))  # a checkpoint of 4 tokens
    empty = row_state_violations(before, None, plan_snapshot(state_digest(())))  # the zero state, never advanced
    shared = row_state_violations(before, None, plan_snapshot(state_digest(prompt),
                                                              others=(("b", ((9,), (10,), (0, 8))),)))
    for found in (stale, empty, shared):
        assert clauses(found) == {"SCHED-9"}, found
    assert "which ['b'] hold too" in str(shared[0])
