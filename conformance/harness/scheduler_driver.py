"""The scheduler-tier driver: plays the serving front end and the model around a scheduler
that makes its own plans, and checks every plan, result and end (spec chapter 10).

A trace step at this tier is what a front end or a model decides, never what the
scheduler decides, so one trace drives any scheduler:

  submit {rid, prompt, max_new_tokens, outputs}  a request arrives; `outputs` are the tokens
                                                 the model will return for it, in order; it
                                                 ends (finish) after the last one, or at once
                                                 if the scheduler refuses it (SCHED-8)
  step {}                                        one plan; every row it forwards is answered
                                                 (the next output where the row samples),
                                                 and a request whose outputs are all
                                                 returned is finished
  abort {rid}                                    the client gives up on a request
  drain {}                                       plans until every request has ended, at most
                                                 drain_bound of them (SCHED-8)

The driver keeps the ledger (kvspec.spec.scheduler.ScheduledRequest): what it submitted,
what each forward computed and returned. After every call it checks the tier's
invariants (SCHED-*) over the ledger, the plan and what the scheduler shows, and, where the
scheduler shows its memory model's snapshot, that model's invariants over it.
"""

from typing import Any

from kvspec.spec.models import MemoryModel, model_of_snapshot
from kvspec.spec.outcomes import Outcome, OutOfMemory
from kvspec.spec.scheduler import (
    Plan,
    ScheduledRequest,
    SchedulerConfig,
    SchedulerOperation,
    SchedulerSnapshot,
    SchedulerView,
    after_plan,
    after_result,
    drain_bound,
    progress_violation,
    refusal_violation,
    samples,
)
from kvspec.spec.snapshot import Step

from .checks import (
    Checks,
    ImplementationCrash,
    InvariantViolation,
    StepNotApplicable,
    Tally,
    raised_by_the_implementation,
)
from .snapshot_shape import plain
from .trace import TraceStep


class SchedulerDriver:
    """`model` and `observables`: the adapter's memory model and what it shows of it. The
    memory snapshot a scheduler shows is checked by its own model's invariants (the model
    its type is of), with the adapter's observables where that is the adapter's model,
    all of them otherwise (a scheduler on an engine of another model shows it whole)."""

    def __init__(self, scheduler, config: SchedulerConfig, model: MemoryModel | None, observables: frozenset[str],
                 log=None):
        self.scheduler = scheduler
        self.config = config
        self.model = model
        self.observables = observables
        self.log = log or (lambda line: None)
        self.tally = Tally()
        self.invariants = Checks(SchedulerSnapshot, observables)
        self.memory_invariants: dict[type, Checks] = {}
        self.ledger: dict[str, ScheduledRequest] = {}
        self.outputs: dict[str, tuple[int, ...]] = {}
        """The tokens each request returns, in order (from its submission)."""
        self.previous = SchedulerSnapshot(config, (), self.view())
        self.check(Step(SchedulerOperation.BUILD))

    # -- what the scheduler shows --------------------------------------------------------------

    def view(self) -> SchedulerView:
        try:
            view = self.scheduler.snapshot()
        except BaseException as error:  # noqa: BLE001 - what the implementation raised
            if not raised_by_the_implementation(error):
                raise
            raise ImplementationCrash(f"snapshot() raised {type(error).__name__}: {error}", ["OBS-1"]) from error
        if not isinstance(view, SchedulerView):
            raise ImplementationCrash(f"snapshot() returned a {type(view).__name__}, but a scheduler shows a "
                                      f"SchedulerView (kvspec.spec.scheduler)", ["OBS-1"])
        if view.memory is not None and model_of_snapshot(view.memory) is None:
            raise ImplementationCrash(f"snapshot().memory is a {type(view.memory).__name__}, the snapshot of no memory "
                                      f"model (kvspec.spec.models.MODELS)", ["OBS-1"])
        return view

    def memory_checks(self, memory) -> Checks:
        if type(memory) not in self.memory_invariants:
            model = model_of_snapshot(memory)
            shown = self.observables if model is self.model else frozenset(model.observables)
            self.memory_invariants[type(memory)] = Checks(model.snapshot_type, shown)
        return self.memory_invariants[type(memory)]

    def check(self, step: Step, plan: Plan | None = None):
        now = SchedulerSnapshot(self.config, tuple(self.ledger.values()), self.view(), plan)
        previous, self.previous = self.previous, now
        found = self.invariants.violations(self.tally, now, previous, step)
        if now.view.memory is not None:
            found += self.memory_checks(now.view.memory).violations(self.tally, now.view.memory)
        if found:
            raise InvariantViolation.of(found, f"after {step.operation}{f'({step.rid})' if step.rid else ''}:")

    # -- the calls ---------------------------------------------------------------------------

    def call(self, operation: str, *args):
        self.log(f"{operation}({', '.join(map(repr, args))})")
        try:
            return getattr(self.scheduler, operation)(*args)
        except BaseException as error:  # noqa: BLE001 - what the implementation raised
            if not raised_by_the_implementation(error):
                raise
            raise ImplementationCrash(f"{operation}{args} raised {type(error).__name__}: {error}") from error

    def apply(self, step: TraceStep) -> dict[str, Any]:
        """Apply one step and check every call it makes; return what the scheduler shows
        (for pictures; the spec fixes no plan, so no trace expects one)."""
        args = step.args
        if step.op == "submit":
            self.submit(args["rid"], args["prompt"], args["max_new_tokens"], args["outputs"])
        elif step.op == "step":
            self.plan_once()
        elif step.op == "abort":
            self.abort(args["rid"])
        elif step.op == "drain":
            self.drain()
        return plain(observables(self.previous))  # ints, as the adapter's may not be

    def submit(self, rid: str, prompt: list[int], max_new_tokens: int, outputs: list[int]):
        if rid in self.ledger or rid in self.outputs:
            raise StepNotApplicable(f"request {rid!r} was submitted before")
        refused = isinstance(self.call("submit", rid, list(prompt), max_new_tokens), OutOfMemory)
        self.outputs[rid] = tuple(outputs)
        if refused:  # it has ended: it holds nothing and never runs
            self.log("  -> refused")
            if violation := refusal_violation(self.config, rid, len(prompt), max_new_tokens):
                raise InvariantViolation.of([violation], f"after submit({rid}):")
        else:
            self.ledger[rid] = ScheduledRequest(rid, len(prompt), max_new_tokens, 0, 0, tokens=tuple(prompt))
        self.check(Step(SchedulerOperation.SUBMIT, rid, Outcome.OUT_OF_MEMORY if refused else Outcome.OK))

    def abort(self, rid: str):
        if rid not in self.ledger:
            if rid in self.outputs:  # it ended first: a client's late abort, which nothing needs to answer
                self.log(f"abort({rid!r}): it has already ended")
                return
            raise StepNotApplicable(f"request {rid!r} was never submitted")
        self.call("abort", rid)
        del self.ledger[rid]
        self.check(Step(SchedulerOperation.ABORT, rid))

    def plan_once(self) -> Plan:
        """One plan, its rows answered, the requests whose outputs are all returned finished."""
        plan = self.call("plan")
        if not isinstance(plan, Plan):
            raise ImplementationCrash(f"plan() returned a {type(plan).__name__}, not a Plan (kvspec.spec.scheduler)",
                                      ["OBS-1"])
        before = self.ledger
        self.ledger = {request.rid: request for request in after_plan(tuple(before.values()), plan)}
        self.check(Step(SchedulerOperation.PLAN), plan)  # the rows are checked against the ledger before the plan
        for row in plan.rows:
            request = self.ledger[row.rid]
            sampled = samples(request, row)
            token = self.outputs[row.rid][request.outputs] if sampled else None
            self.call("result", row.rid, token)
            self.ledger[row.rid] = after_result(request, row, token)
            self.check(Step(SchedulerOperation.RESULT, row.rid))
        for row in plan.rows:
            request = self.ledger[row.rid]
            if request.outputs == len(self.outputs[row.rid]):
                self.call("finish", row.rid)
                del self.ledger[row.rid]
                self.check(Step(SchedulerOperation.FINISH, row.rid))
        return plan

    def drain(self):
        """[SCHED-8] No more arrivals: plan until every request has ended, within drain_bound."""
        requests = tuple(self.ledger.values())
        bound = drain_bound(requests, [len(self.outputs[r.rid]) - r.outputs for r in requests],
                            self.config.max_scheduled_tokens)
        plans = 0
        while self.ledger:
            if plans == bound:
                raise InvariantViolation.of([progress_violation(plans, bound)],
                                            f"waiting for {sorted(self.ledger)} to end:")
            self.plan_once()
            plans += 1


def observables(snapshot: SchedulerSnapshot) -> dict[str, Any]:
    """What a scheduler showed after a step, as plain data: its free pages and each request's ledger."""
    return {"outcome": Outcome.OK, "free_pages": snapshot.view.pool.free,
            "requests": {r.rid: [r.computed, r.outputs, r.status.value] for r in snapshot.requests}}

