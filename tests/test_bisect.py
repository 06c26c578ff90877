"""`kvspec bisect` (conformance/runs/bisect.py): one trace on every member of a family, one
process per version, and where its recorded failure comes and goes; and the history table's
rule that a violation is explained only where its trace bisects to its finding's range
(adapters/sglang/releases/history.py, findings.disagreement).

The generic path runs on the reference's seeded bugs (`mutant-`: one version, no SGLang).
The SGLang releases' tests replay committed regression vectors on a few releases and skip
only where a release is not installed (KVSPEC_REQUIRE_SGLANG_RELEASES=1 fails instead)."""

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvspec.adapters.sglang.releases import environment, history
from kvspec.adapters.sglang.releases.findings import FINDINGS
from kvspec.conformance.cli import main
from kvspec.conformance.harness.trace import load
from kvspec.conformance.runs import bisect
from kvspec.conformance.runs.tree import TREE

REQUIRED = os.environ.get("KVSPEC_REQUIRE_SGLANG_RELEASES") == "1"
REGRESSIONS = TREE / "regressions" / "sglang"


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def require_releases(*releases):
    """Releases this test replays on: missing, a failure under CI (REQUIRED), else a skip."""
    for release in releases:
        if not environment.installed(release):
            message = f"SGLang {release} is not installed: {environment.install_command(release)}"
            if REQUIRED:
                pytest.fail(message)
            pytest.skip(message)


def with_header(source: Path, target: Path, **fields) -> Path:
    """A copy of a trace with its header's fields changed (None: removed)."""
    header, *steps = source.read_text().splitlines()
    header = {key: value for key, value in {**json.loads(header), **fields}.items() if value is not None}
    target.write_text("\n".join([json.dumps(header), *steps]) + "\n")
    return target


def by_line(document: dict) -> dict:
    return {line["line"]: line for line in document["lines"]}


# -- the generic path, on the reference's seeded bugs ----------------------------------------------

def test_a_seeded_bug_reproduces_on_its_own_mutant_and_nowhere_else(tmp_path, capsys):
    """[I9] The long chunked prefill keeps three pages of SWA per chunk on the reference; the
    mutant that never releases a chunk's SWA breaks I9 on it (docs/checking.md's picture). A
    family without versions is one version: one process for all its members."""
    trace = with_header(TREE / "examples" / "long-chunked-prefill.jsonl", tmp_path / "t.jsonl", violates=["I9"])
    status, out, err = run_main(capsys, "bisect", str(trace), "--family", "mutant-", "--members",
                                "mutant-no-chunk-release", "leak-on-release", "--json", str(tmp_path / "b.json"))
    assert status == 0, out + err
    assert "one process per version (1)" in out and "reproduces on: mutant-no-chunk-release" in out
    document = json.loads((tmp_path / "b.json").read_text())
    assert document["schema"] == bisect.SCHEMA and document["breaks"] == ["I9"]
    verdicts = {member["member"]: member["verdict"] for member in document["members"]}
    assert verdicts == {"mutant-no-chunk-release": "reproduces", "mutant-leak-on-release": "passes"}
    assert next(m for m in document["members"] if m["verdict"] == "reproduces")["clauses"] == ["I9"]


def test_another_clause_is_a_failure_that_does_not_reproduce(tmp_path, capsys):
    """A trace that records I5 is not reproduced by the same mutant's I9: that member fails
    otherwise, and says on what."""
    trace = with_header(TREE / "examples" / "long-chunked-prefill.jsonl", tmp_path / "t.jsonl", violates=["I5"])
    status, out, _ = run_main(capsys, "bisect", str(trace), "--family", "mutant-", "--members",
                              "mutant-no-chunk-release", "--json", str(tmp_path / "b.json"))
    assert status == 0
    (member,) = json.loads((tmp_path / "b.json").read_text())["members"]
    assert member["verdict"] == "fails" and member["clauses"] == ["I9"]
    assert "fails I9 at step" in out and "reproduces on: none of them" in out


def test_a_member_replays_the_trace_at_its_own_policy():
    """One trace serves releases whose retention differs (WIN-2) and whose chunk release
    differs (WIN-4): the member's version and chunk_release replace the trace's."""
    trace = load(REGRESSIONS / "checkpoint-short-rematch.jsonl")
    old = SimpleNamespace(name="sglang@0.5.14", policy_version="design-margin", chunk_release=False)
    own = bisect.at_own_policy(trace, old)
    assert own.config["policy"] == {**trace.config["policy"], "version": "design-margin", "chunk_release": False}
    assert own.adapter == "sglang@0.5.14" and own.steps == trace.steps and own.violates == trace.violates
    plain = bisect.at_own_policy(trace, SimpleNamespace(name="x", policy_version="sglang-0.5.23"))
    assert "chunk_release" not in plain.config["policy"]  # an adapter that declares none keeps the trace's


def test_lines_give_the_first_affected_and_the_first_fixed_version():
    members = [bisect.Member(f"e@{v}", v, "t") for v in ("1", "2", "3", "4", "5")]
    verdicts = ("passes", "reproduces", "cannot-run", "reproduces", "fails")
    outcomes = [bisect.Outcome(m.name, "t.jsonl", verdict, kind="violated" * (verdict == "fails"), clauses=("I1",))
                for m, verdict in zip(members, verdicts)]
    (line,) = bisect.lines(members, outcomes)
    assert line.reproduces == ["2", "4"] and line.first_affected == "2"
    assert line.version_of(line.first_fixed) == "5"  # the first that ran after the last reproduction
    assert bisect.ranges(line.reproduces, [m.version for m, _ in line.ran]) == "2-4"  # 3 did not run: no gap
    assert bisect.ranges(["1", "3"], ["1", "2", "3"]) == "1, 3"


# -- bad input exits 2, with one paragraph ------------------------------------------------------

@pytest.mark.parametrize("problem", ["malformed", "missing", "no failure", "directory"])
def test_a_trace_bisection_cannot_use_exits_2_saying_why(tmp_path, capsys, problem):
    trace = tmp_path / "t.jsonl"
    if problem == "malformed":
        trace.write_text('{"kvspec_trace": 1, "tier": "engine"\n')
    elif problem == "no failure":
        with_header(TREE / "examples" / "long-chunked-prefill.jsonl", trace)
    elif problem == "directory":
        trace = tmp_path
    status, out, err = run_main(capsys, "bisect", str(trace), "--family", "mutant-")
    assert status == 2, out + err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert {"malformed": "not JSON", "missing": "no such trace file", "no failure": "records no failure",
            "directory": "replays one trace"}[problem] in err


def test_an_unknown_family_or_member_exits_2_naming_the_known_ones(tmp_path, capsys):
    trace = with_header(TREE / "examples" / "long-chunked-prefill.jsonl", tmp_path / "t.jsonl", violates=["I9"])
    status, _, err = run_main(capsys, "bisect", str(trace), "--family", "sglang")
    assert status == 2 and "unknown family 'sglang'" in err and "sglang@ (SGLang's releases)" in err
    assert "mutant- (the reference)" in err and "Traceback" not in err
    status, _, err = run_main(capsys, "bisect", str(trace), "--family", "mutant-", "--members", "no-such-bug")
    assert status == 2 and "no member of the reference (mutant-) starts so" in err


# -- SGLang's releases ---------------------------------------------------------------------------

def bisected(capsys, tmp_path, vector: str, *members: str) -> dict:
    status, out, err = run_main(capsys, "bisect", str(REGRESSIONS / vector), "--family", "sglang@", "--members",
                                *members, "-n", "2", "--json", str(tmp_path / "b.json"))
    assert status == 0, out + err
    return json.loads((tmp_path / "b.json").read_text())


def test_grouped_swa_free_remap_comes_in_0_5_18_and_goes_in_0_5_19(tmp_path, capsys):
    """The bug of 0.5.18's grouped free (docs/engines/sglang-findings.md), fixed in 0.5.19:
    the vector passes 0.5.17, breaks I3/I5/I13 on 0.5.18's Python tree, passes 0.5.19."""
    require_releases("0.5.17", "0.5.18", "0.5.19")
    document = bisected(capsys, tmp_path, "grouped-swa-free-remap.jsonl", "sglang@0.5.17", "sglang@0.5.18",
                        "sglang@0.5.19")
    python = by_line(document)["python"]
    assert python["ran"] == ["0.5.17", "0.5.18", "0.5.19"]
    assert python["reproduces"] == ["0.5.18"] and python["first_affected"] == "0.5.18"
    assert python["first_fixed"] == "0.5.19"
    assert by_line(document)["rust"]["reproduces"] == []  # the Rust core ships in 0.5.19, after the fix


def test_checkpoint_short_rematch_reaches_0_5_22_on_both_trees_and_is_fixed_in_0_5_23(tmp_path, capsys):
    """The short rematch (0.5.15 - 0.5.22): at the defaults from 0.5.18 (the chunk release
    turned on), before only with the knob; 0.5.23 rounds the retention up and passes. The
    Rust core's tree cannot be walked: there the same steps end in SGLang's own assertion on
    the match, a crash, which this vector does not record (it fails otherwise)."""
    require_releases("0.5.17", "0.5.22", "0.5.23")
    document = bisected(capsys, tmp_path, "checkpoint-short-rematch.jsonl", "sglang@0.5.17", "sglang@0.5.22",
                        "sglang@0.5.23")
    lines = by_line(document)
    assert (lines["python"]["reproduces"], lines["python"]["first_fixed"]) == (["0.5.22"], "0.5.23")
    assert lines["python+chunk-release"]["reproduces"] == ["0.5.17"]  # the only member of that line here
    members = {member["member"]: member for member in document["members"]}
    assert (members["sglang@0.5.22"]["verdict"], members["sglang@0.5.22"]["kind"]) == ("fails", "crashed")
    assert "new_prefix_len" in members["sglang@0.5.22"]["message"]
    assert members["sglang@0.5.23"]["verdict"] == "passes" and lines["rust"]["reproduces"] == []


def test_a_release_that_is_not_installed_cannot_run_and_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVSPEC_SGLANG_RELEASES", str(tmp_path / "none"))
    status, out, _ = run_main(capsys, "bisect", str(REGRESSIONS / "grouped-swa-free-remap.jsonl"), "--family",
                              "sglang@", "--members", "sglang@0.5.18", "--json", str(tmp_path / "b.json"))
    assert status == 0, out
    members = json.loads((tmp_path / "b.json").read_text())["members"]
    assert {m["verdict"] for m in members} == {"cannot-run"}
    assert "install it with `python -m kvspec.adapters.sglang.releases install 0.5.18`" in members[0]["message"]


# -- the history table ---------------------------------------------------------------------------

I4 = {"tier": "engine", "page_size": 4, "window": 6, "interval": 4, "state_grid": None, "state": False}


I9 = dict(I4, page_size=1, window=3)
EVICTION_PHASE = "[I9] request r1: holds 8 private SWA slots (positions 9..16) after 11 decode steps, more than 7"


def shard(folder: Path, release: str, tree: str, trace: Path, clause: str = "I4",
          message: str = "[I4] full page 1 has two owners", knobs: tuple[str, ...] = ()) -> Path:
    """A history shard of one member whose one run broke `clause` with `trace` (by default
    checkpoint-short-rematch by its pattern: python, 0.5.18 - 0.5.22 at the defaults)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "traces").mkdir(exist_ok=True)
    (folder / "traces" / "t.jsonl").write_bytes(trace.read_bytes())
    run = {"label": "engine P=4 W=6 I=4", "run": I4 if clause == "I4" else I9, "verdict": "violated",
           "clauses": [clause], "message": message, "trace": "traces/t.jsonl", "trace_steps": 2,
           "first_failure_seconds": 0.5}
    name = f"sglang@{release}" + ("-python" if release >= "0.5.21" or release == "0.5.14" else "")
    cell = {"member": name + "".join(f"+{knob}" for knob in knobs), "release": release,
            "tree": tree, "knobs": list(knobs), "policy_version": "max-window-page", "verdict": "violated",
            "runs": [run], "seconds": 1.0}
    path = folder / "history.json"
    path.write_text(json.dumps({"schema": history.SCHEMA, "profile": "quick", "cells": [cell]}))
    return path


def cache(folder: Path, reproduces: set[str], clause: str = "I4", message: str = "[I4] full page 1 has two owners",
          line: str = "python") -> None:
    """The bisections beside the shard, as `table` keeps them: the trace reproduces on the
    members of `line` of `reproduces` and passes on the others."""
    outcomes = {}
    for member in bisect.members_of(history.FAMILY):
        if member.line == line:
            verdict = "reproduces" if member.version in reproduces else "passes"
            outcomes[member.name] = asdict(bisect.Outcome(
                member.name, "t", verdict, clauses=(clause,) * (verdict != "passes"),
                kind="violated" * (verdict != "passes"), message=message, run=I4 if clause == "I4" else I9))
    digest = hashlib.sha256((folder / "traces" / "t.jsonl").read_bytes()).hexdigest()
    (folder / history.BISECTIONS).write_text(json.dumps(
        {"schema": history.BISECTIONS_SCHEMA, "traces": {"traces/t.jsonl": {"sha256": digest, "members": outcomes}}}))


def no_replays(*args, **kwargs):
    raise AssertionError("the cache holds every bisection: nothing is replayed")


def test_a_violation_is_explained_only_where_its_trace_bisects_to_its_findings_range(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "replay_pairs", no_replays)
    path = shard(tmp_path / "a", "0.5.22", "python", REGRESSIONS / "checkpoint-short-rematch.jsonl")
    cache(tmp_path / "a", {"0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22"})
    assert history.table([path], tmp_path / "out", bisect=True) == 0
    text = (tmp_path / "out" / "sglang-history.md").read_text()
    assert "[checkpoint-short-rematch]" in text and "UNEXPLAINED" not in text and "`kvspec bisect`" in text

    cache(tmp_path / "a", {"0.5.19", "0.5.20", "0.5.21", "0.5.22"})  # not on 0.5.18: the finding says it is
    assert history.table([path], tmp_path / "out", bisect=True) == 1
    text = (tmp_path / "out" / "sglang-history.md").read_text()
    assert ("UNEXPLAINED: engine P=4 W=6 I=4 (checkpoint-short-rematch by its pattern, but its trace reproduces "
            "on 0.5.19-0.5.22, finding says 0.5.18-0.5.22)") in text

    assert history.table([path], tmp_path / "out", bisect=False) == 0  # by its pattern, as before
    assert "by the findings' patterns only" in (tmp_path / "out" / "sglang-history.md").read_text()


def test_a_finding_of_several_shapes_explains_the_one_whose_range_its_trace_bisects_to(tmp_path, monkeypatch):
    """decode-eviction-phase is one bug with two shapes: the phase gate starving a request
    (0.5.14 - 0.5.17) and, under 0.5.14's page margin, a request decoding in every batch
    (0.5.14 alone, and not with the margin dropped). A trace on 0.5.14 alone is the second."""
    monkeypatch.setattr(history, "replay_pairs", no_replays)
    vector = REGRESSIONS / "decode-eviction-phase-margin.jsonl"
    path = shard(tmp_path / "a", "0.5.14", "python", vector, "I9", EVICTION_PHASE)
    cache(tmp_path / "a", {"0.5.14"}, "I9", EVICTION_PHASE)
    assert history.table([path], tmp_path / "out", bisect=True) == 0
    assert "[decode-eviction-phase]" in (tmp_path / "out" / "sglang-history.md").read_text()

    cache(tmp_path / "a", {"0.5.14", "0.5.15"}, "I9", EVICTION_PHASE)  # neither shape's range
    assert history.table([path], tmp_path / "out", bisect=True) == 1
    assert ("UNEXPLAINED: engine P=4 W=6 I=4 (decode-eviction-phase by its pattern, but its trace reproduces on "
            "0.5.14-0.5.15, finding says 0.5.14-0.5.17)") in (tmp_path / "out" / "sglang-history.md").read_text()


def test_a_knob_that_takes_a_finding_away_is_out_of_its_reach():
    margin = next(f for f in FINDINGS if f.vector and f.vector.endswith("decode-eviction-phase-margin.jsonl"))
    assert margin.reaches("0.5.14", ()) and margin.reaches("0.5.14", ("chunk-release",))
    assert not margin.reaches("0.5.14", ("drop-margin",)) and not margin.reaches("0.5.15", ())


def test_a_violation_whose_trace_is_missing_is_not_explained(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "replay_pairs", no_replays)
    path = shard(tmp_path, "0.5.22", "python", REGRESSIONS / "checkpoint-short-rematch.jsonl")
    (tmp_path / "traces" / "t.jsonl").unlink()
    assert history.table([path], tmp_path / "out", bisect=True) == 1
    assert "but its trace cannot be read" in (tmp_path / "out" / "sglang-history.md").read_text()


def test_the_table_bisects_each_trace_once_and_keeps_it_beside_the_shard(tmp_path, monkeypatch):
    """The first table replays the trace on its line's members (here a stand-in for the
    releases' processes) and keeps the outcomes; the next reads them, replaying nothing."""
    path = shard(tmp_path, "0.5.22", "python", REGRESSIONS / "checkpoint-short-rematch.jsonl")
    asked = []

    def replays(pairs, workers=1, on_version=None, **options):
        asked.extend(pairs)
        reproduced = {"0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22"}
        return [bisect.Outcome(member.name, trace, "reproduces", clauses=("I4",), kind="violated",
                               message="[I4] two owners", run=I4) if member.version in reproduced
                else bisect.Outcome(member.name, trace, "passes", run=I4) for trace, member in pairs]

    monkeypatch.setattr(history, "replay_pairs", replays)
    assert history.table([path], tmp_path / "out", bisect=True) == 0
    assert [member.version for _, member in asked] == list(environment.RELEASES)  # the Python tree's line
    assert {member.line for _, member in asked} == {"python"} and (tmp_path / history.BISECTIONS).is_file()
    monkeypatch.setattr(history, "replay_pairs", no_replays)
    assert history.table([path], tmp_path / "out", bisect=True) == 0


@pytest.mark.parametrize("vector", ["flush-forgets-the-cache", "waiting-match-splits-and-refreshes",
                                    "prefill-batch-finishes"])
def test_the_schedulers_flushes_waiting_matches_and_prefill_finishes_hold_on_every_tree_of_their_releases(vector):
    """[LIFE-11, LIFE-12, LIFE-9] The vectors at each member's policy, on 0.5.14's unified and
    Python trees, 0.5.18's Python tree, 0.5.19's Rust tree and 0.5.22's: each flush_cache ends
    with every page free, each waiting match splits and touches and changes nothing else, each
    request finished in its prefill batch is released there, and every check holds (by
    invariants: the expected observables are the reference's at 0.5.23's policy)."""
    require_releases("0.5.14", "0.5.18", "0.5.19", "0.5.22")
    path = str(TREE / "tests" / f"{vector}.jsonl")
    members = {member.name: member for member in bisect.members_of(history.FAMILY)}
    names = ["sglang@0.5.14", "sglang@0.5.14-python", "sglang@0.5.18", "sglang@0.5.19-rust", "sglang@0.5.22"]
    outcomes = bisect.replay_pairs([(path, members[name]) for name in names], workers=2)
    assert [(o.member, o.verdict) for o in outcomes] == [(name, bisect.PASSES) for name in names], outcomes


def test_pd_admissions_hold_on_every_release_that_drives_them():
    """[LIFE-6] vectors/tests/pd-admissions-share-and-refuse.jsonl: PD admissions that share a
    cached prefix, one refused with its prefix locked, one aborted, on each generation of the
    decode side's pre-allocation (catalog.pd_capabilities): 0.5.19 (the radix flag read off the
    server arguments), 0.5.20's Rust tree, 0.5.21 (the match capped and the SWA lock given back
    in pop_preallocated itself, the budgets checked one by one), 0.5.22 and 0.5.23 (both in
    _match_prefix_and_lock, the budgets in _prealloc_reservation_fits): every check holds."""
    require_releases("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
    path = str(TREE / "tests" / "pd-admissions-share-and-refuse.jsonl")
    members = {member.name: member for member in bisect.members_of(history.FAMILY)}
    names = ["sglang@0.5.19", "sglang@0.5.20-rust", "sglang@0.5.21-python", "sglang@0.5.22", "sglang@0.5.23-python"]
    outcomes = bisect.replay_pairs([(path, members[name]) for name in names], workers=2)
    assert [(o.member, o.verdict) for o in outcomes] == [(name, bisect.PASSES) for name in names], outcomes
