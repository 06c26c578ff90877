"""CrossHair really checks the spec's contracts: it finds the counterexample in a seeded
bug (so the `crosshair check` step of CI can fail), and it finds none in a sound copy."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[1] / "spec"


def crosshair(target: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316",
                           "--per_condition_timeout=4", target], capture_output=True, text=True)


@pytest.fixture
def spec_copy(tmp_path) -> Path:
    copy = tmp_path / "spec"
    shutil.copytree(SPEC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def seed(spec_copy: Path, module: str, function: str, old: str, new: str) -> str:
    """Plant a bug in a copy of the spec; the CrossHair target is that one function."""
    path = spec_copy / module
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    line = text[:text.index(f"def {function}(")].count("\n") + 1
    return f"{path}:{line}"


def test_crosshair_finds_a_floor_that_rounds_up(spec_copy):
    path = seed(spec_copy, "pages.py", "floor_page", "return x // page_size * page_size", "return (x + 1) // page_size * page_size")
    result = crosshair(path)
    assert result.returncode == 1 and "floor_page" in result.stdout, result.stdout + result.stderr


def test_crosshair_finds_a_capacity_check_of_one_pool(spec_copy):
    path = seed(spec_copy, "allocator.py", "new_pages_available", "return num_full_pages <= full_free_pages and num_swa_pages <= swa_free_pages",
                "return num_full_pages <= full_free_pages")
    result = crosshair(path)
    assert result.returncode == 1 and "new_pages_available" in result.stdout, result.stdout + result.stderr


def test_crosshair_finds_a_full_page_count_given_to_the_swa_pool(spec_copy):
    path = seed(spec_copy, "allocator.py", "swa_tail_split", "swa_pages=pages_for(swa_tail_len, page_size)",
                "swa_pages=new_pages_for_extend(prefix_len, seq_len, page_size)")
    result = crosshair(path)
    assert result.returncode == 1 and "swa_tail_split" in result.stdout, result.stdout + result.stderr
