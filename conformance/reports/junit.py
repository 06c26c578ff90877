"""The report as JUnit XML (schemas/junit.xsd): one test case per run, for CI systems."""

import re
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

from kvspec.spec.registry import INVARIANT_CLASSES

from .model import MESSAGE_ATTRIBUTE_LENGTH, CheckReport, RunResult, outcome, skip_reasons
from .text import plural, result_text

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
    counts = junit_counts(report.runs)
    counts.update(tests=str(int(counts["tests"]) + len(report.unfinished)),
                  skipped=str(int(counts["skipped"]) + len(report.unfinished)))
    root = ElementTree.Element("testsuites", {"name": xml_text(f"kvspec check --adapter {report.adapter}"),
                                              **counts, "time": junit_seconds(report.seconds)})
    settings = {"kvspec_version": report.kvspec_version, "adapter": report.adapter,
                "policy_version": report.policy_version, "profile": report.profile,
                "seed": "random" if report.seed is None else str(report.seed), "started": report.started}
    for tier in dict.fromkeys([*(run.tier for run in report.runs), *report.unfinished.values()]):
        runs = [run for run in report.runs if run.tier == tier]
        unfinished = [label for label, its_tier in report.unfinished.items() if its_tier == tier]
        name = suite_name(report, tier)
        counts = junit_counts(runs)
        counts.update(tests=str(int(counts["tests"]) + len(unfinished)),
                      skipped=str(int(counts["skipped"]) + len(unfinished)))
        suite = ElementTree.SubElement(root, "testsuite", {
            "name": name, **counts, "time": junit_seconds(sum(run.seconds for run in runs)),
            "timestamp": junit_timestamp(report.started)})
        properties = ElementTree.SubElement(suite, "properties")
        for key, value in settings.items():
            ElementTree.SubElement(properties, "property", name=key, value=xml_text(value))
        for run in runs:
            testcase = ElementTree.SubElement(suite, "testcase", name=xml_text(run.label), classname=name,
                                              time=junit_seconds(run.seconds))
            add_outcome(testcase, run)
            ElementTree.SubElement(testcase, "system-out").text = xml_text(run_output(run))
        for label in unfinished:  # not run to its end: nothing was proven either way
            testcase = ElementTree.SubElement(suite, "testcase", name=xml_text(label), classname=name, time="0.000")
            ElementTree.SubElement(testcase, "skipped", message=f"interrupted ({report.interrupted}) before this "
                                                                f"run finished")
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def write_junit(report: CheckReport, path: str | Path) -> None:
    """Write the report as JUnit XML to `path` (creating its folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_junit(report), encoding="utf-8")
