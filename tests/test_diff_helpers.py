"""`kvspec diff-helpers`: CrossHair finds an adapter's off-by-one helpers, passes its
faithful ones, survives a hanging one, and refuses a `helpers` mapping it cannot use
with a message that says how to fix it. (Adapters in helper_adapters.py.)"""

import argparse
import json
import re
from pathlib import Path

import pytest

from kvspec.conformance.harness.protocol import AdapterError
from kvspec.conformance.review.diff_helpers import add_command
from kvspec.conformance.review.helper_sides import conjuncts

TESTS = Path(__file__).resolve().parent
BUDGET = "3"  # CrossHair CPU seconds per helper: both bugs below are found within 1


@pytest.fixture(autouse=True)
def adapters_importable(monkeypatch):
    # The adapters are loaded as `helper_adapters:NAME`; the CrossHair subprocesses
    # inherit this process's sys.path.
    monkeypatch.syspath_prepend(str(TESTS))


def diff_helpers(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kvspec")
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["diff-helpers", "--per-condition-timeout", BUDGET, *argv])
    return args.func(args)


def test_faithful_helpers_behave_the_same(tmp_path, capsys):
    """Three helpers written another way than the spec's; the ceil_page copy differs from
    the spec's for a negative page size, which the spec's preconditions exclude."""
    report = tmp_path / "report.json"
    assert diff_helpers("--adapter", "helper_adapters:FAITHFUL", "--json", str(report)) == 0
    out = capsys.readouterr().out
    assert "DIFFERENT" not in out and "error" not in out
    results = json.loads(report.read_text())
    assert results["exit_status"] == 0
    assert {row["helper"]: row["verdict"] for row in results["helpers"]} == {
        "pages.ceil_page": "same", "pages.new_pages_for_decode": "same", "window.eviction_frontier": "same"}


def test_off_by_one_helpers_differ_with_their_counterexamples(tmp_path, capsys):
    report = tmp_path / "report.json"
    assert diff_helpers("--adapter", "helper_adapters:OFF_BY_ONE", "--json", str(report)) == 1
    out = capsys.readouterr().out
    results = {row["helper"]: row for row in json.loads(report.read_text())["helpers"]}
    assert {helper: row["verdict"] for helper, row in results.items()} == {
        "pages.ceil_page": "DIFFERENT", "window.eviction_frontier": "DIFFERENT"}, out
    # ceil_page of a page multiple: the spec's keeps it, the bug adds a page
    found = results["pages.ceil_page"]["counterexamples"][0]
    x, page_size = (int(value) for value in re.fullmatch(r"x=(-?\d+), page_size=(-?\d+)", found["given"]).groups())
    assert x % page_size == 0 and found == {"given": found["given"], "spec": f"returns {x}",
                                            "adapter": f"returns {x + page_size}"}
    assert f"given ({found['given']}): spec returns {x}, adapter returns {x + page_size}" in out
    # the frontier without its page floor: a cursor inside a page
    found = results["window.eviction_frontier"]["counterexamples"][0]
    page_size = int(re.search(r"page_size=(\d+)", found["given"])[1])
    new_cursor = int(re.search(r"new_cursor=(\d+)", found["adapter"])[1])
    assert new_cursor % page_size != 0, found
    assert "window.eviction_frontier differs from kvspec.spec.window.eviction_frontier" in out


def test_a_hanging_helper_is_an_error_and_the_run_goes_on(capsys):
    assert diff_helpers("--adapter", "helper_adapters:HANGING", "--helper-timeout", "5") == 2
    out = capsys.readouterr().out
    assert "pages.ceil_page: could not compare: timed out after 5 s" in out


def test_a_helpers_mapping_that_cannot_be_used_is_refused_with_every_problem():
    with pytest.raises(AdapterError) as refused:
        diff_helpers("--adapter", "helper_adapters:BAD_MAPPING")
    message = str(refused.value)
    assert "kvspec.spec has no helper 'pages.ceil'; did you mean pages.ceil_page or" in message
    assert "helpers['pages.pages_for']: 42 is not callable" in message
    assert ("floor_page_of_one(x) cannot be called like the spec's pages.floor_page(x, page_size)"
            in message and "take the same parameters, in the same order" in message)
    assert "helpers['window.swa_tail_len']" in message and "define it with `def` at module level" in message
    assert "cannot find 'helper_adapters:no_such_function'" in message

    with pytest.raises(AdapterError, match="`helpers` must be a mapping"):
        diff_helpers("--adapter", "helper_adapters:NOT_A_MAPPING")
    with pytest.raises(AdapterError, match="does not expose pages.floor_page; it exposes pages.ceil_page"):
        diff_helpers("--adapter", "helper_adapters:HANGING", "--helper", "pages.floor_page")


def test_an_adapter_without_helpers_has_nothing_to_compare(capsys):
    assert diff_helpers("--adapter", "helper_adapters:NO_HELPERS") == 0
    assert "exposes no helpers: nothing to compare" in capsys.readouterr().out


def test_preconditions_are_split_into_single_comparisons():
    """CrossHair is told to satisfy each comparison on its own (what makes it find the
    frontier bug above within the budget)."""
    assert conjuncts(["page_size >= 1 and 0 <= prefix_len <= seq_len", "x % page_size == 0"]) == [
        "page_size >= 1", "0 <= prefix_len", "prefix_len <= seq_len", "x % page_size == 0"]
