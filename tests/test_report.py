"""conformance/reports/: the run and class tables, the JSON report and its schema
(schemas/report.schema.json), JUnit XML and its XSD (schemas/junit.xsd).

One report holds every kind of run: two allocator runs that pass (one of them with
window liveness skipped), an engine run that violates I8 with a saved trace, one that
hung, one that crashed with control characters in its text, and one in which every
check was skipped."""

import copy
import json
import re
from xml.etree import ElementTree

import jsonschema
import pytest
import xmlschema
from report_helpers import description, run_result

from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.reports.json_report import (
    ReportSchemaError,
    load_report_schema,
    to_json,
    validate_json,
    write_json,
)
from kvspec.conformance.reports.junit import to_junit, write_junit
from kvspec.conformance.reports.model import (
    REPORT_SCHEMA_ID,
    SCHEMAS,
    TIERS,
    VERDICTS,
    CheckReport,
    ClassTally,
    RunResult,
    utc_now,
)
from kvspec.conformance.reports.text import class_table, run_table
from kvspec.spec.clauses import load_clauses
from kvspec.spec.registry import INVARIANT_CLASSES

TRACE = ".kvspec/traces/engine-P4-W6-I4.jsonl"
NO_TREE = "adapter lacks observable tree"
NO_FREE_IDS = "adapter lacks observable free-id sets"


def tallies(checked: int, **overrides: ClassTally) -> dict[str, ClassTally]:
    """Every class checked `checked` times, except the classes given."""
    return {name: overrides.get(name.replace("-", "_"), ClassTally(checked=checked)) for name in INVARIANT_CLASSES}


def sample_report() -> CheckReport:
    runs = [
        run_result(Run(1), "ok", examples=60, steps=1800, seconds=0.9, clauses=[],
                  tallies=tallies(1800)),
        run_result(Run(16), "ok", examples=60, steps=1700, seconds=1.0, clauses=[],
                  tallies=tallies(1700, window_liveness=ClassTally(skipped=1700)),
                  skipped_because={"window-liveness": NO_TREE}),
        run_result(Run(4, 6, 4), "violated", examples=37, steps=512, seconds=2.0, clauses=["I8"],
                  message="I8 window liveness: position 7 of request r2 is inside the window [5, 11)\n"
                          "but its SWA slot was freed\nFalsifying example: ...",
                  trace=TRACE, trace_steps=9, tallies=tallies(512, window_liveness=ClassTally(512, 1, 0))),
        run_result(Run(2, 5, 1), "hung", examples=3, steps=40, seconds=30.0, clauses=[],
                  message="no step finished within 30 s (decode of request r1)", tallies=tallies(40)),
        run_result(Run(1, 3, 4), "crashed", examples=1, steps=0, seconds=0.0, clauses=[],
                  message="RuntimeError: \x1b[31mCUDA error\x1b[0m\x00 in alloc_extend\nTraceback ..."),
        run_result(Run(16, 5, 4), "ok", examples=0, steps=0, seconds=0.1, clauses=[],
                  tallies={name: ClassTally(skipped=25) for name in INVARIANT_CLASSES},
                  skipped_because={name: NO_TREE if name in ("window-liveness", "mapping") else NO_FREE_IDS
                                   for name in INVARIANT_CLASSES}),
    ]
    return CheckReport("0.1.0", "sample_adapters:LEAKY", "sglang-0.5.23", "quick", seed=1,
                       started="2025-06-01T12:00:00Z", seconds=34.5, runs=runs)


def ok_report() -> CheckReport:
    report = sample_report()
    report.runs = [run for run in report.runs if run.verdict == "ok"]
    return report


# -- the data ----------------------------------------------------------------------------------

def test_exit_status_is_0_only_when_every_run_is_ok():
    assert sample_report().exit_status == 1
    assert ok_report().exit_status == 0


@pytest.mark.parametrize("change, complaint", [
    ({"verdict": "failed"}, "use one of"),
    ({"tier": "planner"}, "use one of"),
    ({"clauses": ["I8"]}, "an ok run has no violated clauses"),
    ({"verdict": "violated"}, "names the clause"),
    ({"verdict": "violated", "clauses": ["window"]}, "not a clause id"),
    ({"tallies": {"liveness": ClassTally()}}, "unknown invariant class 'liveness'"),
    ({"steps": -1}, "steps is -1"),
    ({"seconds": float("nan")}, "finite"),
    ({"trace_steps": 3}, "trace_steps without a trace"),
    ({"run": {}}, "must give the run's tier"),
    ({"tier": "engine"}, "with the same tier"),
])
def test_a_run_result_that_the_schema_would_refuse_fails_at_construction(change, complaint):
    fields = {"label": "allocator P=1", "tier": "allocator", "verdict": "ok", "examples": 1, "steps": 1,
              "seconds": 1.0, "clauses": [], "run": description(Run(1))}
    with pytest.raises(ValueError, match=re.escape(complaint)):
        RunResult(**{**fields, **change})


def test_started_must_be_utc():
    report = sample_report()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", utc_now())
    with pytest.raises(ValueError, match="utc_now"):
        CheckReport("0.1.0", "reference", "sglang-0.5.23", "quick", None, "2025-06-01T14:00:00+02:00", 1.0, report.runs)


# -- tables ------------------------------------------------------------------------------------

def test_run_table_has_a_row_per_run_with_its_result_clause_and_trace():
    table = run_table(sample_report())
    lines = table.splitlines()
    assert lines[0].split() == ["run", "examples", "steps", "steps/s", "found", "after", "shrinking", "result"]
    assert len(lines) == 1 + 6 + 1  # header, runs, total
    violated = next(line for line in lines if line.startswith("engine P=4 W=6 I=4"))
    assert violated.split()[4:7] == ["37", "512", "256"] and f"VIOLATED I8  trace {TRACE} (9 steps)" in violated
    assert "HUNG" in table and "CRASHED" in table and "SKIPPED (no check could run)" in table
    assert "ok, skips in 1 class" in next(line for line in lines if line.startswith("allocator P=16"))
    assert lines[-1].startswith("total (6 runs)") and lines[-1].endswith("3 ok, 1 VIOLATED, 1 CRASHED, 1 HUNG")
    # aligned: every row's result starts under the header's "result"; no trailing spaces
    column = lines[0].index("result")
    assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines)
    assert all(line == line.rstrip() for line in lines)


def test_class_table_has_a_row_per_invariant_class_with_why_skipped():
    lines = class_table(sample_report()).splitlines()
    assert lines[0].split()[:4] == ["class", "checked", "violated", "skipped"]
    assert [line.split()[0] for line in lines[1:]] == list(INVARIANT_CLASSES)
    liveness = next(line for line in lines if line.startswith("window-liveness"))
    assert liveness.split()[1:4] == [str(1800 + 512 + 40), "1", str(1700 + 25)]
    assert f"{NO_TREE} (2 runs)" in liveness
    leak = next(line for line in lines if line.startswith("leak"))
    assert leak.split()[1:4] == [str(1800 + 1700 + 512 + 40), "0", "25"] and f"{NO_FREE_IDS} (1 run)" in leak


def test_a_class_no_run_checked_says_so():
    report = sample_report()
    for run in report.runs:
        run.tallies.pop("atomicity", None)
        run.skipped_because.pop("atomicity", None)
    atomicity = next(line for line in class_table(report).splitlines() if line.startswith("atomicity"))
    assert atomicity.split()[1:4] == ["0", "0", "0"] and "not checked" in atomicity


# -- JSON --------------------------------------------------------------------------------------

def test_the_schema_is_a_versioned_2020_12_schema_that_agrees_with_the_spec():
    schema = load_report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == REPORT_SCHEMA_ID and "report/2" in REPORT_SCHEMA_ID
    definitions, run = schema["$defs"], schema["$defs"]["run"]["properties"]
    assert definitions["invariantClass"]["enum"] == list(INVARIANT_CLASSES)
    assert run["tier"]["enum"] == list(TIERS) and run["verdict"]["enum"] == list(VERDICTS)
    assert list(schema["properties"]["verdicts"]["properties"]) == list(VERDICTS)
    assert all(re.fullmatch(definitions["clauseId"]["pattern"], clause) for clause in load_clauses())


def test_the_json_report_validates_and_holds_every_run(tmp_path):
    report = sample_report()
    document = to_json(report)
    validate_json(document)
    assert document["schema"] == REPORT_SCHEMA_ID and document["exit_status"] == 1
    assert document["verdicts"] == {"ok": 3, "violated": 1, "crashed": 1, "hung": 1, "error": 0}
    assert [run["label"] for run in document["runs"]] == [run.label for run in report.runs]
    violated = document["runs"][2]
    assert (violated["clauses"], violated["trace"], violated["trace_steps"]) == (["I8"], TRACE, 9)
    assert violated["tallies"]["window-liveness"] == {"checked": 512, "violated": 1, "skipped": 0}
    assert document["classes"]["window-liveness"]["skipped_because"] == {
        NO_TREE: ["allocator P=16", "engine P=16 W=5 I=4"]}
    write_json(report, tmp_path / "reports" / "kvspec.json")
    assert json.loads((tmp_path / "reports" / "kvspec.json").read_text(encoding="utf-8")) == document
    validate_json(to_json(ok_report()))
    no_runs = ok_report()
    no_runs.runs = []
    validate_json(to_json(no_runs))


def broken(edit):
    document = to_json(sample_report())
    edit(document)
    return document


@pytest.mark.parametrize("document, where", [
    (broken(lambda document: document.pop("runs")), "'runs' is a required property"),
    (broken(lambda document: document["runs"][0].update(verdict="maybe")), "$.runs[0].verdict"),
    (broken(lambda document: document["runs"][0].update(clauses=["I2"])), "$.runs[0].clauses"),
    (broken(lambda document: document["runs"][2].update(clauses=[])), "$.runs[2].clauses"),
    (broken(lambda document: document["runs"][2].update(clauses=["window liveness"])), "$.runs[2].clauses[0]"),
    (broken(lambda document: document["runs"][2]["tallies"].update(liveness={"checked": 1, "violated": 0, "skipped": 0})),
     "$.runs[2].tallies"),
    (broken(lambda document: document["runs"][1].update(steps=-5)), "$.runs[1].steps"),
    (broken(lambda document: document["runs"][0].update(trace_steps=4)), "$.runs[0].trace_steps"),
    (broken(lambda document: document.update(exit_status=0)), "$.exit_status"),
    (broken(lambda document: document.update(schema="https://kvspec.dev/schemas/report/1")), "$.schema"),
    (broken(lambda document: document["runs"][0].pop("run")), "$.runs[0]"),
    (broken(lambda document: document.update(exit_status=2)), "$.exit_status"),
    (broken(lambda document: document.update(started="2025-06-01 12:00")), "$.started"),
    (broken(lambda document: document.update(verdict="ok")), "'verdict' was unexpected"),
])
def test_a_broken_json_report_is_rejected_naming_where(document, where):
    with pytest.raises(ReportSchemaError) as raised:
        validate_json(document)
    assert where in str(raised.value) and REPORT_SCHEMA_ID in str(raised.value)


def test_write_json_refuses_to_write_a_report_the_schema_rejects(tmp_path):
    report = sample_report()
    report.runs[0].verdict = "maybe"  # mutated after construction
    with pytest.raises(ReportSchemaError, match=re.escape("$.runs[0].verdict")):
        write_json(report, tmp_path / "kvspec.json")
    assert not (tmp_path / "kvspec.json").exists()


# -- JUnit XML ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def junit_xsd() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(SCHEMAS / "junit.xsd"))


def test_the_junit_report_validates_against_the_xsd(tmp_path, junit_xsd):
    write_junit(sample_report(), tmp_path / "reports" / "junit.xml")
    junit_xsd.validate(str(tmp_path / "reports" / "junit.xml"))
    junit_xsd.validate(to_junit(ok_report()))
    no_runs = ok_report()
    no_runs.runs = []
    junit_xsd.validate(to_junit(no_runs))


def test_junit_counts_match_the_runs():
    root = ElementTree.fromstring(to_junit(sample_report()))
    assert root.tag == "testsuites"
    assert {key: root.get(key) for key in ("tests", "failures", "errors", "skipped", "time")} == {
        "tests": "6", "failures": "1", "errors": "2", "skipped": "1", "time": "34.500"}
    allocator, engine = root.findall("testsuite")
    assert allocator.get("name") == "kvspec.sample_adapters_LEAKY.allocator"
    assert [allocator.get(key) for key in ("tests", "failures", "errors", "skipped", "time")] == ["2", "0", "0", "0", "1.900"]
    assert [engine.get(key) for key in ("tests", "failures", "errors", "skipped", "time")] == ["4", "1", "2", "1", "32.100"]
    for suite in (allocator, engine):
        assert suite.get("timestamp") == "2025-06-01T12:00:00"
        testcases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(testcases)
        for kind, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            assert int(suite.get(attribute)) == sum(testcase.find(kind) is not None for testcase in testcases)
        assert all(testcase.get("classname") == suite.get("name") for testcase in testcases)
    properties = {prop.get("name"): prop.get("value") for prop in engine.find("properties")}
    assert properties["adapter"] == "sample_adapters:LEAKY" and properties["seed"] == "1"


def test_junit_failure_error_and_skipped_say_what_and_where():
    testcases = {testcase.get("name"): testcase for testcase in ElementTree.fromstring(to_junit(sample_report())).iter("testcase")}
    failure = testcases["engine P=4 W=6 I=4"].find("failure")
    assert failure.get("type") == "I8"
    assert failure.get("message").startswith("violates I8: I8 window liveness: position 7")
    assert "but its SWA slot was freed" in failure.text and f"trace: {TRACE} (9 steps)" in failure.text
    hung, crashed = testcases["engine P=2 W=5 I=1"].find("error"), testcases["engine P=1 W=3 I=4"].find("error")
    assert hung.get("type") == "hung" and "within 30 s" in hung.get("message")
    # characters XML cannot hold are written as escapes, so the file stays readable
    assert crashed.get("type") == "crashed" and "\\x1b[31mCUDA error\\x1b[0m\\x00" in crashed.text
    skipped = testcases["engine P=16 W=5 I=4"].find("skipped")
    assert skipped.get("message") == (f"every check skipped: {NO_FREE_IDS} (alignment, window-bound, leak, ownership, "
                                      f"locks, atomicity, state, scheduling); {NO_TREE} (window-liveness, mapping)")
    passed = testcases["allocator P=16"]
    assert [child.tag for child in passed] == ["system-out"]
    assert f"window-liveness: 0 checked, 0 violated, 1700 skipped ({NO_TREE})" in passed.find("system-out").text


VALID_JUNIT = """<testsuites tests="1" failures="1" errors="0" skipped="0" time="1.0">
  <testsuite name="kvspec.reference.engine" tests="1" failures="1" errors="0" skipped="0" time="1.0"
             timestamp="2025-06-01T12:00:00">
    <properties><property name="profile" value="quick"/></properties>
    <testcase name="engine P=4 W=6 I=4" classname="kvspec.reference.engine" time="1.0">
      <failure message="violates I8" type="I8">trace: t.jsonl</failure>
      <system-out>...</system-out>
    </testcase>
  </testsuite>
</testsuites>"""


@pytest.mark.parametrize("old, new", [
    ('<testsuites tests="1"', '<testsuites tests="-1"'),
    (' name="engine P=4 W=6 I=4"', ""),
    (' type="I8"', ""),
    ('time="1.0">\n      <failure', 'time="1e3">\n      <failure'),
    ('timestamp="2025-06-01T12:00:00"', 'timestamp="2025-06-01T12:00:00+02:00"'),
    ("<system-out>...</system-out>", '<error message="m" type="crashed"/>'),
    ("<system-out>...</system-out>", "<flaky/>"),
    ("<properties>", '<testcase name="x" classname="y" time="0"/><properties>'),
    ('</testcase>', '</testcase><testcase name="engine P=4 W=6 I=4" classname="kvspec.reference.engine" time="0"/>'),
])
def test_the_xsd_rejects_invalid_junit(junit_xsd, old, new):
    assert junit_xsd.is_valid(VALID_JUNIT)
    assert VALID_JUNIT.count(old) == 1
    assert not junit_xsd.is_valid(VALID_JUNIT.replace(old, new))


def test_the_xsd_rejects_a_bare_testsuite_root(junit_xsd):
    suite = ElementTree.fromstring(VALID_JUNIT).find("testsuite")
    assert not junit_xsd.is_valid(ElementTree.tostring(suite, encoding="unicode"))


def test_reports_do_not_change_the_report(tmp_path):
    report = sample_report()
    before = copy.deepcopy(report)
    run_table(report)
    class_table(report)
    write_json(report, tmp_path / "kvspec.json")
    write_junit(report, tmp_path / "junit.xml")
    assert report == before
