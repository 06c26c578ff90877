"""The report of one `kvspec check`: what it found, as two terminal tables and the two
files CI reads.

* `RunResult`: one state machine run (one tier at one configuration) and its verdict;
  `ClassTally`: per invariant class, the evaluations that ran, found a violation, or
  were skipped because the adapter lacks a capability or an observable. A skip is
  reported as a skip, never as a pass. `CheckReport`: all runs and the check's settings.
* `run_table` (one row per run) and `class_table` (one row per invariant class): plain
  aligned text.
* `to_json` / `write_json`: the document of `schemas/report.schema.json` (JSON Schema
  2020-12; its "$id", REPORT_SCHEMA_ID, names the format and its version: any change to
  the fields is a new version). `validate_json` checks a document against it.
* `to_junit` / `write_junit`: JUnit XML, the subset of `schemas/junit.xsd` that Jenkins,
  GitLab and the GitHub test-report actions read. One <testsuite> per tier, so a CI page
  shows at a glance which layer broke (and a tier the adapter lacks has no suite); one
  <testcase> per run. A violation is a <failure> whose type is the clause id; a crash
  or a hang is an <error> (the harness could not finish the run, so nothing was proven
  either way); a run in which every check was skipped is <skipped>.

Misuse fails at construction: a RunResult with an unknown verdict, tier or invariant
class, or clauses on an ok run, raises ValueError naming the field and the fix, so what
the dataclasses accept is what the schema accepts. (Fields changed after construction
are caught by write_json, which validates before it writes.) Run labels must be unique
within a tier: JUnit consumers key results on them.
"""

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from xml.etree import ElementTree

import jsonschema

from kvspec.spec.clauses import CLAUSE_ID
from kvspec.spec.registry import INVARIANT_CLASSES

REPORT_SCHEMA_ID = "https://kvspec.dev/schemas/report/1"
TIERS = ("allocator", "engine")
VERDICTS = ("ok", "violated", "crashed", "hung")
UTC_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|\+00:00)")
"""`CheckReport.started`: ISO 8601 in UTC, as `utc_now()` writes it (the schema's pattern)."""
SCHEMAS = Path(__file__).resolve().parent / "schemas"
"""report.schema.json and junit.xsd; they ship in the package (package data)."""
MESSAGE_ATTRIBUTE_LENGTH = 200
"""A JUnit `message` attribute is the one-line summary; the full text goes in the element."""


# -- the data --------------------------------------------------------------------------------

@dataclass
class ClassTally:
    """The evaluations of one invariant class over one run."""

    checked: int = 0  # invariant evaluations that ran (one per registered check per step)
    violated: int = 0  # evaluations that found a violation
    skipped: int = 0  # evaluations not run because the adapter lacks a capability or an observable


@dataclass
class RunResult:
    """One state machine run: one tier at one configuration."""

    label: str  # e.g. "engine P=4 W=6 I=4"
    tier: str  # "allocator" | "engine"
    verdict: str  # "ok" | "violated" | "crashed" | "hung"
    examples: int
    steps: int  # checked steps
    seconds: float
    clauses: list[str]  # violated clause ids, e.g. ["I8"]; empty when ok
    message: str = ""  # the violation or crash text
    trace: str | None = None  # path of the saved shrunk trace (JSON Lines)
    trace_steps: int | None = None  # its length in steps
    tallies: dict[str, ClassTally] = field(default_factory=dict)
    skipped_because: dict[str, str] = field(default_factory=dict)  # class -> "adapter lacks observable tree"
    first_failure_seconds: float | None = None  # to the first failing example, before shrinking
    first_failure_clauses: list[str] = field(default_factory=list)  # what that example broke
    picture: str | None = None  # path of the picture of the run (kvspec check --plot), not in the JSON report

    def __post_init__(self):
        where = f"RunResult {self.label!r}"
        require(bool(self.label), "RunResult needs a label, e.g. 'engine P=4 W=6 I=4'")
        require(self.tier in TIERS, f"{where}: tier {self.tier!r}; use one of {TIERS}")
        require(self.verdict in VERDICTS, f"{where}: verdict {self.verdict!r}; use one of {VERDICTS}")
        require_count(self.examples, f"{where}: examples")
        require_count(self.steps, f"{where}: steps")
        require_seconds(self.seconds, f"{where}: seconds")
        for clause in self.clauses:
            require(re.fullmatch(CLAUSE_ID, clause) is not None,
                    f"{where}: clause {clause!r} is not a clause id such as 'I8' or 'ALLOC-3'")
        require(len(set(self.clauses)) == len(self.clauses), f"{where}: clause listed twice in {self.clauses}")
        if self.verdict == "ok":
            require(not self.clauses and self.trace is None,
                    f"{where}: an ok run has no violated clauses and no trace; set verdict='violated'")
        if self.verdict == "violated":
            require(bool(self.clauses), f"{where}: a violated run names the clause(s) it violated in `clauses`")
        if self.trace is None:
            require(self.trace_steps is None, f"{where}: trace_steps without a trace")
        else:
            require(bool(self.trace), f"{where}: trace is a path or None, not ''")
        if self.trace_steps is not None:
            require_count(self.trace_steps, f"{where}: trace_steps")
        for name in (*self.tallies, *self.skipped_because):
            require(name in INVARIANT_CLASSES, f"{where}: unknown invariant class {name!r}; use one of {INVARIANT_CLASSES}")
        for name, tally in self.tallies.items():
            for count in ("checked", "violated", "skipped"):
                require_count(getattr(tally, count), f"{where}: tallies[{name!r}].{count}")
        for name, reason in self.skipped_because.items():
            require(bool(reason), f"{where}: skipped_because[{name!r}] is empty; say what the adapter lacks")


@dataclass
class CheckReport:
    """Every run of one `kvspec check`, and the settings it ran with."""

    kvspec_version: str
    adapter: str
    policy_version: str
    profile: str
    seed: int | None
    started: str  # ISO 8601 UTC, see utc_now()
    seconds: float
    runs: list[RunResult]

    def __post_init__(self):
        for name in ("kvspec_version", "adapter", "policy_version", "profile"):
            require(bool(getattr(self, name)), f"CheckReport: {name} is empty")
        require(UTC_TIMESTAMP.fullmatch(self.started) is not None,
                f"CheckReport: started {self.started!r} is not ISO 8601 UTC; write it with report.utc_now()")
        require_seconds(self.seconds, "CheckReport: seconds")

    @property
    def exit_status(self) -> int:
        """0 when every run is ok, else 1 (the exit status of `kvspec check`)."""
        return 0 if all(run.verdict == "ok" for run in self.runs) else 1


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def require_count(value, what: str) -> None:
    require(isinstance(value, int) and value >= 0, f"{what} is {value!r}; a count is an int >= 0")


def require_seconds(value, what: str) -> None:
    require(isinstance(value, (int, float)) and math.isfinite(value) and value >= 0,
            f"{what} is {value!r}; seconds are a finite number >= 0")


def utc_now() -> str:
    """Now, as `CheckReport.started` wants it: '2025-06-01T12:00:00Z'."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- reading the data --------------------------------------------------------------------------

def every_check_skipped(run: RunResult) -> bool:
    """No evaluation ran, and some were skipped: the adapter lacks what every check needs."""
    checked = sum(tally.checked for tally in run.tallies.values())
    skipped = sum(tally.skipped for tally in run.tallies.values())
    return checked == 0 and skipped > 0


def outcome(run: RunResult) -> str:
    """The run as a JUnit testcase: 'passed', 'failure', 'error' or 'skipped'."""
    if run.verdict in ("crashed", "hung"):
        return "error"
    if run.verdict == "violated":
        return "failure"
    return "skipped" if every_check_skipped(run) else "passed"


def skip_reasons(run: RunResult) -> dict[str, str]:
    """Why each class with skipped evaluations was skipped, in class order."""
    return {name: run.skipped_because.get(name, "no reason given")
            for name in INVARIANT_CLASSES if name in run.tallies and run.tallies[name].skipped}


def class_totals(report: CheckReport) -> dict[str, dict]:
    """Per invariant class (all of them, in INVARIANT_CLASSES order): its tallies summed
    over all runs, and each reason given for skips with the labels of the runs that gave it."""
    totals = {name: {"checked": 0, "violated": 0, "skipped": 0, "skipped_because": {}} for name in INVARIANT_CLASSES}
    for run in report.runs:
        for name, tally in run.tallies.items():
            total = totals[name]
            total["checked"] += tally.checked
            total["violated"] += tally.violated
            total["skipped"] += tally.skipped
        for name, reason in skip_reasons(run).items():
            totals[name]["skipped_because"].setdefault(reason, []).append(run.label)
    return totals


def verdict_counts(report: CheckReport) -> dict[str, int]:
    counted = Counter(run.verdict for run in report.runs)
    return {verdict: counted[verdict] for verdict in VERDICTS}


# -- tables ------------------------------------------------------------------------------------

def aligned(rows: list[list[str]], right_aligned: set[int]) -> str:
    """Rows of cells as text columns two spaces apart, without trailing spaces."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(width) if column in right_aligned else cell.ljust(width)
                               for column, (cell, width) in enumerate(zip(row, widths))).rstrip()
                     for row in rows)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{'es' if noun.endswith('s') else 's'}"


def rate(steps: int, seconds: float) -> str:
    return f"{steps / seconds:.0f}" if seconds > 0 else "-"


def result_text(run: RunResult) -> str:
    """The result column: the verdict, the violated clauses, the saved trace."""
    if run.verdict == "ok":
        if every_check_skipped(run):
            return "SKIPPED (no check could run)"
        skipped_classes = len(skip_reasons(run))
        return f"ok, skips in {plural(skipped_classes, 'class')}" if skipped_classes else "ok"
    text = run.verdict.upper()
    if run.clauses:
        text += " " + ", ".join(run.clauses)
    if run.trace is not None:
        length = f" ({run.trace_steps} steps)" if run.trace_steps is not None else ""
        text += f"  trace {run.trace}{length}"
    return text


def run_table(report: CheckReport) -> str:
    """One row per run (examples, checked steps, steps per second, result) and a total."""
    rows = [["run", "examples", "steps", "steps/s", "result"]]
    for run in report.runs:
        rows.append([run.label, str(run.examples), str(run.steps), rate(run.steps, run.seconds), result_text(run)])
    counts = verdict_counts(report)
    summary = ", ".join(f"{count} {verdict if verdict == 'ok' else verdict.upper()}"
                        for verdict, count in counts.items() if count)
    rows.append([f"total ({len(report.runs)} runs)", str(sum(run.examples for run in report.runs)),
                 str(sum(run.steps for run in report.runs)),
                 rate(sum(run.steps for run in report.runs), sum(run.seconds for run in report.runs)),
                 summary or "no runs"])
    return aligned(rows, right_aligned={1, 2, 3})


def class_table(report: CheckReport) -> str:
    """One row per invariant class over all runs: evaluations checked, violated, skipped,
    and why skipped (each reason, with how many runs gave it)."""
    rows = [["class", "checked", "violated", "skipped", "why skipped"]]
    for name, total in class_totals(report).items():
        if total["skipped_because"]:
            why = "; ".join(f"{reason} ({plural(len(labels), 'run')})"
                            for reason, labels in total["skipped_because"].items())
        elif total["checked"] == 0:
            why = "not checked: no check of this class in these runs"
        else:
            why = ""
        rows.append([name, str(total["checked"]), str(total["violated"]), str(total["skipped"]), why])
    return aligned(rows, right_aligned={1, 2, 3})


# -- JSON --------------------------------------------------------------------------------------

class ReportSchemaError(ValueError):
    """A document that does not match the report schema; `problems` lists each mismatch
    as '$.path: what is wrong'."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(f"not a {REPORT_SCHEMA_ID} document:\n  " + "\n  ".join(problems))


def load_report_schema() -> dict:
    """schemas/report.schema.json, read from the installed package."""
    return json.loads((SCHEMAS / "report.schema.json").read_text(encoding="utf-8"))


def validate_json(document: dict) -> None:
    """Raise ReportSchemaError unless `document` is a valid report (every problem listed)."""
    validator = jsonschema.Draft202012Validator(load_report_schema())
    problems = sorted(f"{error.json_path}: {error.message}" for error in validator.iter_errors(document))
    if problems:
        raise ReportSchemaError(problems)


def run_json(run: RunResult) -> dict:
    return {
        "label": run.label,
        "tier": run.tier,
        "verdict": run.verdict,
        "examples": run.examples,
        "steps": run.steps,
        "seconds": round(run.seconds, 3),
        "clauses": list(run.clauses),
        "message": run.message,
        "trace": run.trace,
        "trace_steps": run.trace_steps,
        "tallies": {name: {"checked": tally.checked, "violated": tally.violated, "skipped": tally.skipped}
                    for name, tally in sorted(run.tallies.items(), key=lambda item: INVARIANT_CLASSES.index(item[0]))},
        "skipped_because": {name: run.skipped_because[name]
                            for name in INVARIANT_CLASSES if name in run.skipped_because},
        "first_failure_seconds": None if run.first_failure_seconds is None else round(run.first_failure_seconds, 3),
        "first_failure_clauses": list(run.first_failure_clauses),
    }


def to_json(report: CheckReport) -> dict:
    """The report as a report/1 document (see schemas/report.schema.json)."""
    return {
        "schema": REPORT_SCHEMA_ID,
        "kvspec_version": report.kvspec_version,
        "adapter": report.adapter,
        "policy_version": report.policy_version,
        "profile": report.profile,
        "seed": report.seed,
        "started": report.started,
        "seconds": round(report.seconds, 3),
        "exit_status": report.exit_status,
        "verdicts": verdict_counts(report),
        "classes": class_totals(report),
        "runs": [run_json(run) for run in report.runs],
    }


def write_json(report: CheckReport, path: str | Path) -> None:
    """Write the report/1 document to `path` (creating its folder), after validating it:
    a document CI cannot read is a kvspec bug, and it should say so where it happens."""
    document = to_json(report)
    validate_json(document)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


# -- JUnit XML ---------------------------------------------------------------------------------

NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
"""Characters XML 1.0 cannot hold, even escaped (a crash text may carry them)."""


def xml_text(text: str) -> str:
    """`text` with every character XML cannot hold written as a Python escape ('\\x1b')."""
    return NOT_XML.sub(lambda found: repr(found[0])[1:-1], text)


def one_line(text: str) -> str:
    """The first non-empty line of `text`, cut to MESSAGE_ATTRIBUTE_LENGTH characters."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= MESSAGE_ATTRIBUTE_LENGTH else line[:MESSAGE_ATTRIBUTE_LENGTH - 3] + "..."


def junit_seconds(seconds: float) -> str:
    return f"{max(seconds, 0.0):.3f}"


def junit_timestamp(started: str) -> str:
    """Ant's timestamp form, which every consumer parses: '2025-06-01T12:00:00' (UTC, no zone)."""
    return started[:len("2025-06-01T12:00:00")]  # CheckReport holds it in UTC_TIMESTAMP form


def junit_counts(runs: list[RunResult]) -> dict[str, str]:
    outcomes = Counter(outcome(run) for run in runs)
    return {"tests": str(len(runs)), "failures": str(outcomes["failure"]), "errors": str(outcomes["error"]),
            "skipped": str(outcomes["skipped"])}


def suite_name(report: CheckReport, tier: str) -> str:
    """`kvspec.ADAPTER.TIER`, the testcases' classname: Jenkins shows it as package
    kvspec.ADAPTER, class TIER; dots and colons in the adapter would split it further."""
    return f"kvspec.{re.sub(r'[^A-Za-z0-9_-]+', '_', report.adapter)}.{tier}"


def run_output(run: RunResult) -> str:
    """The testcase's system-out: the run in one line, then each class's tallies."""
    headline = (f"{run.label}: {result_text(run)}; {plural(run.examples, 'example')}, "
                f"{plural(run.steps, 'checked step')} in {run.seconds:.1f} s")
    lines = [headline]
    reasons = skip_reasons(run)
    for name in INVARIANT_CLASSES:
        if name in run.tallies:
            tally = run.tallies[name]
            why = f" ({reasons[name]})" if name in reasons else ""
            lines.append(f"{name}: {tally.checked} checked, {tally.violated} violated, {tally.skipped} skipped{why}")
    return "\n".join(lines) + "\n"


def summary_line(head: str, message: str) -> str:
    """A JUnit `message` attribute: `head`, then the first line of the message if any."""
    first = one_line(message)
    return xml_text(f"{head}: {first}" if first else head)


def add_outcome(testcase: ElementTree.Element, run: RunResult) -> None:
    """The testcase's failure, error or skipped element; nothing for a passed run."""
    kind = outcome(run)
    trace = ""
    if run.trace is not None:
        trace = f"\n\ntrace: {run.trace}" + (f" ({run.trace_steps} steps)" if run.trace_steps is not None else "")
    if kind == "failure":
        clauses = ", ".join(run.clauses)
        element = ElementTree.SubElement(testcase, "failure", message=summary_line(f"violates {clauses}", run.message),
                                         type=clauses)
        element.text = xml_text((run.message + trace).strip() + "\n")
    elif kind == "error":
        element = ElementTree.SubElement(testcase, "error", message=summary_line(run.verdict, run.message),
                                         type=run.verdict)
        element.text = xml_text((run.message + trace).strip() + "\n")
    elif kind == "skipped":
        classes_by_reason: dict[str, list[str]] = {}
        for name, reason in skip_reasons(run).items():
            classes_by_reason.setdefault(reason, []).append(name)
        reasons = "; ".join(f"{reason} ({', '.join(names)})" for reason, names in classes_by_reason.items())
        ElementTree.SubElement(testcase, "skipped", message=xml_text(f"every check skipped: {reasons}"))


def to_junit(report: CheckReport) -> str:
    """The report as JUnit XML (see schemas/junit.xsd): one testsuite per tier, in the
    order the runs first name them; one testcase per run."""
    root = ElementTree.Element("testsuites", {"name": xml_text(f"kvspec check --adapter {report.adapter}"),
                                              **junit_counts(report.runs), "time": junit_seconds(report.seconds)})
    settings = {"kvspec_version": report.kvspec_version, "adapter": report.adapter,
                "policy_version": report.policy_version, "profile": report.profile,
                "seed": "random" if report.seed is None else str(report.seed), "started": report.started}
    for tier in dict.fromkeys(run.tier for run in report.runs):
        runs = [run for run in report.runs if run.tier == tier]
        name = suite_name(report, tier)
        suite = ElementTree.SubElement(root, "testsuite", {
            "name": name, **junit_counts(runs), "time": junit_seconds(sum(run.seconds for run in runs)),
            "timestamp": junit_timestamp(report.started)})
        properties = ElementTree.SubElement(suite, "properties")
        for key, value in settings.items():
            ElementTree.SubElement(properties, "property", name=key, value=xml_text(value))
        for run in runs:
            testcase = ElementTree.SubElement(suite, "testcase", name=xml_text(run.label), classname=name,
                                              time=junit_seconds(run.seconds))
            add_outcome(testcase, run)
            ElementTree.SubElement(testcase, "system-out").text = xml_text(run_output(run))
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def write_junit(report: CheckReport, path: str | Path) -> None:
    """Write the report as JUnit XML to `path` (creating its folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_junit(report), encoding="utf-8")
