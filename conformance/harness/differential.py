"""Differential mode: every step on the implementation and on the reference, side by
side; the observables the spec fixes (OBS-3: outcomes, free page counts, per-request
lengths, prefix matches and SWA cursors, never slot ids) must agree after each step."""

from typing import Any

from .checks import ImplementationCrash, InvariantViolation, StepFailure
from .replay import mismatch
from .trace import TraceStep


class DifferentialDriver:
    """A tier's driver that also applies each step to the reference's driver."""

    def __init__(self, driver, reference_driver):
        self.driver = driver
        self.reference = reference_driver

    def apply(self, step: TraceStep) -> dict[str, Any]:
        observed = self.driver.apply(step)
        try:
            expected = self.reference.apply(step)
        except StepFailure as failure:
            raise ImplementationCrash(f"the reference itself failed on {step} (a kvspec bug, please report it): "
                                      f"{failure}") from failure
        if difference := mismatch(expected, observed):
            raise InvariantViolation(f"after {step} the implementation and the reference differ: {difference}",
                                     ["OBS-3"])
        return observed

    def __getattr__(self, name: str):
        return getattr(self.driver, name)  # the machine reads the implementation's side
