"""TokenSpeed's scheduler with kvspec's seeded bugs (adapters/tokenspeed: bugs.py, builds.py,
patches/seeded-bugs.diff).

Without the build: the bug list and the patch agree (every slug, every changed line),
the build's name follows its inputs, a rebuild rewrites only what the patch changed, and
a missing build is a clear error.

With the build (`python -m kvspec.adapters.tokenspeed.builds install`) and the pinned
wheel: for each seeded bug, a scenario of tests/tokenspeed_scenarios.py, each run in its
own process, shows the bug's observable difference on the raw scheduler API: the bug
switched on shows it, while the pinned wheel and the patched build with every switch off
observe exactly the same as each other and do not. The build with every switch off also
keeps every fact of tests/test_tokenspeed_semantics.py. Skipped when either is missing,
unless KVSPEC_REQUIRE_TOKENSPEED_BUILDS=1, which turns the skip into a failure.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.adapters.tokenspeed import bugs, builds

TESTS = Path(__file__).parent
REQUIRED = os.environ.get("KVSPEC_REQUIRE_TOKENSPEED_BUILDS") == "1"
PATCH = builds.PATCHES / "seeded-bugs.diff"


# -- the bug list, the patch and the build's bookkeeping (no build needed) -------------------------


def test_every_seeded_bug_is_a_switch_of_the_patch_in_the_same_order():
    header = PATCH.read_text()
    assert re.findall(r'^\+    \{Bug::k\w+, "([a-z-]+)"\},$', header, re.M) == list(bugs.BY_SLUG)
    for bug in bugs.BUGS:
        assert bug.clause in {f"SCHED-{n}" for n in range(2, 9)}, bug.slug
        assert bug.breaks and bug.observed and bug.analogy


def changed_lines(diff: str) -> dict[str, set[int]]:
    """{file: the lines of 0.1.42 the diff removes or replaces}."""
    changed, path, line = {}, None, 0
    for text in diff.splitlines():
        if text.startswith("--- "):
            path = None if text == "--- /dev/null" else text.removeprefix("--- a/")
        elif hunk := re.match(r"@@ -(\d+)", text):
            line = int(hunk[1])
        elif path and text.startswith("-") and not text.startswith("---"):
            changed.setdefault(path, set()).add(line)
            line += 1
        elif path and not text.startswith("+"):
            line += 1
    return changed


def test_each_bug_names_the_one_line_of_0_1_42_its_switch_changes():
    changed = changed_lines(PATCH.read_text())
    sites = {}
    for bug in bugs.BUGS:
        path, line = re.match(r"(\S+):(\d+) ", bug.site).groups()
        assert int(line) in changed.get(path, set()), f"{bug.slug}: the patch does not change {path}:{line}"
        sites[(path, int(line))] = bug.slug
    # besides the bugs' lines the patch changes no line of 0.1.42: it only adds (includes, the
    # switch's header and its reading, the bindings that name the switches)
    assert {(path, line) for path, lines in changed.items() for line in lines} == set(sites)


def test_select_sets_the_variable_and_refuses_an_unknown_bug(monkeypatch):
    monkeypatch.delenv(bugs.VARIABLE, raising=False)
    bugs.select("hit-window-one-block-short")
    assert os.environ[bugs.VARIABLE] == "hit-window-one-block-short"
    bugs.select(None)
    assert bugs.VARIABLE not in os.environ
    with pytest.raises(ValueError, match="not a seeded bug.*known: window-release-one-token-early"):
        bugs.select("window-release")


def test_the_build_name_follows_every_input(monkeypatch, tmp_path):
    name = builds.build_name()
    assert name.startswith(f"{builds.VERSION}-seeded-") and name == builds.build_name()
    edited = tmp_path / "patches"
    edited.mkdir()
    (edited / PATCH.name).write_text(PATCH.read_text() + "\n")
    monkeypatch.setattr(builds, "PATCHES", edited)
    assert builds.build_name() != name
    monkeypatch.setattr(builds, "PATCHES", builds.HERE / "patches")
    monkeypatch.setattr(builds, "interpreter", lambda: "cpython-39-armv7l")
    assert builds.build_name() != name


def test_a_rebuild_rewrites_only_the_files_the_patch_changed(tmp_path):
    fresh, tree = tmp_path / "fresh", tmp_path / "tree"
    for root in (fresh, tree):
        (root / "csrc").mkdir(parents=True)
        (root / "csrc" / "same.h").write_text("kept\n")
    (fresh / "csrc" / "edited.cpp").write_text("new\n")
    (tree / "csrc" / "edited.cpp").write_text("old\n")
    (tree / "csrc" / "gone.h").write_text("dropped from the patch\n")
    (tree / "build").mkdir()
    (tree / "build" / "x.o").write_text("object\n")
    os.utime(tree / "csrc" / "same.h", (1, 1))
    changed = builds.sync(fresh, tree)
    assert sorted(changed) == ["csrc/edited.cpp", "csrc/gone.h"]
    assert (tree / "csrc" / "edited.cpp").read_text() == "new\n" and not (tree / "csrc" / "gone.h").exists()
    assert (tree / "csrc" / "same.h").stat().st_mtime == 1  # untouched: ninja keeps its object
    assert (tree / "build" / "x.o").is_file()


def test_a_missing_build_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("KVSPEC_TOKENSPEED_BUILDS", str(tmp_path))
    assert not builds.installed()
    with pytest.raises(builds.BuildNotInstalled, match=r"python -m kvspec\.adapters\.tokenspeed\.builds install"):
        builds.activate()


def test_a_replaced_sdist_is_refused_and_deleted(monkeypatch, tmp_path):
    monkeypatch.setenv("KVSPEC_TOKENSPEED_BUILDS", str(tmp_path))
    (tmp_path / "sdist").mkdir()
    (tmp_path / "sdist" / builds.SDIST).write_bytes(b"not the sdist")
    with pytest.raises(builds.BuildError, match="not the c39667f8"):
        builds.fetch(Path(sys.executable), tmp_path / "log")
    assert not (tmp_path / "sdist" / builds.SDIST).exists()


# -- the seeded bugs on the real build --------------------------------------------------------------

@pytest.fixture
def build():
    """Skips (fails under KVSPEC_REQUIRE_TOKENSPEED_BUILDS=1) without the build and the pinned wheel."""
    if not (builds.installed() and importlib.util.find_spec("tokenspeed_scheduler") is not None):
        missing = (f"TokenSpeed's patched build or the pinned wheel is missing: `{builds.INSTALL_COMMAND}` and "
                   f"`pip install --no-deps -r adapters/tokenspeed/requirements.txt`")
        (pytest.fail if REQUIRED else pytest.skip)(missing)


needs_build = pytest.mark.usefixtures("build")


def observe(scenario: str, build: str, bug: str | None = None) -> dict:
    environment = {key: value for key, value in os.environ.items()
                   if key not in (bugs.VARIABLE, builds.ACTIVE, "PYTHONPATH")}
    if bug is not None:
        environment[bugs.VARIABLE] = bug
    done = subprocess.run([sys.executable, str(TESTS / "tokenspeed_scenarios.py"), scenario, "--build", build],
                          capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    observed = json.loads(done.stdout.splitlines()[-1])
    in_build = observed.pop("module").startswith(str(builds.folder()))
    assert in_build == (build == "seeded"), f"the {build} run imported the wrong tokenspeed_scheduler"
    assert observed.pop("active_bug") == (None if build == "pinned" else bug or "")
    return observed


def contrast(scenario: str, bug: str) -> dict:
    """What `bug` shows in `scenario`, after checking that the pinned wheel and the
    patched build with no bug switched on observe the same (returned as "pinned")."""
    pinned = observe(scenario, "pinned")
    assert observe(scenario, "seeded") == pinned, "the patched build, every switch off, differs from 0.1.42"
    return {"pinned": pinned, "seeded": observe(scenario, "seeded", bug)}


@needs_build
def test_the_build_switches_off_is_0_1_42_for_every_measured_fact():
    environment = {key: value for key, value in os.environ.items() if key not in (bugs.VARIABLE, builds.ACTIVE)}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(builds.folder()), os.environ.get("PYTHONPATH")]))
    environment["KVSPEC_REQUIRE_TOKENSPEED"] = "1"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", str(TESTS / "test_tokenspeed_semantics.py")],
                          capture_output=True, text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"\b60 passed\b", done.stdout), done.stdout[-500:]


@needs_build
def test_the_build_knows_exactly_the_listed_bugs_and_refuses_others():
    probe = ("from kvspec.adapters.tokenspeed import builds; builds.activate(); import tokenspeed_scheduler as ts\n"
             "print(ts._ext.kvspec_seeded_bugs())\n"
             "c = ts.SchedulerConfig(); c.cache_groups = [ts.CacheGroupConfig('full', 4, 8, ts.AttnKind.Full)]\n"
             "c.num_device_pages, c.max_scheduled_tokens, c.prefix_granularity, c.num_snapshot_pages = 8, 8, 4, 1\n"
             "ts.Scheduler(c)\n")
    environment = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, bugs.VARIABLE: "no-such-bug"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=environment)
    assert done.stdout.strip() == repr(list(bugs.BY_SLUG))
    assert "ValueError: KVSPEC_TOKENSPEED_BUG=no-such-bug names no seeded bug of this build" in done.stderr


@needs_build
def test_window_release_one_token_early_frees_a_page_the_window_reads():
    seen = contrast("window", "window-release-one-token-early")
    assert seen["pinned"] == {"holes": [], "release": []}
    # from p = 42 (p - W + 1 = 36, a page boundary) on every fourth decode row reads a null entry
    assert seen["seeded"]["holes"][:3] == [[42, [8]], [46, [9]], [50, [10]]]
    assert [42, 9, 8] in seen["seeded"]["release"]  # and one more leading null than due


@needs_build
def test_decode_skips_window_release_keeps_a_page_past_the_window():
    seen = contrast("window", "decode-skips-window-release")
    assert seen["pinned"] == {"holes": [], "release": []}
    assert seen["seeded"]["holes"] == []  # nothing read is missing: the page is released late
    assert seen["seeded"]["release"][:3] == [[43, 8, 9], [47, 9, 10], [51, 10, 11]]


@needs_build
def test_hit_window_one_block_short_hands_out_a_hit_whose_window_has_a_hole():
    seen = contrast("hit", "hit-window-one-block-short")
    assert seen["pinned"]["hit"] == 0 and seen["pinned"]["holes"] == []
    assert seen["seeded"]["hit"] == 36 and seen["seeded"]["holes"] == [7]  # tokens 28..31, read by 36's window


@needs_build
def test_empty_result_not_landed_leaks_every_page_of_a_chunked_request():
    seen = contrast("chunked-finish", "empty-result-not-landed")
    assert seen["pinned"] == {"running": 0, "held": 0, "available": 63, "pages": 63, "clear_cache": True}
    seeded = seen["seeded"]
    assert seeded["running"] == 0 and seeded["held"] > 0 and not seeded["clear_cache"]
    assert seeded["available"] + seeded["held"] == 63


@needs_build
def test_available_counts_pinned_cache_counts_pages_twice():
    seen = contrast("accounting", "available-counts-pinned-cache")
    assert set(seen["pinned"]["sums"]) == {63}
    assert max(seen["seeded"]["sums"]) > 63 and seen["seeded"]["sums"][-1] == 63  # right again once nothing runs


@needs_build
def test_admission_refuses_exact_fit_stalls_and_preempts_with_a_page_empty():
    seen = contrast("pressure", "admission-refuses-exact-fit")
    assert seen["pinned"]["starved_with_a_page_empty"] == []
    assert [empty for _, empty, _ in seen["pinned"]["aborts"]] == [0]
    assert seen["seeded"]["starved_with_a_page_empty"]
    assert [empty for _, empty, _ in seen["seeded"]["aborts"]] == [1]


FORKSERVER_SCRIPT = """
import multiprocessing, os, sys
from kvspec.adapters.tokenspeed import bugs, builds


def worker(slug):
    from kvspec.adapters.tokenspeed import runtime as ts  # preloaded: the forkserver's module
    bugs.select(slug)  # in the worker, before the Scheduler is built
    config = ts.SchedulerConfig()
    config.cache_groups = [ts.CacheGroupConfig("full", 4, 8, ts.AttnKind.Full)]
    config.num_device_pages, config.max_scheduled_tokens, config.prefix_granularity = 8, 8, 4
    config.num_snapshot_pages = 1
    ts.Scheduler(config)
    return sys.modules["tokenspeed_scheduler"].__file__, sys.modules["tokenspeed_scheduler"]._ext.kvspec_active_bug()


if __name__ == "__main__":
    builds.activate()  # in the parent, before its forkserver starts
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["kvspec.adapters.tokenspeed.build_preload", "kvspec.adapters.tokenspeed.runtime"])
    with context.Pool(1) as pool:
        print(pool.map(worker, ["admission-refuses-exact-fit", None]))
"""


@needs_build
def test_a_forkserver_worker_imports_the_build_and_selects_its_bug(tmp_path):
    """What an adapter does: activate() in the parent, build_preload before runtime in the
    forkserver's preload, bugs.select() in the worker before it builds the Scheduler."""
    script = tmp_path / "forkserver_probe.py"
    script.write_text(FORKSERVER_SCRIPT)
    environment = {key: value for key, value in os.environ.items()
                   if key not in (bugs.VARIABLE, builds.ACTIVE, "PYTHONPATH")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (first, bug), (second, off) = eval(done.stdout.strip().splitlines()[-1])
    assert first.startswith(str(builds.folder())) and second == first
    assert (bug, off) == ("admission-refuses-exact-fit", "")
