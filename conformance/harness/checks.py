"""What the harness checks after every step, at each tier, and what it needs to see.

Every check is a spec predicate with its clause id and invariant class. An adapter may
declare which optional observables of its memory model it offers (`observables`, a
subset of kvspec.spec.models.MemoryModel.observables; all by default): a check that reads
one it lacks is counted as skipped, never run on an empty view and never counted as
passed. Pool sizes and free counts are always required.

A step ends in one of three failures, each carrying its clauses for the report:
InvariantViolation (the implementation broke the spec), ImplementationCrash (it raised
something the spec does not allow) and StepNotApplicable (a replayed step names a
sequence or request the implementation does not have: it diverged earlier).
"""

import os
import re
import signal
from collections import Counter
from collections.abc import Iterable
from functools import cache

from kvspec.spec.invariants import applicable
from kvspec.spec.notation import Violation
from kvspec.spec.registry import INVARIANT_CLASSES, violations

from .incremental import Certificates
from .snapshot_shape import shape_problem

SCALAR_INT = re.compile(r"\bnp\.u?int(?:8|16|32|64)\((-?\d+)\)"
                        r"|\btensor\((-?\d+)(?:, dtype=torch\.u?int(?:8|16|32|64))?\)")
"""An integer as numpy (2 and later) and torch write a scalar of theirs: np.int64(3), tensor(3)."""


def plain_numbers(message: str) -> str:
    """The message with every numpy or torch integer scalar written as the int it is. An
    adapter may show ids and counts as np.int64 (a check reads them as ints alike), and a
    check's message, built from the snapshot, then read `blocks (np.int64(3), np.int64(7))`.
    Converting every snapshot where it is read would cost a walk of it at every step
    (snapshot_shape.plain does it for the observables a step hands on, which are small)."""
    return SCALAR_INT.sub(lambda found: found.group(1) if found.group(1) is not None else found.group(2), message)


class StepFailure(AssertionError):
    """A step that did not conform; `clauses` names what it broke."""

    kind = "violated"

    def __init__(self, message: str, clauses: Iterable[str] = ()):
        message = plain_numbers(message)
        self.clauses = tuple(dict.fromkeys(clauses))
        if self.clauses and not message.startswith("["):
            message = f"[{', '.join(self.clauses)}] {message}"
        super().__init__(message)


@cache
def failure_class(kind: type[StepFailure], clauses: tuple[str, ...]) -> type[StepFailure]:
    """A subclass of `kind` for one set of broken clauses: Hypothesis tells bugs apart by
    exception type and place, so that failures of distinct clauses, all raised at the same
    line of the driver, are distinct bugs, each shrunk and reported on its own (a check
    with --multiple-bugs; one bug per run otherwise)."""
    return type(f"{kind.__name__}[{','.join(clauses)}]", (kind,), {"__module__": kind.__module__, "by_clauses": True})


def distinct(failure: StepFailure) -> StepFailure:
    """The same failure, as the instance of its clauses' failure_class."""
    kind = type(failure)
    if kind.__dict__.get("by_clauses"):  # already made distinct (re-raised)
        kind = kind.__bases__[0]
    failure.__class__ = failure_class(kind, failure.clauses)
    return failure


class InvariantViolation(StepFailure):
    @classmethod
    def of(cls, violations: list[Violation], context: str = "") -> "InvariantViolation":
        failure = cls("\n".join(map(str, violations)), (v.clause for v in violations))
        if context:
            failure.args = (f"{context}\n{failure}",)
        return failure


class ImplementationCrash(StepFailure):
    """The implementation raised an exception the spec does not allow for this call."""

    kind = "crashed"


def raised_by_the_implementation(error: BaseException) -> bool:
    """Whether an exception that reached the harness from an implementation's call is the
    implementation's to answer for: any Exception, and a BaseException it raised itself
    (GeneratorExit, SystemExit, a KeyboardInterrupt of its own), except Ctrl-C where it
    reaches this process (a worker ignores SIGINT; pytest's own process does not)."""
    if isinstance(error, KeyboardInterrupt):
        return signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    return True


class StepNotApplicable(StepFailure):
    """A replayed step cannot be applied: the implementation diverged earlier."""

    kind = "diverged"


CHECKS_MODES = ("incremental", "naive")
"""The values of KVSPEC_CHECKS: incremental (the default, also when it is unset or empty)
or naive (every check as the spec writes it)."""


def checks_mode_problem() -> str | None:
    """What is wrong with KVSPEC_CHECKS, or None: a value that is not one of CHECKS_MODES
    (a typo such as NAIVE would otherwise run the incremental checks without a word)."""
    value = os.environ.get("KVSPEC_CHECKS", "")
    if value in ("", *CHECKS_MODES):
        return None
    return (f"KVSPEC_CHECKS={value!r} is not a way of checking; set it to {' or '.join(CHECKS_MODES)} "
            f"(lower case), or unset it for the default, incremental")


def leak_clauses(full_pages_leaked: int, swa_pages_leaked: int) -> list[str]:
    """[I2, I3] The conservation clause of each pool that leaked."""
    return ["I2"] * (full_pages_leaked > 0) + ["I3"] * (swa_pages_leaked > 0)


class Checks:
    """The invariants a driver runs after every step: every registered one that reads its
    snapshot type (kvspec.spec.registry; one of another memory model does not apply and
    is not counted), less those that read an observable the adapter does not show, which
    are skipped (counted, never passed).

    Incrementally by default (incremental.py): a check whose certificate shows that it
    finds nothing does not walk the snapshot; every other runs as the spec writes it.
    `incremental=False`, or KVSPEC_CHECKS=naive in the environment (a check's workers
    inherit it), runs every check as the spec writes it."""

    def __init__(self, snapshot_type: type, observables: Iterable[str], incremental: bool | None = None):
        if incremental is None:
            if problem := checks_mode_problem():
                raise ValueError(problem)
            incremental = os.environ.get("KVSPEC_CHECKS") != "naive"
        self.certificates = Certificates() if incremental else None
        self.counted: dict[bool, tuple[Counter, Counter]] = {}
        self.clauses_run: dict[bool, frozenset[str]] = {}
        observables = frozenset(observables)
        checks = applicable(snapshot_type)
        self.run = tuple(check for check in checks if check.reads <= observables)
        self.skipped = tuple((check, f"adapter lacks observable {', '.join(sorted(check.reads - observables))}")
                             for check in checks if not check.reads <= observables)

    def counts(self, compared: bool) -> tuple[Counter, Counter]:
        """Per invariant class, the checks that run and those skipped after a step (compared:
        one with a previous snapshot), counted once."""
        if compared not in self.counted:
            applies = [check for check in self.run if compared or not check.compares_steps]
            skips = [check for check, _ in self.skipped if compared or not check.compares_steps]
            self.counted[compared] = (Counter(c.invariant_class for c in applies),
                                      Counter(c.invariant_class for c in skips))
        return self.counted[compared]

    def clauses(self, compared: bool) -> frozenset[str]:
        """The clauses of the checks that run after a step (compared: one with a previous
        snapshot): what counts() counts, by clause."""
        if compared not in self.clauses_run:
            self.clauses_run[compared] = frozenset(check.clause for check in self.run
                                                   if compared or not check.compares_steps)
        return self.clauses_run[compared]

    def violations(self, tally: "Tally", now, previous=None, step=None) -> list[Violation]:
        """Check `now` (and the step from `previous`, when there is one) with the spec's
        one runner, and count every check that ran or was skipped."""
        checks = self.run
        try:
            if self.certificates is not None:
                checks = [check for check in checks
                          if not (check.compares_steps and previous is None)
                          and not self.certificates.certifies(check, now, previous, step)]
            found = violations(checks, now, previous, step)
        except Exception:  # a check raised: a field of the wrong type names the implementation's fault
            if problem := shape_problem(now):
                raise ImplementationCrash(f"the snapshot has a field of the wrong type: {problem}", ["OBS-1"]) from None
            raise
        tally.record(self, previous is not None, found)
        return found


class Tally:
    """Per invariant class: checks run, violated, and skipped for a missing observable; and
    the clauses of the checks that ran (a trace's front matter says what it exercises)."""

    def __init__(self):
        self.checked, self.violated, self.skipped = Counter(), Counter(), Counter()
        self.skipped_because: dict[str, str] = {}
        self.clauses: set[str] = set()

    def record(self, checks: Checks, compared: bool, violations: list[Violation]):
        checked, skipped = checks.counts(compared)
        self.checked.update(checked)
        self.clauses |= checks.clauses(compared)
        if violations:
            broken = {v.clause for v in violations}
            for check in checks.run:
                if (compared or not check.compares_steps) and check.clause in broken:
                    self.violated[check.invariant_class] += 1
        if skipped:
            self.skipped.update(skipped)
            for check, because in checks.skipped:
                if compared or not check.compares_steps:
                    self.skipped_because[check.invariant_class] = because

    def skip(self, invariant_class: str, because: str) -> None:
        """A check of this class that a step would have needed, not run."""
        self.skipped[invariant_class] += 1
        self.skipped_because[invariant_class] = because

    def merge(self, other: "Tally") -> None:
        self.checked.update(other.checked)
        self.clauses |= other.clauses
        self.violated.update(other.violated)
        self.skipped.update(other.skipped)
        self.skipped_because.update(other.skipped_because)

    def as_rows(self) -> dict[str, tuple[int, int, int]]:
        return {c: (self.checked[c], self.violated[c], self.skipped[c]) for c in INVARIANT_CLASSES
                if self.checked[c] or self.skipped[c]}
