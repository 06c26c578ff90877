"""`kvspec explore`: the check at fresh seeds, every find listed with the command that
reproduces it; CI gates on fixed seeds instead (.ci/run: every check at --seed 0)."""

import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def explore(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", "explore", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def test_explore_lists_every_find_with_the_seed_that_reproduces_it(tmp_path):
    result = explore("--adapter", "mutant-stale-mapping", "--run", "allocator P=4", "--seeds", "2", "--first-seed",
                     "7", "--no-shrink", "--out", "found", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "seeds 7..8" in result.stdout and "2 find(s) over 2 seed(s)" in result.stdout
    for seed in (7, 8):
        report = json.loads((tmp_path / "found" / f"seed-{seed}.json").read_text())
        assert report["seed"] == seed and report["runs"][0]["verdict"] == "violated"
        assert f"again: kvspec check --adapter mutant-stale-mapping --profile quick --seed {seed} " \
               f"--run 'allocator P=4'" in result.stdout
    assert "Triage each" in result.stdout


def test_explore_finds_nothing_on_the_reference_and_picks_a_fresh_seed(tmp_path):
    result = explore("--run", "allocator P=4", "--seeds", "1", "--out", "found", cwd=tmp_path)
    assert result.returncode == 0 and "0 find(s) over 1 seed(s)" in result.stdout, result.stdout + result.stderr
    assert re.search(r"seeds (\d+)\.\.\1 ", result.stdout)


def test_ci_gates_only_on_seeded_checks():
    """Every `kvspec check` and history run of .ci/run names its seed (the zoo's is 0 by default)."""
    ci = (REPO / ".ci" / "run").read_text()
    command = re.compile(r"^\s*(time )?(kvspec check |python -m \S+ history )")
    commands = [line for line in ci.splitlines() if command.search(line)]
    assert commands and all("--seed 0" in line for line in commands), commands
    assert "kvspec zoo" in ci and "--seed" not in [line for line in ci.splitlines() if "kvspec zoo" in line][0]
