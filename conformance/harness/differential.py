"""Differential mode: every step on the implementation and on the reference, side by
side; the observables the spec fixes (OBS-3: outcomes, free page counts, per-request
lengths, prefix matches and SWA cursors, never slot ids) must agree after each step."""

from typing import Any

from .checks import ImplementationCrash, InvariantViolation, StepFailure
from .replay import mismatch
from .trace import TraceStep


class ComparedFailure(ImplementationCrash):
    """The adapter compared against failed a step itself (its invariants are checked too):
    a finding about that adapter, not about the implementation; its trace replays on it."""


class DifferentialDriver:
    """A tier's driver that also applies each step to the driver of the adapter named
    `against` (the reference by default)."""

    def __init__(self, driver, reference_driver, against: str = "reference"):
        self.driver = driver
        self.reference = reference_driver
        self.against = against

    def apply(self, step: TraceStep) -> dict[str, Any]:
        observed = self.driver.apply(step)
        try:
            expected = self.reference.apply(step)
        except StepFailure as failure:
            whose = ("the reference itself failed (a kvspec bug, please report it)" if self.against == "reference" else
                     f"the adapter compared against, {self.against}, failed itself (its finding, not the implementation's)")
            raise ComparedFailure(f"{whose} on {step}: {failure}", failure.clauses) from failure
        if difference := mismatch(expected, observed):
            raise InvariantViolation(f"after {step} the implementation and the reference differ: {difference}",
                                     ["OBS-3"])
        return observed

    def __getattr__(self, name: str):
        return getattr(self.driver, name)  # the machine reads the implementation's side
