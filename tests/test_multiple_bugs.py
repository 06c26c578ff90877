"""`kvspec check --multiple-bugs`: a run searches on past its first failure and reports each
distinct one (failures of distinct clauses are distinct bugs: checks.failure_class), each
shrunk and saved as a trace that replays it. Without it a run ends at its first."""

import json

from kvspec.conformance.cli import main
from kvspec.conformance.harness.trace import load

ADAPTER = "tests.sample_adapters:TWO_BUGS"


def check(tmp_path, *more) -> dict:
    report = tmp_path / "report.json"
    status = main(["check", "--adapter", ADAPTER, "--run", "allocator P=4", "--profile", "quick", "--seed", "0",
                   "-n", "1", "--traces", str(tmp_path / "traces"), "--json", str(report), *more])
    assert status == 1
    return json.loads(report.read_text())["runs"][0]


def test_each_distinct_bug_of_a_run_is_reported_with_its_own_trace(tmp_path, capsys):
    run = check(tmp_path, "--multiple-bugs")
    found = [run, *run["other_failures"]]
    # one failure breaks I15 (the decode), another I2 (the free), never both at once
    assert any("I15" in each["clauses"] for each in found) and any("I2" in each["clauses"] for each in found)
    assert not any({"I15", "I2"} <= set(each["clauses"]) for each in found)
    assert len({tuple(each["clauses"]) for each in found}) == len(found), "each is a distinct failure"
    for each in found:  # each trace is its own bug's: its last step breaks its clauses
        trace = load(each["trace"])
        assert len(trace.steps) == each["trace_steps"] and set(trace.violated) == set(each["clauses"])
    assert "; and VIOLATED" in capsys.readouterr().out


def test_without_it_a_run_reports_one(tmp_path):
    run = check(tmp_path)
    assert run["clauses"] and "other_failures" not in run
