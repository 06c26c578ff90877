"""RunResults for the tests of reports and tables, described as the plan describes a run."""

from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.reports.model import RunResult
from kvspec.conformance.runs.plan import PlannedRun, Target
from kvspec.spec.models import TWO_POOL
from kvspec.spec.window import SGLANG_0_5_23


def run_result(run: Run, verdict: str, *args, **fields) -> RunResult:
    """A RunResult of `run` at the reference's own version, labelled and described by its plan."""
    planned = PlannedRun(run, Target(SGLANG_0_5_23, TWO_POOL, frozenset(), frozenset()), run.label)
    return RunResult(planned.label, str(run.tier), verdict, *args, run=planned.description, **fields)


def description(run: Run) -> dict:
    """What a RunResult's `run` holds for `run` at the reference's own version."""
    return run_result(run, "ok", 0, 0, 0.0, []).run
