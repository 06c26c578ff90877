"""What both state machines share: every step goes through a driver and is recorded.

A machine's rules only choose steps (portable data, see trace.py); `run` records a step,
`note()`s it, tells the journal (the worker process's lifeline, so a step that hangs or
kills the process is still known) and applies it through the tier's driver, which
checks every invariant. When Hypothesis has shrunk a failure it replays the minimal
example last, so the class's `recorded` steps are then the shrunk counterexample.
"""

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import note
from hypothesis.stateful import RuleBasedStateMachine

from .checks import StepFailure, Tally
from .trace import Trace, TraceStep


class RecordingMachine(RuleBasedStateMachine):
    tier = ""
    capabilities: frozenset[str] = frozenset()
    observables: frozenset[str] = frozenset()
    journal: Callable[[str, Any], None] | None = None
    """Called with ("example", config) when an example starts and ("step", step) before each step."""

    # per class, over every example it ran (see reset_counters)
    examples = 0
    steps = 0
    tally = Tally()
    config: dict[str, Any] = {}
    recorded: list[TraceStep] = []
    started = 0.0
    first_failure_seconds: float | None = None
    """From reset_counters to the first failing step: the time to a counterexample."""
    first_failure_clauses: tuple[str, ...] = ()
    """What the first failing step broke (shrinking may end on another failure)."""

    @classmethod
    def reset_counters(cls):
        cls.examples, cls.steps, cls.tally, cls.config, cls.recorded = 0, 0, Tally(), {}, []
        cls.started, cls.first_failure_seconds, cls.first_failure_clauses = time.perf_counter(), None, ()

    def start_example(self, config: dict[str, Any]):
        """Called before the implementation is built, so that a failure to build it is
        reported with its configuration."""
        cls = type(self)
        cls.examples += 1
        cls.config, cls.recorded = config, []
        if cls.journal:
            cls.journal("example", config)

    def run(self, op: str, refuse: bool = False, **args) -> dict[str, Any]:
        cls = type(self)
        step = TraceStep(op, args, refuse)
        cls.recorded.append(step)
        if cls.journal:
            cls.journal("step", step)
        note(str(step))
        try:
            observed = self.driver.apply(step)
        except StepFailure as failure:
            cls.recorded[-1] = replace(step, violated=failure.clauses or (failure.kind,), message=str(failure))
            if cls.first_failure_seconds is None:
                cls.first_failure_seconds = time.perf_counter() - cls.started
                cls.first_failure_clauses = failure.clauses
            raise
        cls.steps += 1
        return observed

    def teardown(self):
        """Drain to empty (a leak check), unless a step already failed: its report must
        not be hidden by the drain's."""
        if not hasattr(self, "driver"):
            return
        try:
            if sys.exc_info()[1] is None:
                self.run("drain")
        finally:
            type(self).tally.merge(self.driver.tally)

    @classmethod
    def counterexample(cls, adapter: str, seed: int | None, label: str) -> Trace:
        """The steps of the last example run: after a shrunk failure, the minimal one."""
        return Trace(cls.tier, cls.config, adapter, tuple(cls.recorded), seed, label,
                     f"counterexample found by kvspec check ({label})")
