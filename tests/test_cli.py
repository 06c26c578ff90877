"""The `kvspec` command: the main job of the README, and its exit statuses."""

import subprocess
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def kvspec(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], capture_output=True, text=True, cwd=cwd)


def test_check_of_the_reference_passes_with_a_summary_table():
    result = kvspec("check", "--adapter", "reference", "--profile", "quick", "--seed", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "allocator P=16" in result.stdout and "engine P=4 W=6 I=4" in result.stdout
    assert "VIOLATED" not in result.stdout


def test_usage_errors_exit_2_with_a_message():
    unknown = kvspec("check", "--adapter", "no-such-engine")
    assert unknown.returncode == 2 and "unknown adapter 'no-such-engine'" in unknown.stderr
    assert kvspec("check", "--profile", "forever").returncode == 2
    assert kvspec().returncode == 2


def test_a_buggy_adapter_loaded_by_module_and_attribute_exits_1(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    result = kvspec("check", "--adapter", "sample_adapters:LEAKY", "--run", "allocator P=4", "--seed", "1",
                    cwd=tmp_path)  # its counterexample trace is saved in kvspec-traces/ there
    assert result.returncode == 1, result.stdout + result.stderr
    assert "VIOLATED" in result.stdout and "[I2]" in result.stdout + result.stderr
    assert (tmp_path / "kvspec-traces" / "sample-adapters-leaky-allocator-p-4.jsonl").exists()


def test_an_adapter_missing_operations_exits_2_naming_them(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    result = kvspec("check", "--adapter", "sample_adapters:INCOMPLETE", "--profile", "quick")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "lacks available_sizes, alloc, alloc_extend" in result.stderr


def test_the_seed_decides_the_run_under_ci_true_too():
    """CI=true makes Hypothesis' own `ci` profile the default, which derandomizes: kvspec's
    profiles must not inherit that, or --seed and the zoo's seeds would do nothing in CI."""
    import os
    import sys

    probe = "from kvspec.conformance.harness.profiles import PROFILES, profile; print([profile(p).derandomize for p in PROFILES])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env={**os.environ, "CI": "true"})
    assert result.stdout.strip() == "[False, False, False]", result.stdout + result.stderr


def test_an_example_database_shared_between_checks_finds_a_known_failure_first(tmp_path):
    """`--example-database DIR` (the history matrix's shards share one): the second check
    replays the saved failure before generating anything new."""
    def run(seed: str):
        return kvspec("check", "--adapter", "mutant-frontier-max-window-page", "--run", "engine P=4 W=6", "--seed",
                      seed, "--shrink-seconds", "5", "--example-database", str(tmp_path / "examples"),
                      "--traces", str(tmp_path))

    first = run("3")
    assert first.returncode == 1 and any((tmp_path / "examples").iterdir()), first.stdout + first.stderr
    second = run("4")
    assert second.returncode == 1, second.stdout + second.stderr
    assert "VIOLATED I10" in second.stdout
    examples = int(next(line for line in second.stdout.splitlines() if line.startswith("engine P=4 W=6")).split()[4])
    assert examples <= 3, second.stdout


def test_option_seconds_must_be_positive_and_finite():
    for value in ("0", "-1", "nan", "inf", "soon"):
        result = kvspec("check", "--shrink-seconds", value)
        assert result.returncode == 2 and "--shrink-seconds" in result.stderr, value


def test_shrinking_stopped_at_our_budget_prints_no_hypothesis_warning(tmp_path):
    """Hypothesis warns "more than five minutes ... PLEASE REPORT THIS" whenever shrinking
    stops at MAX_SHRINKING_SECONDS; the budget is kvspec's and the report says so instead."""
    result = kvspec("check", "--adapter", "mutant-no-copy-on-hit", "--run", "engine+state P=1 W=3", "--seed", "0",
                    "--profile", "quick", "--shrink-seconds", "1", "--traces", str(tmp_path))
    assert result.returncode == 1 and "stopped at its 1 s budget" in result.stdout, result.stdout + result.stderr
    assert "five minutes" not in result.stdout + result.stderr
