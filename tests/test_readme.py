"""The README's two commands stay true: CI runs the test one verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_exactly_two_commands():
    main_job, tests = readme_commands()[:2]
    assert "kvspec check --adapter reference" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    tests = readme_commands()[1]
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
