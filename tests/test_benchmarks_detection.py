"""benchmarks/detection.py: per zoo mutant, over seeds, how often it is caught, the
seconds to its first counterexample and the shrunk length. The numbers are measured,
never asserted against a clock: these tests check that they are consistent and that the
aggregation over seeds is right."""

import importlib.util
import sys
from pathlib import Path

import pytest
from report_helpers import run_result

from kvspec.adapters.mutants import MUTANTS
from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.reports.model import RunResult
from kvspec.conformance.zoo.zoo import Specimen

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "detection.py"


@pytest.fixture(scope="module")
def detection():
    spec = importlib.util.spec_from_file_location("detection", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("detection", module)
    spec.loader.exec_module(module)
    return module


def silent(*args, **kwargs):
    pass


def test_a_reference_mutant_measured_over_two_seeds(detection, tmp_path):
    after = []
    # shrinking is capped at 10 s to keep the test short; the numbers must be consistent anyway
    [row] = detection.measure(("reference",), [0, 1], workers=1, shrink_seconds=10, progress=silent,
                              only=["mutant-stale-mapping"], traces=str(tmp_path),
                              after_seed=lambda rows, seed, seconds: after.append(seed))
    mutant = MUTANTS["stale-mapping"]
    assert (row["adapter"], row["run"], row["clause"]) == (mutant.name, mutant.exposed_by.label, mutant.clause)
    assert (row["seeds"], row["caught"]) == (2, 2) and after == [0, 1]
    assert [seen["seed"] for seen in row["per_seed"]] == [0, 1]
    assert 0 < row["median_seconds"] <= row["max_seconds"] and not row["upper_bound"]
    assert 1 <= row["median_shrunk_steps"] <= row["max_shrunk_steps"]
    assert row["goal_met"] == (row["median_seconds"] < 10)
    assert (tmp_path / "seed-0").is_dir() and (tmp_path / "seed-1").is_dir()
    assert f"| {mutant.name} | {mutant.exposed_by.label} | 2 of 2 |" in detection.markdown([row])


def specimen(adapter: str) -> Specimen:
    return Specimen("reference", adapter, adapter, Run(4, 6, 4), "I5", "mapping", "")


def caught_after(seconds: float | None, steps: int, run_seconds: float = 20.0) -> RunResult:
    return run_result(Run(4, 6, 4), "violated", 10, 100, run_seconds, ["I5"], "[I5] stale",
                     "t.jsonl", steps, first_failure_seconds=seconds, first_failure_clauses=["I5"])


PASSED = run_result(Run(4, 6, 4), "ok", 300, 15000, 40.0, [])
WRONG_CLASS = run_result(Run(4, 6, 4), "violated", 1, 3, 5.0, ["I2"], "[I2] leak", "t.jsonl", 2,
                        first_failure_seconds=0.1, first_failure_clauses=["I2"])

# per mutant, what each seed (0..3) gives: a miss, a wrong class, and a bug seen at the
# engine's build (no time to the first counterexample) are among them
OUTCOMES = {
    "missed-once": [caught_after(3.0, 4), PASSED, caught_after(5.0, 8), caught_after(4.0, 6)],
    "slow-median": [caught_after(1.0, 2), caught_after(12.0, 3), WRONG_CLASS, caught_after(13.0, 9)],
    "one-slow-seed": [caught_after(2.0, 5), caught_after(1.0, 1), caught_after(30.0, 7), caught_after(1.5, 3)],
    "at-build": [caught_after(None, 0, run_seconds=0.3)] * 4,
    "never": [PASSED] * 4,
    "mostly-missed": [caught_after(1.0, 2), PASSED, PASSED, WRONG_CLASS],
}


def test_the_aggregation_over_seeds(detection, monkeypatch):
    """Median, not mean, minimum or maximum; misses and wrong classes counted out of the
    times; the goal read off the median."""
    chosen = [specimen(adapter) for adapter in OUTCOMES]
    monkeypatch.setattr(detection, "collect", lambda implementations, only: chosen)
    monkeypatch.setattr(detection, "run_zoo", lambda chosen, profile, seed, *args: {
        each: OUTCOMES[each.adapter][seed] for each in chosen})
    rows = {row["adapter"]: row for row in detection.measure(("reference",), [0, 1, 2, 3], workers=1,
                                                               progress=silent)}

    def numbers(adapter):
        row = rows[adapter]
        return (row["caught"], row["seeds"], row["median_seconds"], row["max_seconds"], row["median_shrunk_steps"],
                row["max_shrunk_steps"], row["goal_met"])

    assert numbers("missed-once") == (3, 4, 4.0, 5.0, 6, 8, True)
    assert numbers("slow-median") == (3, 4, 12.0, 13.0, 3, 9, False)  # the wrong class's 0.1 s is not a catch
    assert numbers("one-slow-seed") == (4, 4, 1.75, 30.0, 4.0, 7, True)
    assert numbers("at-build") == (4, 4, 0.3, 0.3, 0, 0, True) and rows["at-build"]["upper_bound"]
    assert numbers("never") == (0, 4, None, None, None, None, False)
    # fast where it was caught, but missed on three seeds of four: the median over every
    # seed is a miss, so the goal is not met
    assert numbers("mostly-missed") == (1, 4, 1.0, 1.0, 2, 2, False)

    table = detection.markdown(list(rows.values()))
    assert "| missed-once | engine P=4 W=6 I=4 | 3 of 4 | 4.0 | 5.0 | 6 | 8 | yes |" in table
    assert "| slow-median | engine P=4 W=6 I=4 | 3 of 4 | 12.0 | 13.0 | 3 | 9 | NO |" in table
    assert "| at-build | engine P=4 W=6 I=4 | 4 of 4 | <= 0.3 | <= 0.3 | 0 | 0 | yes |" in table
    assert "| never | engine P=4 W=6 I=4 | 0 of 4 | - | - | - | - | NO |" in table
    assert "3 of 6 mutants meet the goal" in table


def test_a_half_measured_mutant_shows_one_of_two(detection, monkeypatch):
    """A mutant missed on one of two seeds: caught 1 of 2, its time and goal from the one."""
    chosen = [specimen("flaky")]
    monkeypatch.setattr(detection, "collect", lambda implementations, only: chosen)
    outcomes = [caught_after(11.0, 5), PASSED]
    monkeypatch.setattr(detection, "run_zoo", lambda chosen, profile, seed, *args: {chosen[0]: outcomes[seed]})
    [row] = detection.measure(("reference",), [0, 1], workers=1, progress=silent)
    assert (row["caught"], row["seeds"], row["median_seconds"], row["goal_met"]) == (1, 2, 11.0, False)
    assert "| flaky | engine P=4 W=6 I=4 | 1 of 2 | 11.0 | 11.0 | 5 | 5 | NO |" in detection.markdown([row])
