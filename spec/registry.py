"""The one registry of invariants: each declared once, where it is defined, by `@invariant`.

A registered invariant names its clause, its class and the optional observables it
reads (`reads`, a subset of its memory model's observables; what it always reads, the
pool sizes and free counts, goes unsaid). Two things follow from its signature, so they
are never declared twice:

  * which snapshot it reads: the annotation of its parameter `now` (a snapshot type of
    kvspec.spec.models, or a base class of several; the allocator tier's AllocatorView);
  * whether it compares two snapshots: `(previous, step, now)` does, `(now)` does not.

`violations` is the one runner: the reference's own `check_invariants` and the harness
both call it. A snapshot too malformed for a check (an index out of range) is a
violation of that check's clause, never a crash.
"""

import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .notation import Violation


class InvalidInvariant(Exception):
    """An invariant registered wrongly: a mistake of the spec's own code, raised at import."""

INVARIANT_CLASSES = ("alignment", "window-liveness", "window-bound", "leak", "mapping", "ownership", "locks", "atomicity",
                     "state", "scheduling")
"""`state`: a recurrent state that has not read exactly the tokens its holder claims (chapter 09).
`scheduling`: a plan of a scheduler that does what is not due, preempts without need, or
stalls (chapter 10)."""

REGISTERED: list["Invariant"] = []
"""Every invariant, in the order its module registered it (kvspec.spec.invariants imports
them all, in chapter order)."""


@dataclass(frozen=True)
class Invariant:
    """One registered check."""

    clause: str
    invariant_class: str
    function: Callable[..., list[Violation]]
    reads: frozenset[str] = frozenset()
    """The optional observables it reads (kvspec.spec.models.MemoryModel.observables)."""
    snapshot_type: type = field(init=False)
    """What it reads: the annotation of `now`."""
    compares_steps: bool = field(init=False)
    """True for `function(previous, step, now)`, False for `function(now)`."""

    def __post_init__(self):
        # raised, never asserted: under `python -O` a malformed invariant would register silently
        if self.invariant_class not in INVARIANT_CLASSES:
            raise InvalidInvariant(f"unknown invariant class {self.invariant_class!r}; use one of {INVARIANT_CLASSES}")
        parameters = list(inspect.signature(self.function).parameters)
        if parameters not in (["now"], ["previous", "step", "now"]):
            raise InvalidInvariant(f"{self.function.__qualname__}{tuple(parameters)}: an invariant takes (now) or "
                                   f"(previous, step, now)")
        hints = typing.get_type_hints(self.function)
        if not isinstance(hints.get("now"), type):
            raise InvalidInvariant(f"{self.function.__qualname__}: annotate `now` with the snapshot type it reads")
        object.__setattr__(self, "snapshot_type", hints["now"])
        object.__setattr__(self, "compares_steps", len(parameters) == 3)

    def applies_to(self, snapshot_type: type) -> bool:
        """Whether it reads snapshots of this type (a check of another memory model does not)."""
        return issubclass(snapshot_type, self.snapshot_type)

    @property
    def name(self) -> str:
        return self.function.__name__


def invariant(clause: str, invariant_class: str, reads: Iterable[str] = ()):
    """Register the decorated function as an invariant of `clause`, in `invariant_class`."""

    def register(function: Callable[..., list[Violation]]) -> Callable[..., list[Violation]]:
        REGISTERED.append(Invariant(clause, invariant_class, function, frozenset(reads)))
        return function

    return register


def violations(invariants: Iterable[Invariant], now, previous=None, step=None) -> list[Violation]:
    """Every violation the invariants find in `now`, and, for those that compare two
    snapshots, in the step from `previous` (skipped when there is none)."""
    found = []
    for check in invariants:
        if check.compares_steps and previous is None:
            continue
        try:
            found.extend(check.function(previous, step, now) if check.compares_steps else check.function(now))
        except (IndexError, KeyError) as error:
            found.append(Violation(check.clause, f"{check.name} cannot read this snapshot: "
                                                 f"{type(error).__name__}: {error}"))
    return found
