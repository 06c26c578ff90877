"""Fixtures that more than one test module uses."""

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """The conformance corpus `kvspec vectors` writes now, in a process of its own: written
    inside a test worker it came out different after some of the suite's other tests had
    run there (measured: the committed-vectors test failed in full-suite runs, never
    alone), while the command, in a fresh process, writes the same corpus every time."""
    out = tmp_path_factory.mktemp("vectors") / "corpus"
    result = subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "vectors", "--out", str(out)], check=False,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out
