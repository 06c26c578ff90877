"""`kvspec zoo`: a caught mutant passes, a missed one or one caught by another class fails
the zoo, its table and JSON say which. (That every mutant is caught at the ci profile is
CI's `kvspec zoo` run and tests/test_mutants.py.)"""

import json
import subprocess

import jsonschema
import pytest
from report_helpers import run_result

from kvspec.adapters.mutants import MUTANTS
from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.reports.model import RunResult
from kvspec.conformance.zoo.zoo import Specimen, caught, run_zoo, table, to_json, validate_json, verdict


def kvspec(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], capture_output=True, text=True, cwd=cwd, check=False)


def test_a_caught_mutant_passes_the_zoo_with_a_table_and_valid_json(tmp_path):
    result = kvspec("zoo", "--implementation", "reference", "--only", "mutant-stale-mapping", "--profile", "quick",
                    "--json", str(tmp_path / "zoo.json"), "--traces", str(tmp_path / "traces"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 of 1 caught" in result.stdout and "I5 (mapping)" in result.stdout
    document = json.loads((tmp_path / "zoo.json").read_text())
    validate_json(document)
    [mutant] = document["mutants"]
    assert mutant["caught"] and mutant["detected_classes"] == ["mapping"]
    assert mutant["run"]["trace_steps"] >= 1 and (tmp_path / "traces").is_dir()


def specimen(adapter: str, invariant_class: str, clause: str, run: Run) -> Specimen:
    return Specimen("reference", adapter, adapter, run, clause, invariant_class, "")


def test_a_passing_mutant_and_a_wrongly_classed_one_fail_the_zoo(tmp_path):
    stale = MUTANTS["stale-mapping"]
    passes = specimen("reference", "mapping", "I5", stale.exposed_by)  # the unmodified reference: nothing to catch
    wrong = specimen(stale.name, "leak", "I2", stale.exposed_by)  # caught, but by mapping, not leak
    results = run_zoo([passes, wrong], "quick", 0, str(tmp_path), workers=2, step_timeout=60,
                      progress=lambda *args, **kwargs: None)
    assert not caught(passes, results[passes]) and verdict(passes, results[passes]) == "MISSED (the run passed)"
    assert not caught(wrong, results[wrong]) and verdict(wrong, results[wrong]).startswith("WRONG CLASS (mapping")
    assert "0 of 2 caught" in table(results)
    validate_json(to_json(results, "quick", 0, "2026-11-30T00:00:00Z", 1.0))


def test_a_zoo_document_of_any_registered_implementation_validates(tmp_path):
    """The report names whose code a bug is seeded in: any family's implementation, a compiled
    engine's (TokenSpeed's seeded build) or a package's own, not a fixed list (CI's
    TokenSpeed zoo failed on one)."""
    stale = MUTANTS["stale-mapping"]
    results = run_zoo([specimen(stale.name, "mapping", "I5", stale.exposed_by)], "quick", 0, str(tmp_path),
                      workers=1, step_timeout=60, progress=lambda *args, **kwargs: None)
    document = to_json(results, "quick", 0, "2026-11-30T00:00:00Z", 1.0)
    for implementation in ("tokenspeed", "an-engine-of-its-own"):
        document["mutants"][0]["implementation"] = implementation
        validate_json(document)
    document["mutants"][0]["implementation"] = ""
    with pytest.raises(jsonschema.ValidationError):
        validate_json(document)


def test_a_malformed_zoo_document_is_rejected():
    with pytest.raises(jsonschema.ValidationError):
        validate_json({"schema": "https://kvspec.dev/schemas/zoo/2", "mutants": []})


def test_an_unknown_mutant_is_a_usage_error_naming_the_mutants():
    result = kvspec("zoo", "--implementation", "reference", "--only", "no-such-bug")
    assert result.returncode == 2
    assert "no mutant matches --only no-such-bug" in result.stderr and "mutant-stale-mapping" in result.stderr


def test_a_crash_mutant_is_caught_only_by_a_crash_showing_its_message():
    crash = Specimen("reference", "mutant-x", "x", Run(4), "ALLOC-2", "crash", "", "OutOfMemory")

    def result(verdict: str, message: str, clauses=()) -> RunResult:
        return run_result(Run(4), verdict, 1, 1, 0.1, list(clauses), message)

    assert caught(crash, result("crashed", "TypeError: 'OutOfMemory' object is not subscriptable"))
    assert verdict(crash, result("crashed", "KeyError: 3")) == "WRONG CRASH (without 'OutOfMemory')"
    assert verdict(crash, result("violated", "[I2] a leak", ["I2"])) == "WRONG CLASS (leak, expected crash)"
