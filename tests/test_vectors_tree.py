"""The vectors tree (conformance/runs/tree.py): each trace where its layout says what it is,
each with its front matter (a regression's or divergence's `violates` is what it is
recorded to break), one index at the root of relative paths that a replay of the tree, of
a part of it or of one trace checks, and nothing read through a link or outside it.

Importing a divergence list or SGLang's findings imports no engine: these run without
SGLang, vLLM or TokenSpeed installed."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from kvspec.adapters.sglang.divergences import KNOWN_DIVERGENCES as SGLANG_DIVERGENCES
from kvspec.adapters.sglang.releases.findings import FINDINGS
from kvspec.adapters.tokenspeed.divergences import KNOWN_DIVERGENCES as TOKENSPEED_DIVERGENCES
from kvspec.adapters.vllm.divergences import KNOWN_DIVERGENCES as VLLM_DIVERGENCES
from kvspec.conformance.cli import main
from kvspec.conformance.harness.needs import derived_needs
from kvspec.conformance.harness.trace import TraceError, load
from kvspec.conformance.runs.tree import CONFORMANCE, INDEX, TREE, corpus, folder, write_index

TRACES = corpus(TREE)
"""Every trace of the committed tree, checked against its index."""
DIVERGENCES = {"sglang": SGLANG_DIVERGENCES, "vllm": VLLM_DIVERGENCES, "tokenspeed": TOKENSPEED_DIVERGENCES}


def where(path: Path) -> tuple[str, ...]:
    return path.relative_to(TREE).parts


# -- the layout and the front matter ----------------------------------------------------------------

def test_the_tree_keeps_each_trace_where_it_says_what_it_is():
    """Conformance vectors by tier, memory model and policy version (as their headers
    say), regressions and divergences by engine, the tests' and the docs' traces apart."""
    for path, trace in TRACES.items():
        parts = where(path)
        if parts[0] == CONFORMANCE:
            assert "/".join(parts[:-1]) == folder(trace).as_posix(), path
        else:
            assert parts[0] in ("regressions", "divergences", "tests", "examples"), path
            assert (len(parts) == 3) == (parts[0] in ("regressions", "divergences")), path


def test_every_trace_says_what_it_needs_and_exercises():
    """kvspec writes the front matter of every trace it keeps: its `needs` are what its
    steps need (so no verdict changed with them), its `clauses` what ran on the reference;
    only a regression or divergence violates anything."""
    for path, trace in TRACES.items():
        assert trace.needs == tuple(derived_needs(trace)), path
        assert trace.clauses, path
        assert bool(trace.violates) == (where(path)[0] in ("regressions", "divergences")), path


@pytest.mark.parametrize("engine", DIVERGENCES)
def test_each_divergence_trace_violates_what_its_list_says(engine):
    """A divergence's trace is vectors/divergences/<engine>/<id>.jsonl, and its header's
    `violates` is the clauses its entry lists; nothing else is in the folder."""
    listed = DIVERGENCES[engine]
    for divergence in listed:
        assert divergence.path == TREE / "divergences" / engine / f"{divergence.id}.jsonl"
        assert TRACES[divergence.path].violates == divergence.clauses, divergence.id
    assert {path.stem for path in (TREE / "divergences" / engine).glob("*.jsonl")} == {d.id for d in listed}


def test_each_regression_trace_violates_what_its_finding_says():
    """A finding of SGLang's history names its vector: one under regressions/sglang/ has
    the finding's clauses as `violates`; a divergence's trace that a bug is also recorded
    as (SGL-11) violates them among its own. Every regression trace is a finding's."""
    regressions = set((TREE / "regressions" / "sglang").glob("*.jsonl"))
    for finding in FINDINGS:
        if finding.vector is None:
            continue
        path = TREE.parent / finding.vector
        violates = TRACES[path].violates
        if path in regressions:
            assert violates == finding.clauses, finding.vector
        else:
            assert set(finding.clauses) <= set(violates) and where(path)[:2] == ("divergences", "sglang")
    assert regressions == {TREE.parent / finding.vector for finding in FINDINGS
                           if finding.vector and "/regressions/" in finding.vector}


# -- the index of a tree ----------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path) -> Path:
    """A small tree: two conformance vectors and a divergence, indexed."""
    root = tmp_path / "tree"
    for path in (TREE / CONFORMANCE / "allocator" / "allocator-P1-1.jsonl",
                 TREE / CONFORMANCE / "engine" / "two-pool" / "sglang-0.5.23" / "walkthrough-4.3-chunked-prefill.jsonl",
                 TREE / "divergences" / "sglang" / "SGL-1.jsonl"):
        (root / path.relative_to(TREE)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / path.relative_to(TREE))
    write_index(root, 0)
    return root


def replay(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["replay", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_index_lists_relative_paths_and_a_tree_replays_in_whole_or_in_part(tree, capsys):
    index = json.loads((tree / INDEX).read_text())
    assert index["kvspec_vectors"] == 2 and [entry["file"] for entry in index["vectors"]] == [
        "conformance/allocator/allocator-P1-1.jsonl",
        "conformance/engine/two-pool/sglang-0.5.23/walkthrough-4.3-chunked-prefill.jsonl",
        "divergences/sglang/SGL-1.jsonl"]
    status, out, _ = replay(capsys, str(tree))
    assert status == 0 and "3 of 3 trace(s) replayed in full" in out, out
    assert "ok   divergences/sglang/SGL-1.jsonl: conforms" in out
    status, out, _ = replay(capsys, str(tree / CONFORMANCE / "engine"))
    assert status == 0 and "ok   two-pool/sglang-0.5.23/walkthrough-4.3-chunked-prefill.jsonl" in out, out
    assert "1 of 1 trace(s)" in out


@pytest.mark.parametrize("target", ["", "conformance", "conformance/engine/two-pool/sglang-0.5.23",
                                    "conformance/engine/two-pool/sglang-0.5.23/walkthrough-4.3-chunked-prefill.jsonl"])
def test_an_altered_trace_is_found_from_the_root_a_sub_tree_or_alone(tree, capsys, target):
    vector = tree / CONFORMANCE / "engine" / "two-pool" / "sglang-0.5.23" / "walkthrough-4.3-chunked-prefill.jsonl"
    vector.write_text(vector.read_text().replace('"chunk":16', '"chunk":15', 1))
    status, _, err = replay(capsys, str(tree / target))
    assert status == 2 and "walkthrough-4.3-chunked-prefill.jsonl was altered" in err, err


def test_a_trace_missing_from_a_sub_tree_or_not_listed_in_it_is_found(tree, capsys):
    (tree / CONFORMANCE / "allocator" / "allocator-P1-1.jsonl").unlink()
    status, _, err = replay(capsys, str(tree / CONFORMANCE))
    assert status == 2 and "conformance/allocator/allocator-P1-1.jsonl is listed but missing" in err, err
    status, out, _ = replay(capsys, str(tree / "divergences"))  # outside what is missing: replayed
    assert status == 0 and "1 of 1" in out
    shutil.copy(tree / "divergences" / "sglang" / "SGL-1.jsonl", tree / "divergences" / "sglang" / "SGL-0.jsonl")
    status, _, err = replay(capsys, str(tree / "divergences"))
    assert status == 2 and "divergences/sglang/SGL-0.jsonl is not listed in index.json" in err, err


@pytest.mark.parametrize("path", ["../outside.jsonl", "/etc/x.jsonl", "a//b.jsonl", "a/./b.jsonl", "a/../b.jsonl",
                                  ".hidden/b.jsonl", "a\\b.jsonl", "a/b/", "a/b.json"])
def test_an_index_path_that_could_leave_the_tree_or_hide_is_refused(tree, capsys, path):
    index = json.loads((tree / INDEX).read_text())
    index["vectors"][0]["file"] = path
    (tree / INDEX).write_text(json.dumps(index))
    status, _, err = replay(capsys, str(tree))
    assert status == 2 and "not a kvspec vector index" in err and "vectors/0/file" in err, err


def test_a_version_1_index_of_a_flat_directory_still_reads_but_names_no_path(tree, capsys):
    flat = tree / CONFORMANCE / "allocator"
    (flat / INDEX).write_text(json.dumps({"kvspec_vectors": 1, "seed": 0, "vectors": [
        {"file": "allocator-P1-1.jsonl", "steps": 40, "sha256": json.loads((tree / INDEX).read_text())[
            "vectors"][0]["sha256"]}]}))
    status, out, _ = replay(capsys, str(flat))
    assert status == 0 and "1 of 1" in out, out
    (tree / INDEX).write_text((tree / INDEX).read_text().replace('"kvspec_vectors": 2', '"kvspec_vectors": 1'))
    status, _, err = replay(capsys, str(tree))
    assert status == 2 and re.search(r"vectors/\d+/file: '[^']*/[^']*' does not match '\^\[\^/\]\*\$'", err), err


def test_a_link_to_a_directory_inside_a_tree_is_refused_not_followed(tree, capsys, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(tree / "divergences" / "sglang" / "SGL-1.jsonl", outside / "SGL-1.jsonl")
    os.symlink(outside, tree / "divergences" / "elsewhere")
    status, _, err = replay(capsys, str(tree))
    assert status == 2 and "is a symbolic link to a directory" in err and "never through a link" in err, err
    with pytest.raises(TraceError, match="symbolic link to a directory"):
        write_index(tree, 0)


def test_an_index_above_that_is_another_tools_is_passed_over_and_a_broken_one_is_an_error(tmp_path, capsys):
    """The index of a tree is the nearest index.json at or above the directory replayed: a
    JSON index.json of another tool above it is not kvspec's and is passed over; one that
    says it is kvspec's must be valid; one in the directory itself must be kvspec's."""
    trace = tmp_path / "project" / "traces" / "t.jsonl"
    trace.parent.mkdir(parents=True)
    shutil.copy(TREE / CONFORMANCE / "allocator" / "allocator-P1-1.jsonl", trace)
    (tmp_path / "project" / INDEX).write_text('{"name": "a web project"}')
    status, out, err = replay(capsys, str(trace.parent))
    assert status == 0 and "1 of 1" in out, out + err
    (tmp_path / "project" / INDEX).write_text('{"kvspec_vectors": 2}')
    status, _, err = replay(capsys, str(trace))
    assert status == 2 and "'vectors' is a required property" in err, err
    (tmp_path / "project" / INDEX).unlink()
    (trace.parent / INDEX).write_text('{"name": "a web project"}')
    status, _, err = replay(capsys, str(trace.parent))
    assert status == 2 and "'kvspec_vectors' is a required property" in err, err


def test_a_trace_not_listed_replayed_alone_is_not_checked(tree, capsys):
    extra = tree / "tests" / "extra.jsonl"
    extra.parent.mkdir()
    shutil.copy(tree / "divergences" / "sglang" / "SGL-1.jsonl", extra)
    status, out, _ = replay(capsys, str(extra))
    assert status == 0 and "ok   extra.jsonl" in out, out
    assert load(extra) == load(tree / "divergences" / "sglang" / "SGL-1.jsonl")


def test_a_directory_above_a_tree_checks_each_trace_against_its_own_trees_index(tree, capsys):
    """Replaying a folder that holds a tree and loose traces: the loose ones have no index
    and are not checked, the tree's are checked against its index (an altered one found)."""
    loose = tree.parent / "loose"
    loose.mkdir()
    shutil.copy(tree / "divergences" / "sglang" / "SGL-1.jsonl", loose / "mine.jsonl")
    status, out, _ = replay(capsys, str(tree.parent))
    assert status == 0 and "4 of 4 trace(s)" in out and "ok   loose/mine.jsonl" in out, out
    (tree / "divergences" / "sglang" / "SGL-1.jsonl").unlink()
    status, _, err = replay(capsys, str(tree.parent))
    assert status == 2 and f"{tree / INDEX}: the traces of its tree do not match it: " \
                           "divergences/sglang/SGL-1.jsonl is listed but missing" in err, err
