"""Steering clear of a recorded bug's shape: without `short_leaf_checkpoints`, at a window
where the policy lets a checkpoint leave its new leaf short of a window, the engine
machine ends every prompt and chunk where each checkpoint keeps one, and draws nothing
more (engine_machine.py, `steer_short_leaves`). SGLang 0.5.15 - 0.5.22 lack it: they match
again after such an insert and double-own its pages (adapters/sglang/releases/findings.py,
checkpoint-short-rematch)."""

import pytest
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.declarations import Capability
from kvspec.conformance.harness.engine_machine import ALL, engine_machine
from kvspec.spec.window import (
    DROP_MARGIN,
    MAX_WINDOW_PAGE,
    SGLANG_0_5_23,
    Policy,
    checkpoint_leaves_short_leaf,
)

P, W = 4, 6  # 1 <= W % P <= P - 2: at risk under max-window-page and drop-margin
RUNS = settings(max_examples=40, stateful_step_count=30, database=None, deadline=None, phases=[Phase.generate])


def test_the_ends_whose_checkpoint_leaves_a_short_leaf():
    """From a fresh request at P=4, W=6: max-window-page keeps max(W, P) = 6 before
    `up_to - 1`, so an end one short of a page (19: cursor 12, insert [0, 16), 4 live)
    leaves a short leaf; below a page (W = 2) only drop-margin's retention W does;
    0.5.23's rounded retention never."""
    assert [u for u in range(1, 28) if checkpoint_leaves_short_leaf(u, 0, 0, W, P, MAX_WINDOW_PAGE)] == [11, 15, 19, 23, 27]
    assert [u for u in range(1, 20) if checkpoint_leaves_short_leaf(u, 0, 0, 2, P, DROP_MARGIN)] == [7, 11, 15, 19]
    assert not any(checkpoint_leaves_short_leaf(u, 0, 0, 2, P, MAX_WINDOW_PAGE) for u in range(1, 64))
    assert not any(checkpoint_leaves_short_leaf(u, 0, 0, W, P, SGLANG_0_5_23) for u in range(1, 64))
    assert not any(checkpoint_leaves_short_leaf(u, 0, 0, 8, P, MAX_WINDOW_PAGE) for u in range(1, 64))  # W % P = 0


def run(capabilities, version):
    machine = engine_machine(ReferenceEngineAdapter, P, W, Policy(version, decode_eviction_interval=4), capabilities)
    run_state_machine_as_test(seed(3)(machine), settings=RUNS)


@pytest.mark.parametrize("version", [MAX_WINDOW_PAGE, DROP_MARGIN])
def test_without_the_capability_no_checkpoint_leaves_a_short_leaf(version):
    """Those versions' retention leaves short leaves, which `I10` forbids (the reference run at
    them breaks it, as SGLang's releases would but for their own bug): with the capability
    the runs meet one; without it they pass."""
    with pytest.raises(InvariantViolation, match=r"\[I10\] request r\d+: new leaf with live SWA"):
        run(ALL, version)
    run(ALL - {Capability.SHORT_LEAF_CHECKPOINTS}, version)


def test_the_steering_draws_nothing_where_it_is_off():
    """At a window that is not at risk, the runs with and without the capability make the
    same steps: every other adapter's seeded runs are as they were."""
    def steps(capabilities):
        machine = engine_machine(ReferenceEngineAdapter, P, 8, Policy(MAX_WINDOW_PAGE, decode_eviction_interval=4),
                                 capabilities)
        journal = []
        machine.journal = staticmethod(lambda kind, what: journal.append((kind, str(what))))
        run_state_machine_as_test(seed(5)(machine), settings=settings(RUNS, max_examples=5))
        return journal

    assert steps(ALL) == steps(ALL - {Capability.SHORT_LEAF_CHECKPOINTS})
