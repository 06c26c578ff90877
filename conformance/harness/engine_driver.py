"""The engine-tier driver: applies portable lifecycle steps to any engine and checks
every invariant of kvspec.spec.invariants after each.

Steps are the engine operations of chapter 06 with their own arguments (request ids,
prompts as token ids, chunk lengths, token counts to evict), so they need no
translation. With large pools an engine that can show a partial snapshot is checked on
one between whole ones [OBS-4]. A step marked `refuse` is misuse the spec requires the engine to refuse
with InvalidRequest and no change [LIFE-1]. `drain` finishes every decoding request,
aborts every prefilling one, evicts the whole cache and requires every page free; a
`flush` must end there too [LIFE-11], and a `match` may only split a node [LIFE-12].
"""

from typing import Any

from kvspec.spec.invariants.tree import match_violations
from kvspec.spec.lifecycle import EngineOperation, RunningRequest, refusal
from kvspec.spec.models import MemoryModel
from kvspec.spec.outcomes import InvalidRequest, KvSpecError, Outcome, OutOfMemory
from kvspec.spec.snapshot import EngineSnapshot, Step, TwoPoolSnapshot, pool_check_period

from .checks import (
    Checks,
    ImplementationCrash,
    InvariantViolation,
    StepNotApplicable,
    Tally,
    raised_by_the_implementation,
)
from .protocol import PARAMETERS
from .snapshot_shape import plain
from .trace import TraceStep


class EngineDriver:
    def __init__(self, engine, model: MemoryModel, observables: frozenset[str], log=None):
        self.engine = engine
        self.model = model
        self.observables = observables
        self.log = log or (lambda line: None)
        self.logging = log is not None  # a step's line is only written for someone who reads it
        self.tally = Tally()
        self.invariants = Checks(model.snapshot_type, observables)
        self.retracted: set[str] = set()
        """Requests retracted and not admitted since: what the lifecycle lets admit without a prompt."""
        self.previous = self.snapshot()
        # [OBS-4] an engine that can show a partial snapshot shows a whole one every
        # `period` checks (every check with small pools), a partial one in between
        self.period = pool_check_period(self.previous.config) if hasattr(engine, "partial_snapshot") else 1
        self.checks = 0
        self.check(None)

    def snapshot(self, whole: bool = True) -> EngineSnapshot:
        try:
            snapshot = self.engine.snapshot() if whole else self.engine.partial_snapshot()
        except BaseException as error:  # noqa: BLE001 - what the implementation raised
            if not raised_by_the_implementation(error):
                raise
            raise ImplementationCrash(f"snapshot() raised {type(error).__name__}: {error}", ["OBS-1"]) from error
        if not isinstance(snapshot, self.model.snapshot_type):
            raise ImplementationCrash(f"snapshot() returned a {type(snapshot).__name__}, but the adapter declares the "
                                      f"{self.model.name} memory model, whose snapshot is a "
                                      f"{self.model.snapshot_type.__name__}", ["OBS-1"])
        return snapshot

    def apply(self, step: TraceStep) -> dict[str, Any]:
        """Apply one step, check every invariant, return the observables the spec fixes.
        Raises StepFailure (InvariantViolation, ImplementationCrash, StepNotApplicable)."""
        if step.op == "drain":
            self.drain()
            outcome = Outcome.OK
        elif step.refuse:
            self.refused(step)
            outcome = Outcome.REFUSED
        else:
            outcome = self.call(step.op, step.args)
        # the snapshot the step's check took; as ints, whatever integers the adapter showed
        return plain(self.model.fixed_observables(self.previous, outcome))

    def call(self, operation: str, args: dict[str, Any]) -> Outcome:
        if self.logging:
            self.log(f"{operation}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
        try:
            result = getattr(self.engine, operation)(*(args[name] for name in PARAMETERS[operation]))
        except InvalidRequest as error:
            if why := self.forbidden(operation, args):
                said = "" if str(error) == why else f" (the engine said: {error})"
                raise StepNotApplicable(f"{operation} was refused, and the lifecycle forbids it in the state the "
                                        f"engine showed before it: {why}{said}") from error
            raise InvariantViolation(f"{operation} was refused although the lifecycle allows it: {error}",
                                     ["LIFE-1"]) from error
        except KvSpecError as error:
            raise ImplementationCrash(f"{operation} raised {type(error).__name__}: {error}", ["LIFE-1"]) from error
        except BaseException as error:  # noqa: BLE001 - what the implementation raised
            if not raised_by_the_implementation(error):
                raise
            raise ImplementationCrash(f"{operation} raised {type(error).__name__}: {error}") from error
        failed = isinstance(result, OutOfMemory)
        if failed:
            self.log(f"  -> {result}")
        elif operation == "retract":
            self.retracted.add(args["rid"])
        elif operation in ("admit", "pd_admit"):
            self.retracted.discard(args["rid"])
        outcome = Outcome.OUT_OF_MEMORY if failed else Outcome.OK
        batch = tuple(member["rid"] for member in args.get("chunks", args.get("finishes", ())))  # LIFE-9, LIFE-10
        before = self.previous
        self.check(Step(EngineOperation(operation), args.get("rid"), outcome, batch=batch), whole=operation == "flush")
        if operation == "flush":  # [LIFE-11] what a drain ends in
            self.tally.clauses.add("LIFE-11")
            self.require_drained("after flushing the cache:")
        elif operation == "match" and isinstance(before, TwoPoolSnapshot):  # [LIFE-12] a split, nothing more
            self.tally.clauses.add("LIFE-12")
            if violations := match_violations(before, self.previous):
                raise InvariantViolation.of(violations, "after a waiting request's match:")
        return outcome

    def forbidden(self, operation: str, args: dict[str, Any]) -> str | None:
        """[LIFE-1] Why the lifecycle forbids the call in the state the engine showed before
        it (kvspec.spec.lifecycle.refusal), or None where it allows it: a refusal of a call
        it forbids is no violation, but a step the trace (or an earlier divergence) got
        wrong. What a request may trim is its own KV: past its cached prefix."""
        try:
            running = {r.rid: RunningRequest(r.finished_prefill, r.seq_len, r.kv_committed_len - r.cache_protected_len,
                                              r.kv_committed_len)
                       for r in self.previous.requests}
            return refusal(operation, args, running, self.retracted, self.previous.config.size_full)
        except (TypeError, AttributeError, ValueError):  # a snapshot it cannot read: the refusal is the engine's
            return None

    def refused(self, step: TraceStep):
        self.tally.clauses.add("LIFE-1")  # [LIFE-1] refused, and nothing changed
        before = self.snapshot()
        self.log(f"{step} (must be refused)")
        try:
            getattr(self.engine, step.op)(*(step.args[name] for name in PARAMETERS[step.op]))
        except InvalidRequest as error:
            self.log(f"  refused: {error}")
        except BaseException as error:  # noqa: BLE001 - what the implementation raised
            if not raised_by_the_implementation(error):
                raise
            raise ImplementationCrash(f"{step} raised {type(error).__name__}: {error} instead of InvalidRequest",
                                      ["LIFE-1"]) from error
        else:
            raise InvariantViolation(f"{step} was accepted but the lifecycle forbids it", ["LIFE-1"])
        if self.snapshot() != before:
            raise InvariantViolation(f"refused {step} changed the engine", ["LIFE-1"])
        self.check(None)

    def check(self, step: Step | None, whole: bool = False):
        whole = whole or self.checks % self.period == 0
        self.checks += 1
        now = self.snapshot(whole)
        # the next step is checked from here even after a violation (a picture of a run goes on past one)
        previous, self.previous = self.previous, now
        violations = self.invariants.violations(self.tally, now, previous if step else None, step)
        if violations:
            raise InvariantViolation.of(violations, f"after {step}:" if step else "")

    def drain(self):
        """Release every request, evict the whole cache: every page must be free."""
        for request in sorted(self.previous.requests, key=lambda r: r.rid):
            if request.finished_prefill:
                self.call("finish", {"rid": request.rid, "trim": 0})
            else:
                self.call("abort", {"rid": request.rid})
        config = self.previous.config
        self.call("evict", {"full_tokens": config.size_full, "swa_tokens": config.size_swa})
        if self.period > 1:  # end on a whole snapshot: every pool-wide check once more
            self.check(None, whole=True)
        self.require_drained("after releasing every request and evicting the whole cache:")

    def require_drained(self, after: str):
        """Every page of every pool free, on the last (whole) snapshot."""
        if violations := self.model.drained_violations(self.previous):
            raise InvariantViolation.of(violations, after)
