"""What a check and a replay tell the writer of a new adapter (issue 40, point 6): the
engine's own traceback under a crash's one-line message, a verdict that names a
nondeterministic implementation instead of Hypothesis' Flaky traceback, shrinking that
stops once nothing shrinks further, plain ints in messages, and a refusal at a
hand-written step worded for the trace. Each seeded situation is a small adapter here,
loaded by `module:attribute` as an adapter outside the repository would be."""

import itertools
import os
import re
import subprocess
from pathlib import Path

import numpy as np

from kvspec.adapters.reference import ReferenceAllocatorAdapter, ReferenceEngineAdapter
from kvspec.conformance.harness.allocator_driver import AllocatorDriver
from kvspec.conformance.harness.checks import InvariantViolation, plain_numbers
from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.trace import Trace, TraceStep, load
from kvspec.conformance.runs.plan import plan
from kvspec.conformance.runs.runner import Job, check_job
from kvspec.spec.accounting import AllocatorState
from kvspec.spec.outcomes import InvalidRequest

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
ENGINE_RUN = "engine P=4 W=6 I=4"


def kvspec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], check=False, capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=600)


def engine_adapter(name: str, make_engine):
    """The reference engine's adapter with one change, at the two-pool versions."""
    from kvspec.adapters.reference import ADAPTER as REFERENCE

    return type(name, (), {"name": name.lower(), "policy_version": REFERENCE.policy_version,
                           "capabilities": ("page_size_1", "page_size_gt_1", "pd_decode", "chunked_prefill"),
                           "make_engine": make_engine})


# -- 1. a crash: the engine's traceback, apart from its one-line message ---------------------------

def checked_prompt(prompt):
    assert len(prompt) < 4  # the engine's own check, a bare assert: its message is empty


class AssertingEngine(ReferenceEngineAdapter):
    def admit(self, rid, prompt):
        if prompt is not None:
            checked_prompt(prompt)
        return self.engine.admit(rid, prompt)


ASSERTING = engine_adapter("ASSERTING", AssertingEngine)
RAISED_AT = re.compile(r'File "[^"]*test_adapter_output\.py", line \d+, in checked_prompt\n\s*assert len\(prompt\) < 4')


def test_a_crash_shows_the_engines_traceback_under_its_one_line_message(tmp_path):
    """It read `admit raised AssertionError: ` and nothing else, with --verbose too."""
    checked = kvspec("check", "--adapter", "test_adapter_output:ASSERTING", "--run", ENGINE_RUN, "--seed", "1",
                     "--no-shrink", "--traces", "t", cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    # the message is one line as it was (tables of findings match it), the traceback follows it
    assert re.search(r"^    admit raised AssertionError: \n    the implementation raised it here \(most recent call "
                     r"last\):\n", checked.stdout, re.MULTILINE), checked.stdout
    assert "Traceback" not in checked.stdout + checked.stderr  # the word of kvspec's own failure
    assert RAISED_AT.search(checked.stdout), checked.stdout
    [trace] = (tmp_path / "t").glob("*.jsonl")
    replayed = kvspec("replay", str(trace), "--adapter", "test_adapter_output:ASSERTING", "--verbose", cwd=tmp_path)
    assert replayed.returncode == 1 and "reproduced: crashed at step" in replayed.stdout, replayed.stdout
    assert RAISED_AT.search(replayed.stdout), replayed.stdout
    # the same replay in this process: the traceback is text, as it crosses from a worker
    result = replay(load(trace), load_adapter("test_adapter_output:ASSERTING"))
    assert str(result.failure).startswith("admit raised AssertionError") and RAISED_AT.search(result.cause)


# -- 2. an implementation that reads a clock: a verdict, not Hypothesis' Flaky ---------------------

class Watchdog:
    """Stands for time.monotonic(): it never reads the same twice, so the same steps run
    alike only by chance (a count, not the time itself: the test must not be flaky)."""

    ticks = itertools.count()


class WatchdogEngine(ReferenceEngineAdapter):
    """Gives up an admission when its watchdog says it took too long."""

    def admit(self, rid, prompt):
        if next(Watchdog.ticks) % 7 == 6:
            raise RuntimeError("watchdog: the admission took too long")
        return self.engine.admit(rid, prompt)


WATCHDOG = engine_adapter("WATCHDOG", WatchdogEngine)


def test_a_nondeterministic_implementation_is_told_so_with_how_to_fix_it(tmp_path):
    """Hypothesis raised FlakyFailure ("Inconsistent results") or FlakyStrategyDefinition
    ("Inconsistent data generation"): reported as a crash, or its traceback."""
    Watchdog.ticks = itertools.count()
    planned = plan(load_adapter("test_adapter_output:WATCHDOG")).select([ENGINE_RUN]).runs[0]
    result = check_job(Job("test_adapter_output:WATCHDOG", planned, "quick", 1, str(tmp_path)))
    assert result.verdict == "error" and result.trace is None, (result.verdict, result.message)
    assert result.message.startswith("the implementation is not deterministic: the same steps gave different "
                                     "outcomes"), result.message
    assert "Once, it failed: admit raised RuntimeError: watchdog" in result.message
    assert "time.monotonic()" in result.message and "break ties" in result.message  # how to fix it


# -- 3. shrinking stops once nothing shrinks further ------------------------------------------------

def test_a_short_counterexample_is_not_shrunk_for_the_whole_budget(tmp_path):
    """A two-step counterexample (the seeded bug's), found in a second and shrunk in about
    200 examples, went on for some 530 more (Hypothesis' explain phase, which varies the
    minimal example only to annotate a report kvspec does not show): 30 s, the whole quick
    budget. Counted in examples, not seconds, so that a loaded machine does not decide it."""
    planned = plan(load_adapter("mutant-table-one-block-short")).of(Run(2, 5, 1))
    result = check_job(Job("mutant-table-one-block-short", planned, "quick", 1, str(tmp_path), shrink_seconds=600))
    assert result.verdict == "violated" and result.trace_steps == 2, (result.verdict, result.message)
    assert not result.shrink_stopped_at_budget and result.examples < 400, result.examples


# -- 4. ids and counts as plain ints, whatever integers the adapter shows ---------------------------

class NumpyAllocator(ReferenceAllocatorAdapter):
    """Shows its counts and pages as numpy integers, as an engine kept in numpy arrays does."""

    def state(self) -> AllocatorState:
        state = super().state()
        return AllocatorState(state.page_size, np.int64(state.size_full),
                              *(type(pool)(pool.name, pool.page_size, np.int64(pool.num_pages),
                                           tuple(np.int64(page) for page in pool.free_pages))
                                for pool in (state.full, state.swa)),
                              tuple(np.int64(slot) for slot in state.mapping))

    def available_sizes(self):
        return tuple(np.int64(size) for size in super().available_sizes())


def test_the_observables_a_step_hands_on_are_plain_ints():
    """What a trace's `expect` records and a replay compares: `observed np.int64(12)` in a
    difference, and a trace that cannot be written as JSON."""
    driver = AllocatorDriver(NumpyAllocator(32, 32, 4), 4, frozenset({"free_sets", "mapping"}))
    observed = driver.apply(TraceStep("new_sequence", {"length": 9}))
    assert observed == {"outcome": "ok", "free_full_pages": 5, "free_swa_pages": 5}
    assert [type(observed[count]) for count in ("free_full_pages", "free_swa_pages")] == [int, int]


def test_a_failures_message_writes_numpy_and_torch_integers_as_ints():
    """A check formats what the snapshot holds: a list of an adapter's np.int64 ids read
    `groups [np.int64(0), np.int64(1)]` (numpy 2's repr)."""
    import torch

    from kvspec.spec.notation import Violation

    groups = sorted({np.int64(1), np.int64(0)})
    failure = InvariantViolation.of([Violation("BLOCK-2", f"block {np.int64(3)} is held by tables of groups {groups}")])
    assert str(failure) == "[BLOCK-2] block 3 is held by tables of groups [0, 1]", str(failure)
    text = f"pages {(np.int64(3), np.uint32(7))} at {torch.tensor(5)!r} and {torch.tensor(6, dtype=torch.int32)!r}"
    assert plain_numbers(text) == "pages (3, 7) at 5 and 6", plain_numbers(text)
    assert plain_numbers("np.int64 is a type; tensor(x) is code") == "np.int64 is a type; tensor(x) is code"


# -- 5. a refusal at a hand-written step: the trace, the likely cause -------------------------------

class RefusesDecode(ReferenceEngineAdapter):
    """Refuses every decode, a step the lifecycle allows."""

    def decode(self, rid, token):
        raise InvalidRequest("this engine decodes nothing today")


REFUSES_DECODE = engine_adapter("REFUSES_DECODE", RefusesDecode)
REFUSING = "test_adapter_output:REFUSES_DECODE"
CONFIG = {"page_size": 4, "window": 6, "size_full": 64, "size_swa": 32, "max_requests": 4,
          "policy": {"version": "sglang-0.5.23", "decode_eviction_interval": 4}}
STEPS = (TraceStep("admit", {"rid": "r", "prompt": [1, 2, 3, 4, 5]}),
         TraceStep("prefill_chunk", {"rid": "r", "chunk": 5, "token": 7}),
         TraceStep("decode", {"rid": "r", "token": 7}))


def test_a_refused_step_a_hand_written_trace_does_not_mark_refused_names_the_trace():
    """It read "decode was refused although the lifecycle allows it": a trace written
    by hand, a misuse without "refuse": true, read as a bug of the engine alone."""
    result = replay(Trace("engine", CONFIG, "refuses-decode", STEPS), load_adapter(REFUSING), judge_trace=True)
    message = str(result.failure)
    assert result.stopped_at == 2 and result.failure.clauses == ("LIFE-1",), message
    assert message.startswith('[LIFE-1] decode was refused (this engine decodes nothing today), but the trace does '
                              'not mark this step "refuse": true, so replay expected it to be accepted'), message
    assert 'mark it "refuse": true in the trace' in message


def test_a_refused_step_the_reference_accepted_still_blames_the_engine():
    """A trace whose step records what the reference showed (kvspec's own traces) accepted it."""
    reference = replay(Trace("engine", CONFIG, "reference", STEPS), load_adapter("reference"))
    steps = tuple(TraceStep(step.op, step.args, expect=seen) for step, seen in zip(STEPS, reference.observed))
    result = replay(Trace("engine", CONFIG, "refuses-decode", steps), load_adapter(REFUSING), judge_trace=True)
    message = str(result.failure)
    assert message.startswith("[LIFE-1] decode was refused although the lifecycle allows it: this engine"), message
