"""The `sglang@` family over SGLang's releases (adapters/sglang/releases): which members
exist and what they declare, clear errors for a release that is not installed, the
history table (shards, merge, unexplained violations), and the regression vectors, which
must fail on every release with their bug and pass on every other.

The catalog, the table and the errors need no SGLang. The regression vectors need the
releases installed (`python -m kvspec.adapters.sglang.releases install 0.5.18 0.5.22
0.5.23`); CI installs them and sets KVSPEC_REQUIRE_SGLANG_RELEASES=1, which turns a
missing release into a failure instead of a skip."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from kvspec.adapters.sglang.releases import environment, history
from kvspec.adapters.sglang.releases.catalog import MEMBERS, Release, key
from kvspec.adapters.sglang.releases.findings import FINDINGS, explain
from kvspec.conformance.harness.protocol import AdapterError, load_adapter
from kvspec.spec.window import retention

REQUIRED = os.environ.get("KVSPEC_REQUIRE_SGLANG_RELEASES") == "1"


def test_every_release_from_0_5_14_is_a_member_with_its_default_tree():
    assert environment.RELEASES[0] == "0.5.14" and environment.RELEASES[-1] == "0.5.23"
    assert "0.5.15.post1" in environment.RELEASES
    for release in environment.RELEASES:
        assert release in MEMBERS, release
    assert MEMBERS.members["0.5.14"].tree == "legacy"
    assert MEMBERS.members["0.5.16"].tree == "python"
    assert MEMBERS.members["0.5.21"].tree == "rust"
    assert "0.5.15-python" in MEMBERS and "0.5.16-legacy" not in MEMBERS  # from 0.5.16 nothing builds it
    assert "0.5.18-rust" not in MEMBERS and "0.5.19-rust" in MEMBERS  # the Rust core ships in 0.5.19


def test_each_member_declares_the_retention_its_release_shipped():
    """W + P in 0.5.14, max(W, P) in 0.5.15 - 0.5.22, ceil_page(max(W, P)) in 0.5.23 (WIN-2)."""
    versions = {release: MEMBERS.members[release].policy_version for release in environment.RELEASES}
    assert versions["0.5.14"] == "design-margin"
    assert MEMBERS.members["0.5.14+drop-margin"].policy_version == "drop-margin"
    assert {versions[r] for r in environment.RELEASES[1:-1]} == {"max-window-page"}
    assert versions["0.5.23"] == "sglang-0.5.23"
    assert [retention("max-window-page", w, 4) for w in (3, 4, 6, 8)] == [4, 4, 6, 8]
    assert [retention("sglang-0.5.23", w, 4) for w in (3, 4, 6, 8)] == [4, 4, 8, 8]


def test_knobs_are_members_only_where_the_release_reads_them():
    assert "0.5.14-python+drop-margin" in MEMBERS and "0.5.15-python+drop-margin" not in MEMBERS
    assert "0.5.17+chunk-release" in MEMBERS and "0.5.18+no-chunk-release" in MEMBERS
    assert "0.5.17+no-chunk-release" not in MEMBERS  # already its default
    assert "0.5.14+chunk-release" not in MEMBERS  # the legacy tree has no chunk release


def test_every_release_has_the_allocator_tier_with_the_frees_its_allocator_offers():
    for release in environment.RELEASES:  # at its default tree and knobs: the allocator is the same
        assert MEMBERS.members[release].__dict__.get("make_allocator") is not None, release
    assert "make_allocator" not in vars(MEMBERS.members["0.5.19+need-sort"])
    frees = {"full_frees", "segment_frees", "free_groups"}
    offered = {release: frees & set(MEMBERS.members[release].capabilities) for release in ("0.5.18", "0.5.19", "0.5.20")}
    assert offered == {"0.5.18": set(), "0.5.19": {"full_frees"}, "0.5.20": frees}


def test_a_release_not_installed_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_SGLANG_RELEASES", str(tmp_path))
    with pytest.raises(environment.ReleaseNotInstalled, match=r"install it with `python -m kvspec.adapters.sglang."
                                                               r"releases install 0.5.18`"):
        environment.activate("0.5.18")
    result = subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", "sglang@0.5.18"],
                            capture_output=True, text=True, env={**os.environ, "KVSPEC_SGLANG_RELEASES": str(tmp_path)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not installed" in result.stderr and "Traceback" not in result.stderr


def test_a_release_whose_dependencies_are_missing_is_a_clear_error_not_a_deep_import_error(tmp_path, monkeypatch):
    """CI's first pytest run meets release folders (a cache) before SGLang's pins are installed:
    that is 'not installed' (a skip, or with KVSPEC_REQUIRE_SGLANG_RELEASES a failure), never a
    ModuleNotFoundError from inside SGLang."""
    (tmp_path / "0.5.18" / "sglang").mkdir(parents=True)
    (tmp_path / "0.5.18" / "sglang" / "version.py").write_text("__version__ = '0.5.18'\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("sglang==0.5.18\nkvspec-no-such-distribution==1.0\n")
    monkeypatch.setenv("KVSPEC_SGLANG_RELEASES", str(tmp_path))
    shelf = replace(environment.SHELF, requirements=(requirements,))  # the shelf's, with one pin missing
    assert shelf.unpacked("0.5.18") and not shelf.installed("0.5.18")
    assert shelf.missing_dependencies() == ["kvspec-no-such-distribution"]
    with pytest.raises(environment.ReleaseNotInstalled, match=r"what it imports is not in this environment "
                                                               r"\(kvspec-no-such-distribution\); install it with"):
        shelf.activate("0.5.18")


def test_an_unknown_member_names_the_family():
    with pytest.raises(AdapterError, match="unknown member of SGLang's releases 'sglang@0.5.99'"):
        load_adapter("sglang@0.5.99")


def test_shards_split_the_members_and_cover_them_once():
    from kvspec.conformance.runs.history import shard

    names = history.chosen(None)
    parts = [shard(names, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(names) and all(parts)
    for bad in ("4/3", "x/3", "2"):
        with pytest.raises(SystemExit, match="expected I/N"):
            shard(names, bad)


def require_release(release):
    """A release this test replays on: missing, a failure under CI (REQUIRED), else a skip."""
    if not environment.installed(release):
        if REQUIRED:
            pytest.fail(f"SGLang {release} is not installed: {environment.install_command(release)}")
        pytest.skip(f"SGLang {release} is not installed: {environment.install_command(release)}")


ENGINE_P4_W6_I4 = {"tier": "engine", "page_size": 4, "window": 6, "interval": 4, "state_grid": None, "state": False,
                   "policy_version": "max-window-page", "memory_model": "two-pool"}
"""A report's description of the run (plan.PlannedRun.description), which a finding with runs reads."""


def cell(release, tree, clauses, knobs=(), message="", verdict=None):
    run = {"label": "engine P=4 W=6 I=4", "run": ENGINE_P4_W6_I4, "verdict": verdict or ("violated" if clauses else "ok"), "clauses": clauses,
           "message": message, "trace": "t.jsonl" if clauses else None, "trace_steps": 2 if clauses else None,
           "first_failure_seconds": 0.5 if clauses else None}
    return {"member": f"sglang@{release}-{tree}", "release": release, "tree": tree, "knobs": list(knobs),
            "policy_version": "max-window-page", "verdict": run["verdict"], "runs": [run], "seconds": 1.0}


def test_a_violation_is_explained_only_inside_its_findings_range():
    finding = next(finding for finding in FINDINGS if finding.id == "checkpoint-short-rematch")
    assert explain(cell("0.5.22", "python", ["I4"]), cell("0.5.22", "python", ["I4"])["runs"][0]) == finding.id
    for release, knobs in (("0.5.23", ()), ("0.5.14", ()), ("0.5.17", ())):
        c = cell(release, "python", ["I4"], knobs)
        assert explain(c, c["runs"][0]) != finding.id, release
    c = cell("0.5.17", "python", ["I4"], ("chunk-release",))
    assert explain(c, c["runs"][0]) == finding.id  # before 0.5.18 it needs the chunk release turned on


def test_a_batchs_group_end_free_is_told_from_the_short_rematch_by_its_step_and_words():
    """0.5.18 has both bugs, on overlapping clauses: the grouped free is a prefill batch's
    step whose live SWA maps to nothing; the same clauses after a single chunk are the rematch."""
    batch = ("after Step(operation='prefill_batch', rid=None, outcome='ok', batch=('a', 'b')):\n"
             "[I3] swa pool: 11 free + 0 pending + 4 held = 15 pages, but the pool has 16 (leaked pages)\n"
             "[I5] position 12 (full slot 16) has live SWA KV but maps to 0")
    c = cell("0.5.18", "python", ["I3", "I5"], message=batch)
    assert explain(c, c["runs"][0]) == "grouped-swa-free-remap"
    single = batch.replace("'prefill_batch', rid=None", "'prefill_chunk', rid='a'")
    c = cell("0.5.18", "python", ["I3", "I5"], message=single)
    assert explain(c, c["runs"][0]) == "checkpoint-short-rematch"
    c = cell("0.5.19", "python", ["I3", "I5"], message=batch)
    assert explain(c, c["runs"][0]) == "checkpoint-short-rematch"  # 0.5.19 has only the rematch


def test_the_table_meets_the_pd_tail_bug_that_the_gating_adapters_steer_clear_of():
    """The members with the PD path (from 0.5.19) draw PD admissions at every window (SGL-11 is
    not steered there): an I10 of a short admission leaf is explained on 0.5.23's Python tree,
    where it shows, only; before 0.5.23 the same admission is the rematch's double ownership."""
    from kvspec.adapters.sglang import CAPABILITIES
    assert "pd_checkpoint_keeps_window" not in CAPABILITIES
    assert "pd_checkpoint_keeps_window" in MEMBERS.members["0.5.23-python"].capabilities
    for release, driven in (("0.5.18", False), ("0.5.19", True), ("0.5.22-python", True)):
        claimed = {"pd_decode", "pd_checkpoint_keeps_window"} & set(MEMBERS.members[release].capabilities)
        assert claimed == ({"pd_decode", "pd_checkpoint_keeps_window"} if driven else set()), release
    short = "violated at step 0: [I10] request r1: new leaf with live SWA [8, 12), fewer than min(W, E) = 6"
    for release, tree, explained in (("0.5.23", "python", True), ("0.5.23", "rust", False), ("0.5.18", "python", False)):
        c = cell(release, tree, ["I10"], message=short)
        assert (explain(c, c["runs"][0]) == "pd-tail-not-rounded") == explained, (release, tree)
    c = cell("0.5.23", "python", ["I10"])  # another I10 is not this bug
    assert explain(c, c["runs"][0]) is None
    owned_twice = "after Step(operation='pd_admit', rid='r1', outcome=<Outcome.OK: 'ok'>):\n[I4] full page 1 has 2 owners"
    for release, explained in (("0.5.20", "checkpoint-short-rematch"), ("0.5.23", None)):
        c = cell(release, "python", ["I4"], ("no-chunk-release",), message=owned_twice)  # not the chunk release's
        assert explain(c, c["runs"][0]) == explained, release


def test_early_swa_unlock_is_explained_only_with_its_knob_and_before_a_bug_of_the_same_clauses():
    """The opt-in early SWA unlock breaks I11 (I14 on the legacy tree) on every release; at the
    default knobs the same clauses are not it (0.5.14's revive-frees-locked-full breaks them)."""
    early = "violated at step 8: [I11] request r1: node 18 is in its SWA lock segment (the 6 tokens above its end)"
    for release, tree, knobs, explained in (("0.5.14", "legacy", ("early-swa-unlock",), "early-swa-unlock"),
                                            ("0.5.23", "python", ("early-swa-unlock",), "early-swa-unlock"),
                                            ("0.5.23", "python", (), None), ("0.5.14", "legacy", (), "revive-frees-locked-full"),
                                            ("0.5.23", "rust", ("early-swa-unlock",), None)):
        c = cell(release, tree, ["I11"], knobs, message=early)
        assert explain(c, c["runs"][0]) == explained, (release, tree, knobs)


def test_the_rust_cores_crash_forms_of_the_short_rematch_are_explained_only_where_it_shipped():
    """The Rust core cannot be walked: its double ownership shows as an allocator assertion in an
    eviction or a later prefill (0.5.20 - 0.5.22), or as SGLang's own new_prefix_len assertion."""
    for message, release, explained in (("prefill_chunk raised AssertionError: ", "0.5.21", True),
                                        ("evict raised AssertionError: ", "0.5.22", True),
                                        ("prefill_chunk raised AssertionError: new_prefix_len=4, len(new_indices)=0", "0.5.19", True),
                                        ("prefill_chunk raised AssertionError: ", "0.5.23", False),
                                        ("decode raised AssertionError: ", "0.5.21", False)):
        c = cell(release, "rust", [], message=message, verdict="crashed")
        assert (explain(c, c["runs"][0]) == "checkpoint-short-rematch") == explained, (message, release)


def test_the_rust_cores_forms_of_the_pd_bugs_are_told_apart_by_knob_window_and_words():
    """Without the chunk release the Rust core meets the short rematch only through a PD
    admission (0.5.19 - 0.5.22), at the windows that leave a short leaf; 0.5.19's double SWA
    lock release shows, where no short leaf can be, as SGLang's cache_protected_len assertion."""
    for message, release, knobs, explained in (
            ("evict raised AssertionError: ", "0.5.20", ("no-chunk-release",), "checkpoint-short-rematch"),
            ("after Step(operation='evict'):\n[I1] full pool: page 4 is 2 times in the free list", "0.5.19",
             ("no-chunk-release",), "checkpoint-short-rematch"),
            ("evict raised AssertionError: ", "0.5.23", ("no-chunk-release",), None),
            ("prefill_batch raised AssertionError: req.kv.cache_protected_len=2, len(new_indices)=0", "0.5.19", (),
             "pd-swa-lock-released-twice"),
            ("prefill_chunk raised AssertionError: req.kv.cache_protected_len=4, len(new_indices)=0", "0.5.19",
             ("no-chunk-release",), "pd-swa-lock-released-twice"),
            ("prefill_batch raised AssertionError: req.kv.cache_protected_len=2, len(new_indices)=0", "0.5.20", (),
             None)):
        clauses = ["I1"] if "[I1]" in message else []
        c = cell(release, "rust", clauses, knobs, message=message, verdict=None if clauses else "crashed")
        if "cache_protected_len" in message:  # as the matrix met it: a window no short leaf is left at
            c["runs"][0]["run"] = {**ENGINE_P4_W6_I4, "page_size": 2, "window": 5, "interval": 1}
        assert explain(c, c["runs"][0]) == explained, (message, release)
    c = cell("0.5.20", "rust", [], ("no-chunk-release",), message="evict raised AssertionError: ", verdict="crashed")
    c["runs"][0]["run"] = {**ENGINE_P4_W6_I4, "page_size": 4, "window": 8}  # W mod P = 0: no short leaf
    assert explain(c, c["runs"][0]) is None


def test_an_engine_does_not_inherit_the_knobs_of_one_built_before_it_in_its_process():
    """0.5.23 copies the deprecated name of its early-unlock knob into the new one: the adapter
    clears both, or every engine after an `+early-swa-unlock` one in a process would unlock early."""
    require_release("0.5.23")
    script = ("import json, sys; from pathlib import Path; from kvspec.adapters.sglang.releases.regressions import "
              "ROOT, replay_here; vector = ROOT / 'vectors/regressions/sglang/early-swa-unlock.jsonl'; "
              "print(json.dumps([replay_here(member, vector)['conforms'] for member in sys.argv[1:]]))")
    done = subprocess.run([sys.executable, "-c", script, "sglang@0.5.23-python+early-swa-unlock", "sglang@0.5.23-python"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, True]


def test_the_table_merges_shards_and_fails_on_an_unexplained_violation(tmp_path):
    explained = tmp_path / "a.json"
    explained.write_text(json.dumps({"schema": history.SCHEMA, "profile": "ci",
                                     "cells": [cell("0.5.22", "python", ["I4"]), cell("0.5.23", "python", [])]}))
    assert history.table([explained], tmp_path / "out") == 0
    text = (tmp_path / "out" / "sglang-history.md").read_text()
    assert "checkpoint-short-rematch" in text and "I4 (engine P=4 W=6 I=4)" in text
    unexplained = tmp_path / "b.json"
    unexplained.write_text(json.dumps({"schema": history.SCHEMA, "profile": "ci",
                                       "cells": [cell("0.5.23", "rust", ["I4"])]}))
    assert history.table([explained, unexplained], tmp_path / "out") == 1
    assert "UNEXPLAINED" in (tmp_path / "out" / "sglang-history.md").read_text()
    assert len(json.loads((tmp_path / "out" / "sglang-history.json").read_text())["cells"]) == 3
    history.table([explained, explained], tmp_path / "again")  # a member in two shards: one row
    assert len(json.loads((tmp_path / "again" / "sglang-history.json").read_text())["cells"]) == 2
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a history shard"):
        history.table([tmp_path / "c.json"], tmp_path / "out")


@pytest.mark.parametrize("release", environment.RELEASES)
def test_each_regression_vector_fails_where_its_bug_shipped_and_passes_elsewhere(release):
    require_release(release)
    from kvspec.adapters.sglang.releases.regressions import replay_release
    results = replay_release(release)
    assert results, f"no regression vector applies to {release}"
    for result in results:
        assert result["as_expected"], result
    if Release(release).release in ("0.5.18", "0.5.22"):
        assert any(r["expected_to_fail"] and not r["conforms"] for r in results)
    replayed = [r for r in results if "skipped" not in r]
    if release == "0.5.23":  # the bugs fixed there pass; what it still has fails (the knob's, with the knob)
        # (the rematch's PD vector stops there at the short leaf itself: pd-tail-not-rounded)
        assert {r["explained_by"] for r in replayed if not r["conforms"]} == {"pd-tail-not-rounded", "early-swa-unlock"}
        assert {r["member"] for r in replayed if r["finding"] == "early-swa-unlock" and not r["conforms"]} \
            == {"sglang@0.5.23-python+early-swa-unlock"}
    else:  # the PD vectors: from 0.5.19 the short admission leaf meets the rematch first; before, skipped
        pd = [r for r in results if r["vector"] in ("checkpoint-short-rematch-pd.jsonl", "SGL-11.jsonl")]
        if key(release) >= (0, 5, 19):
            assert len(pd) >= 2 and all("skipped" not in r and r["explained_by"] == "checkpoint-short-rematch"
                                        for r in pd), pd
        else:
            assert len(pd) >= 2 and all("capability pd_decode" in r["skipped"] for r in pd), pd


def test_only_the_release_that_fixed_the_rematch_claims_short_leaf_checkpoints():
    """0.5.14 - 0.5.22 match again after a checkpoint's insert (checkpoint-short-rematch), so
    their runs steer clear of short leaves where their policy leaves them (tests/test_short_leaf_steering.py);
    0.5.23 repoints from the insert's own node, and its members and the gating adapters claim it."""
    from kvspec.adapters.sglang import CAPABILITIES
    assert "short_leaf_checkpoints" in CAPABILITIES
    claims = {name for name, member in MEMBERS.members.items() if "short_leaf_checkpoints" in member.capabilities}
    assert claims and all(name.startswith("0.5.23") for name in claims), sorted(claims)
    assert {name for name in MEMBERS.members if name.startswith("0.5.23")} == claims
