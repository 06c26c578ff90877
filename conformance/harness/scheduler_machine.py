"""The scheduler-tier state machine: random arrivals and model results against any
scheduler that makes its own plans, every plan, result and end checked (spec chapter 10).

`scheduler_machine(make_scheduler, page_size, window)` returns a Hypothesis
`RuleBasedStateMachine` class. Its rules are a front end's and a model's choices only
(scheduler_driver.py): requests arrive with prompts that share prefixes (a few common
stems over a tiny token alphabet, so prefix hits happen), with output limits and the
outputs the model will return (fewer than the limit: a stop); the scheduler plans, a
plan at a time or several; a client aborts a request. The largest request the runs make
fills the pool alone (`pages_alone`), and up to as much again is spare, so several
requests press on it and the scheduler must refuse a request it cannot serve, stall,
preempt or wait (with `pressure`; without it the pool holds that much for every request
that may run at once); the per-plan token budget is drawn too, so long prompts are
prefilled in chunks. Every example ends with a drain: no more arrivals,
plans until every request has ended (SCHED-8), and nothing held after (SCHED-6).
"""

from collections.abc import Callable, Iterable
from dataclasses import asdict, replace

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.models import MemoryModel
from kvspec.spec.pages import pages_for
from kvspec.spec.scheduler import SchedulerConfig, pages_alone

from .recording import RecordingMachine
from .scheduler_driver import SchedulerDriver

ALPHABET = st.integers(0, 2)
MAX_REQUESTS = 4


def scheduler_config_json(config: SchedulerConfig) -> dict:
    """The configuration as a trace's header writes it."""
    return {**asdict(config), "groups": list(config.groups)}


def scheduler_machine(make_scheduler: Callable, page_size: int, window: int, observables: Iterable[str] = (),
                      model: MemoryModel | None = None, groups: tuple[str, ...] = (FULL, SWA),
                      pressure: bool = True) -> type[RecordingMachine]:
    """`model`: the memory model of the snapshot the scheduler shows beside its view, if
    any. Without `pressure` the pool holds every request that may run at once, so that no
    plan needs to preempt (for a scheduler that preempts when no plan needs it: SCHED-7)."""
    P, W = page_size, window
    longest_prompt = 2 * W + 4 * P
    most_outputs = W + 2 * P  # enough decode steps to slide past the window

    class SchedulerMachine(RecordingMachine):
        tier = "scheduler"

        @initialize(spare_eighths=st.integers(0, 8), max_batch_size=st.integers(1, MAX_REQUESTS),
                    chunk_pages=st.integers(1, pages_for(longest_prompt, P) + 1),
                    stems=st.lists(st.lists(ALPHABET, min_size=P, max_size=longest_prompt), min_size=1, max_size=3))
        def build(self, spare_eighths, max_batch_size, chunk_pages, stems):
            budget = SchedulerConfig(P, W, 1, groups, max_batch_size, max(chunk_pages * P, max_batch_size))
            # the largest request the runs make fills the pool alone, and up to as much again is spare;
            # without pressure the pool holds that many for every request that may run at once
            alone = pages_alone(budget, longest_prompt, most_outputs + 2)
            floor = alone if pressure else MAX_REQUESTS * alone
            self.config = replace(budget, pages=floor + spare_eighths * alone // 8)
            note(f"make_scheduler({self.config})")
            self.start_example(scheduler_config_json(self.config))
            self.stems = stems
            self.next_id = 0
            self.driver = SchedulerDriver(make_scheduler(self.config), self.config, model, frozenset(observables),
                                          log=note)

        def running(self) -> list[str]:
            return sorted(self.driver.ledger)

        @precondition(lambda self: len(self.driver.ledger) < MAX_REQUESTS)
        @rule(data=st.data())
        def submit(self, data):
            stem = data.draw(st.sampled_from(self.stems))
            length = data.draw(st.integers(1, longest_prompt))
            keep = data.draw(st.just(min(len(stem), length)) | st.integers(0, min(len(stem), length)))
            prompt = stem[:keep] + data.draw(st.lists(ALPHABET, min_size=length - keep, max_size=length - keep))
            # often the most outputs a request may have: decodes grow the tables, and the pool runs short
            count = data.draw(st.just(most_outputs) | st.integers(1, most_outputs))
            outputs = data.draw(st.lists(ALPHABET, min_size=count, max_size=count))
            self.next_id += 1
            self.run("submit", rid=f"r{self.next_id}", prompt=prompt,
                     max_new_tokens=len(outputs) + data.draw(st.integers(0, 2)), outputs=outputs)

        @precondition(lambda self: self.driver.ledger)
        @rule(plans=st.integers(1, 4))
        def step(self, plans):
            for _ in range(plans):
                if not self.driver.ledger:
                    break
                self.run("step")

        @precondition(lambda self: self.driver.ledger)
        @rule(data=st.data())
        def abort(self, data):
            self.run("abort", rid=data.draw(st.sampled_from(self.running())))

    SchedulerMachine.observables = frozenset(observables)
    SchedulerMachine.reset_counters()
    SchedulerMachine.__name__ = SchedulerMachine.__qualname__ = f"SchedulerMachine_P{P}_W{W}"
    return SchedulerMachine
