"""What both state machines share: every step goes through a driver and is recorded.

A machine's rules only choose steps (portable data, see trace.py); `run` records a step,
`note()`s it, tells the journal (the worker process's lifeline, so a step that hangs or
kills the process is still known) and applies it through the tier's driver, which
checks every invariant. When Hypothesis has shrunk a failure it replays the minimal
example last, so the class's `recorded` steps are then the shrunk counterexample.

For a picture of a run that found nothing (occupancy.py), the class also keeps its
busiest example: the one whose steps allocated and freed the most pages, as the free
page counts each step shows tell (the longest is no good: Hypothesis' simplest examples
repeat one refused call). Keeping it costs a reference to a list already made.
"""

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import note
from hypothesis.stateful import RuleBasedStateMachine

from .checks import StepFailure, Tally, distinct
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
    traffic = 0
    """Pages the current example's steps allocated or freed so far."""
    free_pages: dict[str, int] = {}
    """The free counts the last step showed (free_full_pages, free_swa_pages; free_blocks; free_pages)."""
    busiest: tuple[int, dict[str, Any], list[TraceStep]] = (0, {}, [])
    """The traffic, configuration and steps of the busiest example before the current one."""
    started = 0.0
    first_failure_seconds: float | None = None
    """From reset_counters to the first failing step: the time to a counterexample."""
    first_failure_clauses: tuple[str, ...] = ()
    """What the first failing step broke (shrinking may end on another failure)."""
    first_failure_step: int | None = None
    """How many steps were checked before the first failing one, over every example."""
    last_example_started = 0.0
    """When the last example began: after a failure, Hypothesis' replay of the shrunk one."""

    @classmethod
    def reset_counters(cls):
        cls.examples, cls.steps, cls.tally, cls.config, cls.recorded = 0, 0, Tally(), {}, []
        cls.traffic, cls.busiest = 0, (0, {}, [])
        cls.started, cls.first_failure_seconds, cls.first_failure_clauses = time.perf_counter(), None, ()
        cls.first_failure_step = None

    def start_example(self, config: dict[str, Any]):
        """Called before the implementation is built, so that a failure to build it is
        reported with its configuration."""
        cls = type(self)
        cls.examples += 1
        cls.last_example_started = time.perf_counter()
        cls.keep_if_busiest()
        cls.config, cls.recorded, cls.traffic = config, [], 0
        cls.free_pages = {"free_pages": config["pages"]} if "pages" in config else {  # one pool, or two
            "free_full_pages": config["size_full"] // config["page_size"],
            "free_swa_pages": config["size_swa"] // config["page_size"]}
        if cls.journal:
            cls.journal("example", config)

    def run(self, op: str, refuse: bool = False, **args) -> dict[str, Any]:
        cls = type(self)
        # the trace keeps its own copy of the arguments, and the implementation gets another:
        # an engine that keeps the prompt list it is given and extends it (its outputs) must
        # not change what the counterexample says was asked, nor what the machine drew
        step = TraceStep(op, copy.deepcopy(args), refuse)
        cls.recorded.append(step)
        if cls.journal:
            cls.journal("step", step)
        note(str(step))
        try:
            observed = self.driver.apply(replace(step, args=copy.deepcopy(args)))
        except StepFailure as failure:
            cls.recorded[-1] = replace(step, violated=failure.clauses or (failure.kind,), message=str(failure))
            if cls.first_failure_seconds is None:
                cls.first_failure_seconds = time.perf_counter() - cls.started
                cls.first_failure_clauses, cls.first_failure_step = failure.clauses, cls.steps
            # where several bugs are reported, each failure carries its own example's steps
            failure.example = (cls.config, tuple(cls.recorded))
            raise distinct(failure)
        cls.steps += 1
        free_pages = {key: count for key, count in observed.items() if key.startswith("free_")}
        cls.traffic += sum(abs(count - cls.free_pages.get(key, count)) for key, count in free_pages.items())
        cls.free_pages = free_pages
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

    @classmethod
    def counterexample_of(cls, failure: BaseException, adapter: str, seed: int | None, label: str) -> Trace:
        """The steps of the example that raised `failure`: several bugs reported at once
        each carry their own; anything else escaped the driver in the last example run."""
        if getattr(failure, "example", None) is None:
            return cls.counterexample(adapter, seed, label)
        config, steps = failure.example
        return Trace(cls.tier, config, adapter, steps, seed, label, f"counterexample found by kvspec check ({label})")

    @classmethod
    def keep_if_busiest(cls):
        if (cls.traffic, len(cls.recorded)) > (cls.busiest[0], len(cls.busiest[2])):
            cls.busiest = cls.traffic, cls.config, cls.recorded

    @classmethod
    def busiest_example(cls, adapter: str, seed: int | None, label: str) -> Trace:
        """The steps of the busiest example run so far (module docstring)."""
        cls.keep_if_busiest()
        _, config, steps = cls.busiest
        return Trace(cls.tier, config, adapter, tuple(steps), seed, label,
                     f"busiest example of kvspec check ({label})")
