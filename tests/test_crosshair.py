"""CrossHair really checks the spec's contracts: it finds the counterexample in a seeded
bug (so the `crosshair check` step of CI can fail), and it finds none in a sound copy."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[1] / "spec"


def crosshair(target: str, seconds: int = 4) -> subprocess.CompletedProcess:
    # run beside the copy, so that `spec` imports the seeded copy, not this checkout's
    return subprocess.run([sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316",
                           f"--per_condition_timeout={seconds}", target], capture_output=True, text=True,
                          cwd=Path(target).parent.parent)


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


BOUNDED = "    pre: page_size <= 8 and window <= 16 and up_to <= 64\n"


def bounded_checkpoint(spec_copy: Path, versions: str) -> str:
    """checkpoint_eviction's I10 contract, over small bounded configurations (so the
    symbolic search is decisive within seconds) and the given versions."""
    target = seed(spec_copy, "window.py", "checkpoint_eviction", "    pre: cursor <= cache_protected_len\n",
                  f"    pre: cursor <= cache_protected_len\n{BOUNDED}    pre: version in {versions}\n")
    return target


def test_crosshair_finds_the_insert_window_counterexample_of_drop_margin(spec_copy):
    """[I10] Claim the insert window for drop-margin too: CrossHair finds a checkpoint
    whose new leaf keeps fewer than min(W, E) live tokens, with a window that is not a
    page multiple (WIN-2: unsafe exactly when 1 <= W % P <= P - 2)."""
    seed(spec_copy, "window.py", "promises_insert_window",
         "return version in (SGLANG_0_5_23, DESIGN_MARGIN)", "return True")
    result = crosshair(bounded_checkpoint(spec_copy, "('drop-margin',)"), seconds=60)
    found = re.search(r"checkpoint_eviction\((\d+), (\d+), (\d+), (\d+), (\d+), '([a-z0-9.-]+)'\)", result.stdout)
    assert result.returncode == 1 and found, result.stdout + result.stderr
    window, page_size = int(found[4]), int(found[5])
    assert 1 <= window % page_size <= page_size - 2


def test_crosshair_finds_no_insert_window_counterexample_for_the_promising_versions(spec_copy):
    """[I10] The same bounded search finds nothing for sglang-0.5.23 and design-margin."""
    result = crosshair(bounded_checkpoint(spec_copy, "('sglang-0.5.23', 'design-margin')"), seconds=30)
    assert result.returncode == 0, result.stdout + result.stderr
