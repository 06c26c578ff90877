"""[I1 .. I16] One long random run of the reference engine: at least 10,000 lifecycle
steps, every invariant checked after each (P = 4, W = 6, I = 4, sglang-0.5.23: the
window is not a page multiple, so retention rounds it up, and decode evicts often).

About 300 examples of up to 50 rules each; a rule that decodes checks every decode step,
and the teardown checks every release. Measured: 14,600 to 15,800 steps in 18-23 s on one
core, so it runs in the default suite.
"""

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.harness.engine_machine import engine_machine
from kvspec.conformance.harness.profiles import profile
from kvspec.spec.window import SGLANG_0_5_23, Policy

STEPS = 10_000


def test_ten_thousand_checked_lifecycle_steps():
    machine = engine_machine(ReferenceEngineAdapter, 4, 6, Policy(SGLANG_0_5_23, 4))
    run_state_machine_as_test(machine, settings=settings(profile("quick"), database=None, max_examples=300,
                                                         stateful_step_count=50))
    assert machine.steps >= STEPS, f"only {machine.steps} checked steps in {machine.examples} examples"
