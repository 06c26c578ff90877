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
