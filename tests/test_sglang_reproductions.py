"""The standalone reproductions of SGLang's bugs (vectors/reproductions/sglang/, written by
`python -m kvspec.adapters.sglang.releases reproduce`, adapters/sglang/releases/reproduce.py):
each committed file is what the command writes today from the trace and member its docstring
names, it imports nothing of kvspec's, and run as a maintainer runs it (`PYTHONPATH=<release
folder> python FILE.py`, in a process of its own) it fails with an AssertionError on the release
with the bug and exits 0 on the release that fixed it.

A release that is not installed skips its runs (a failure under CI's
KVSPEC_REQUIRE_SGLANG_RELEASES=1, as in tests/test_sglang_releases.py)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.adapters.sglang.releases import environment
from kvspec.adapters.sglang.releases.reproduce import CHECKS, fixed_member

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "vectors" / "reproductions" / "sglang"
REQUIRED = os.environ.get("KVSPEC_REQUIRE_SGLANG_RELEASES") == "1"

REPRODUCTIONS = {
    # file: (the release it fails on, the release it passes on or None where no release fixed it,
    #        what fails there: the file's check, or SGLang's own assertion)
    "grouped-swa-free-remap.py": ("0.5.18", "0.5.19", "check_tree_is_allocated"),
    "decode-eviction-phase.py": ("0.5.17", "0.5.18", "check_window_bound"),
    "decode-eviction-phase-margin.py": ("0.5.14", "0.5.15", "check_window_bound"),
    "decode-eviction-phase-chunk.py": ("0.5.17", "0.5.18", "check_window_bound"),  # the chunk cache
    "revive-frees-locked-full.py": ("0.5.14", "0.5.15", "check_rows_are_allocated"),
    "checkpoint-short-rematch.py": ("0.5.22", "0.5.23", "check_one_owner"),
    "checkpoint-short-rematch-finish.py": ("0.5.22", "0.5.23", "check_drained"),
    "checkpoint-short-rematch-assert.py": ("0.5.22", "0.5.23", "SGLang"),
    "checkpoint-short-rematch-pd.py": ("0.5.22", "0.5.23", "check_one_owner"),  # reached by a PD admission
    # not fixed in any release; its Rust tree core is checked by test_the_pd_tail_shows_on_the_rust_core_too
    "pd-tail-not-rounded.py": ("0.5.23", None, "check_checkpoint_matches"),
    # 0.5.20 calls the lock another name: the trace written for 0.5.20 passes there (the finding's fix_calls_differ)
    "pd-swa-lock-released-twice.py": ("0.5.19", "0.5.20", "check_swa_locks_held"),
    # the same on the Rust core, whose tree cannot be walked: a later checkpoint's match trips SGLang's assertion
    "pd-swa-lock-released-twice-rust.py": ("0.5.19", "0.5.20", "SGLang"),
}


def require_release(release):
    if not environment.installed(release):
        if REQUIRED:
            pytest.fail(f"SGLang {release} is not installed: {environment.install_command(release)}")
        pytest.skip(f"SGLang {release} is not installed: {environment.install_command(release)}")


def written_from(path: Path) -> tuple[str, str]:
    """(trace, member) that the file's docstring says it was written from."""
    text = " ".join(path.read_text().split())
    found = re.search(r"from the trace (\S+) \(`python -m kvspec\.adapters\.sglang\.releases reproduce TRACE "
                      r"--member (\S+) --out", text)
    assert found, f"{path.name} does not say what it was written from"
    return found[1], found[2]


def run(path: Path, release: str) -> subprocess.CompletedProcess:
    """The file as a maintainer runs it: the release's folder on PYTHONPATH and nothing else of
    kvspec's (torch and the rest are the interpreter's own site-packages)."""
    env = {**os.environ, "PYTHONPATH": str(environment.folder(release))}
    return subprocess.run([sys.executable, path.name], cwd=path.parent, env=env, check=False, capture_output=True, text=True,
                          timeout=600)


def last_error(done: subprocess.CompletedProcess) -> str:
    return next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")


def test_every_committed_reproduction_is_listed_and_every_check_catches_a_real_bug():
    assert sorted(path.name for path in FOLDER.glob("*.py")) == sorted(REPRODUCTIONS)
    fired = {expected for _, _, expected in REPRODUCTIONS.values()}
    assert {check.function for check in CHECKS} <= fired, "a check of reproduce.CHECKS that no real bug fails"


def test_what_the_command_cannot_write_is_exit_2_with_the_reason(tmp_path):
    vector = ROOT / "vectors" / "regressions" / "sglang" / "grouped-swa-free-remap.jsonl"
    allocator_trace = next((ROOT / "vectors" / "conformance" / "allocator").rglob("*.jsonl"))
    state_trace = next((ROOT / "vectors" / "conformance" / "engine" / "two-pool-state").rglob("*.jsonl"))
    nowhere = {**os.environ, "KVSPEC_SGLANG_RELEASES": str(tmp_path)}
    for trace, member, says, env in (
            (vector, "sglang@0.5.99", "no member of the sglang@ family", os.environ),
            (allocator_trace, "sglang@0.5.18", "engine-tier trace; this one is allocator-tier", os.environ),
            (state_trace, "sglang@0.5.23", "a trace with recurrent state is not written as a reproduction", os.environ),
            (tmp_path / "missing.jsonl", "sglang@0.5.18", "missing.jsonl", os.environ),
            (vector, "sglang@0.5.18", "SGLang 0.5.18 is not installed", nowhere)):
        done = subprocess.run([sys.executable, "-m", "kvspec.adapters.sglang.releases", "reproduce", str(trace),
                               "--member", member, "--out", str(tmp_path / "out.py")], cwd=ROOT, env=env,
                              check=False, capture_output=True, text=True, timeout=600)
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert not (tmp_path / "out.py").exists()


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_a_reproduction_imports_sglang_torch_and_the_standard_library_only(name):
    """transformers: SGLang's own dependency, patched up to 0.5.19 so that SGLang imports beside it;
    torchvision: tried, and stood in for where it is missing."""
    tree = ast.parse((FOLDER / name).read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules - set(sys.stdlib_module_names) <= {"sglang", "torch", "transformers", "torchvision"}, modules


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_a_reproduction_is_what_the_command_writes_from_its_trace(name, tmp_path):
    trace, member = written_from(FOLDER / name)
    require_release(member.removeprefix("sglang@").split("-")[0].split("+")[0])
    out = tmp_path / name
    done = subprocess.run([sys.executable, "-m", "kvspec.adapters.sglang.releases", "reproduce", trace,
                           "--member", member, "--out", str(out)], cwd=ROOT, check=False, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_text() == (FOLDER / name).read_text(), \
        f"{name} is not what the command writes today: regenerate it (its docstring has the command)"


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_a_reproduction_fails_where_its_bug_shipped(name):
    affected, _, expected = REPRODUCTIONS[name]
    require_release(affected)
    done = run(FOLDER / name, affected)
    error = last_error(done)
    assert done.returncode != 0 and error.startswith("AssertionError"), done.stdout + done.stderr[-3000:]
    if expected == "SGLang":  # SGLang's own assertion, raised inside SGLang
        assert "after step" not in error and "sglang" in done.stderr.rsplit("Traceback", 1)[-1]
    else:  # the file's own check, in plain words
        assert f"in {expected}" in done.stderr and "after step" in error, done.stderr[-3000:]


@pytest.mark.parametrize("name", sorted(name for name, (_, fixed, _) in REPRODUCTIONS.items() if fixed))
def test_a_reproduction_passes_where_its_bug_is_fixed(name, tmp_path):
    """Where the fixing release calls what the adapter plays differently (the docstring says
    so), the same trace written for it must pass there."""
    _, fixed, _ = REPRODUCTIONS[name]
    require_release(fixed)
    path = FOLDER / name
    if "the same trace written for it" in " ".join(path.read_text().split()):
        trace, member = written_from(path)
        path = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "kvspec.adapters.sglang.releases", "reproduce", trace,
                               "--member", fixed_member(member, fixed), "--out", str(path)], cwd=ROOT, check=False,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    done = run(path, fixed)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip().endswith(f"SGLang {fixed}: every check held")


def test_the_pd_tail_shows_on_the_rust_core_too(tmp_path):
    """kvspec's I10 reads the Python tree, and the Rust core offers no walk of its nodes; the
    reproduction's check is SGLang's own prefix match, which the Rust core answers: written for
    0.5.23's default (Rust) tree, the same trace fails the same way."""
    require_release("0.5.23")
    trace, _ = written_from(FOLDER / "pd-tail-not-rounded.py")
    out = tmp_path / "pd-tail-not-rounded-rust.py"
    done = subprocess.run([sys.executable, "-m", "kvspec.adapters.sglang.releases", "reproduce", trace,
                           "--member", "sglang@0.5.23", "--out", str(out)], cwd=ROOT, check=False, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'tree_core_backend="rust"' in out.read_text()
    done = run(out, "0.5.23")
    assert done.returncode != 0 and "a match of them finds 0" in last_error(done), done.stderr[-3000:]
