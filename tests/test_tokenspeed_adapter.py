"""TokenSpeed's compiled scheduler (tokenspeed-scheduler 0.1.42) at the scheduler tier
(spec chapter 10): the chapter's worked example as TokenSpeed runs it, the check's runs,
a configuration of the engine that preempts without need caught by SCHED-7 with a trace
that replays, and the driver's answers to what TokenSpeed asks of an executor.

Skipped when the package is not installed (`pip install --no-deps -r
adapters/tokenspeed/requirements.txt`), unless KVSPEC_REQUIRE_TOKENSPEED=1."""

import importlib.util
import os
import subprocess
from functools import partial
from pathlib import Path

import pytest

if (os.environ.get("KVSPEC_REQUIRE_TOKENSPEED") != "1"
        and importlib.util.find_spec("tokenspeed_scheduler") is None):
    pytest.skip("tokenspeed-scheduler is not installed: pip install --no-deps -r adapters/tokenspeed/requirements.txt",
                allow_module_level=True)

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.tokenspeed import TOKENSPEED, make_scheduler
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.scheduler_driver import SchedulerDriver
from kvspec.conformance.harness.trace import Trace, TraceStep, load
from kvspec.conformance.runs.plan import plan
from kvspec.spec.scheduler import SchedulerConfig

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
EXAMPLE = SchedulerConfig(page_size=4, window=7, pages=24, max_batch_size=2, max_scheduled_tokens=8)


class FORCED_RETRACTION(TOKENSPEED):
    """TokenSpeed with its debugging knob `debug_force_retraction_interval = 3`: it retracts
    a running request every third plan, whether pages are short or not."""

    name = "tokenspeed-forced-retraction"
    make_scheduler = staticmethod(partial(make_scheduler, force_retraction_every=3))


def submit(rid, prompt, limit, outputs):
    return TraceStep("submit", {"rid": rid, "prompt": prompt, "max_new_tokens": limit, "outputs": outputs})


STEP = TraceStep("step")


def test_the_worked_example_of_chapter_10_as_tokenspeed_runs_it():
    """[SCHED-2, SCHED-3, SCHED-4] spec/10-scheduler.md, "Worked example": every row and
    every count of its table, and the deferred release of a shared page."""
    driver = SchedulerDriver(make_scheduler(EXAMPLE), EXAMPLE, None, frozenset())
    a = [1, 2, 3, 4, 5, 6, 7, 8]

    def plan():
        rows = tuple((row.rid, row.start, row.tokens, row.tables) for row in driver.plan_once().rows)
        return rows, (driver.previous.view.pool.free, driver.previous.view.pool.held)

    driver.apply(submit("a", a, 8, list(range(9, 17))))
    first = [plan() for _ in range(4)]
    driver.apply(submit("b", a + [20, 21, 22], 2, [30, 31]))
    then = [plan() for _ in range(3)]
    full, swa = (1, 2, 3, 4), (5, 6, 7)
    assert first == [((("a", 0, 8, (full, swa)),), (17, 7)), ((("a", 8, 1, (full, swa)),), (17, 7)),
                     ((("a", 9, 1, (full, swa)),), (17, 7)), ((("a", 10, 1, (full, swa)),), (17, 7))]
    assert then == [
        ((("b", 8, 3, ((1, 2, 8, 9), (5, 6, 10, 11))),), (13, 11)),
        ((("a", 11, 1, (full, swa)), ("b", 11, 1, ((1, 2, 12, 9), (0, 6, 13, 11)))), (17, 7)),
        ((("a", 12, 1, (full, (0, 6, 7, 14))),), (17, 7)),
    ]
    assert [request.rid for request in driver.previous.requests] == ["a"]  # b ended with its second output


@pytest.mark.parametrize("label", ["scheduler P=1 W=3", "scheduler P=4 W=7", "scheduler P=16 W=5",
                                   "scheduler+state P=4 W=7"])
@pytest.mark.parametrize("adapter", ["tokenspeed", "tokenspeed-aborts"])
def test_tokenspeed_passes_the_scheduler_runs(adapter, label):
    """[SCHED-1 .. SCHED-9] every plan, result and end of random arrivals checked."""
    loaded = load_adapter(adapter)
    machine = plan(loaded).named(label).machine(loaded)
    run_state_machine_as_test(machine, settings=settings(max_examples=25, stateful_step_count=25, deadline=None,
                                                         suppress_health_check=list(HealthCheck), database=None))
    assert machine.steps > 100 and machine.tally.checked["scheduling"] > 0


def test_a_retraction_beside_running_rows_is_caught_by_sched_7():
    """[SCHED-7] TokenSpeed's forced retraction (a debugging knob, every third plan)
    retracts one of two decoding requests while the other runs and pages are free."""
    from kvspec.conformance.harness.checks import InvariantViolation

    driver = SchedulerDriver(make_scheduler(EXAMPLE, force_retraction_every=3), EXAMPLE, None, frozenset())
    driver.apply(submit("a", [1, 2, 3, 4], 8, list(range(8))))
    driver.apply(submit("b", [5, 6, 7, 8], 8, list(range(8))))
    with pytest.raises(InvariantViolation, match=r"\[SCHED-7\] the plan preempts"):
        for _ in range(6):
            driver.apply(STEP)


def test_a_retraction_without_need_is_caught_and_its_trace_replays(tmp_path):
    """[SCHED-7, SCHED-8] TokenSpeed's forced retraction preempts while pages are free:
    `kvspec check` fails with a scheduling clause (SCHED-7 where other rows run, SCHED-8
    where the retraction empties the pool and the plan), saves the trace, and it replays."""
    result = subprocess.run(["kvspec", "check", "--adapter", "test_tokenspeed_adapter:FORCED_RETRACTION", "--run",
                             "scheduler P=4 W=7", "--seed", "0", "--profile", "quick", "--shrink-seconds", "10"],
                            capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=600, check=False)
    assert result.returncode == 1 and ("[SCHED-7]" in result.stdout or "[SCHED-8]" in result.stdout), \
        result.stdout + result.stderr
    (path,) = (tmp_path / "kvspec-traces").glob("*.jsonl")
    trace = load(path)
    assert trace.tier == "scheduler" and {"SCHED-7", "SCHED-8"} & set(trace.violated)
    again = replay(trace, load_adapter("test_tokenspeed_adapter:FORCED_RETRACTION"))
    assert again.reproduces(trace), again.verdict()
    assert replay(trace, load_adapter("tokenspeed")).conforms  # the engine as shipped does not


def test_a_forced_retraction_is_reported_as_a_preemption_and_the_request_resumes():
    """[SCHED-7] What the adapter makes of a SnapshotOp and its RestoreOp: a retraction in
    the plan, the request's pages released, then a resumption at its computed tokens."""
    scheduler = make_scheduler(EXAMPLE, force_retraction_every=3)
    scheduler.submit("a", [1, 2, 3, 4, 5], 8)
    preempted, resumed, starts = [], [], []
    for _ in range(8):
        plan = scheduler.plan()
        preempted += [(p.rid, p.how.value) for p in plan.preempted]
        resumed += list(plan.resumed)
        for row in plan.rows:
            starts.append(row.start)
            scheduler.result(row.rid, 7 if row.start + row.tokens >= 5 else None)
    assert ("a", "retract") in preempted and "a" in resumed
    assert starts == sorted(starts) and len(set(starts)) == len(starts)  # resumed where it stopped, nothing again


def test_the_window_convention_is_declared_and_a_wrong_one_is_caught():
    """[SCHED-3] TokenSpeed's window counts the current token (W + 1). Declared otherwise,
    the adapter builds a window one token short, and a row's window loses the first page
    it reads at the first page boundary."""
    from kvspec.adapters.tokenspeed.scheduler import WINDOW_COUNTS_CURRENT_TOKEN, TokenSpeedScheduler
    from kvspec.conformance.harness.checks import InvariantViolation

    assert WINDOW_COUNTS_CURRENT_TOKEN
    steps = [submit("a", [1, 2, 3, 4, 5, 6, 7, 8], 8, list(range(9, 17))), TraceStep("drain")]
    right = SchedulerDriver(TokenSpeedScheduler(EXAMPLE), EXAMPLE, None, frozenset())
    for step in steps:
        right.apply(step)
    wrong = SchedulerDriver(TokenSpeedScheduler(EXAMPLE, window_counts_current_token=False), EXAMPLE, None,
                            frozenset())
    with pytest.raises(InvariantViolation, match=r"\[SCHED-3\]"):
        for step in steps:
            wrong.apply(step)


def test_a_trace_of_the_scheduler_tier_is_data_and_replays_on_tokenspeed(tmp_path):
    """[SCHED-1] A scheduler trace names only arrivals, steps, aborts and the drain."""
    steps = (submit("a", [1, 2, 3, 4, 5, 6, 7, 8], 3, [9, 10, 11]), STEP, submit("b", [1, 2, 3, 4, 5], 2, [6]),
             TraceStep("abort", {"rid": "a"}), TraceStep("drain"))
    config = {"page_size": 4, "window": 7, "pages": 24, "groups": ["full", "swa"], "max_batch_size": 2,
              "max_scheduled_tokens": 8}
    path = Trace("scheduler", config, "tokenspeed", steps).save(tmp_path / "t.jsonl")
    assert replay(load(path), load_adapter("tokenspeed")).conforms


def test_the_scheduler_vectors_replay_on_tokenspeed():
    """[SCHED-1 .. SCHED-9] vectors/ holds the scheduler tier's vectors (chapter 10's
    worked example and random arrivals on the reference scheduler, six of them with a
    state group): TokenSpeed replays every one, each plan of its own checked."""
    vectors = sorted((TESTS.parent / "vectors" / "conformance" / "scheduler").glob("*.jsonl"))
    assert len(vectors) == 16
    for path in vectors:
        result = replay(load(path), load_adapter("tokenspeed"))
        assert result.conforms, f"{path.name}: {result.verdict()}"


def test_the_state_a_row_reads_survives_a_retraction_and_a_restore():
    """[SCHED-9] A state group beside full and sliding window, TokenSpeed retracting a
    request every third plan: the adapter follows the pages TokenSpeed zeroes, sets aside
    and restores, and every row reads the state of exactly the tokens before it, also
    after its request came back on other pages."""
    from kvspec.spec.scheduler import STATE
    from kvspec.spec.state import state_digest

    config = SchedulerConfig(4, 7, 40, ("full", "swa", STATE), max_batch_size=2, max_scheduled_tokens=16)
    scheduler = make_scheduler(config, force_retraction_every=3)
    tokens = {"a": [1, 2, 3, 4, 5], "b": [6, 7, 8, 9]}
    for rid, prompt in tokens.items():
        scheduler.submit(rid, prompt, 8)
    resumed, reads = 0, 0
    for _ in range(12):
        plan = scheduler.plan()
        resumed += len(plan.resumed)
        for row in plan.rows:
            assert row.state_read == state_digest(tokens[row.rid][:row.start]), (row, tokens[row.rid])
            reads += 1
            sampled = row.start + row.tokens == len(tokens[row.rid])
            scheduler.result(row.rid, 0 if sampled else None)
            if sampled:
                tokens[row.rid].append(0)
    assert resumed >= 2 and reads >= 12


def test_with_forced_retraction_the_scheduler_raises_on_a_page_it_published_twice():
    """A bug of 0.1.42 behind its debugging knob (docs/engines/tokenspeed.md, section 9):
    with `debug_force_retraction_interval = 3`, two requests on the same first pages, the
    second differing from its 15th token on, and page size 4, window 2, 21 pages, one row
    and 11 tokens a plan: the first is retracted by the knob while it decodes, the second
    (a hit of 8 tokens) runs on. At its last plan the knob arms the second, whose image
    does not fit the snapshot pool left: `retractVictim` has published its completed prefix
    first, a one-token tail on the page it is writing, and the refused victim keeps running
    on that page. Its finish publishes the page again, as a two-token tail, and raises
    `one cache block location cannot change cache key` (prefix_index.h:107). Shrunk from a
    random search (101 of 200 random runs raised with the knob; none of 3000 without it)."""
    scheduler = make_scheduler(SchedulerConfig(page_size=4, window=2, pages=21, max_batch_size=1,
                                               max_scheduled_tokens=11), force_retraction_every=3)
    second = [0] * 14 + [1] + [0] * 36
    arrivals = {1: ("r2", [0] * 23, 3), 6: ("r4", second, 4)}
    outputs: dict[str, int] = {}
    tails = [scheduler.scheduler.tail_entries()]
    """The prefix cache's partial-page entries after each plan."""
    with pytest.raises(RuntimeError, match="one cache block location cannot change cache key"):
        for step in range(14):
            if step in arrivals:
                rid, prompt, limit = arrivals[step]
                scheduler.submit(rid, prompt, limit)
                outputs[rid] = limit
                continue
            plan = scheduler.plan()
            tails.append(scheduler.scheduler.tail_entries())
            for row in plan.rows:
                if row.start + row.tokens < len(scheduler.tokens[row.rid]):
                    scheduler.result(row.rid, None)
                    continue
                scheduler.result(row.rid, 0)
                outputs[row.rid] -= 1
                if not outputs[row.rid]:
                    scheduler.finish(row.rid)
    assert step == 13  # the second request's fourth output: its finish
    assert plan.rows[0].rid == "r4" and not plan.preempted  # armed, refused, and running on
    assert tails[-2:] == [1, 2]  # the refused retraction published the tail of the page it writes on
