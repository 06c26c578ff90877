"""The report as JSON (schemas/report.schema.json), and its validation."""

import json
from pathlib import Path

import jsonschema

from kvspec.spec.registry import INVARIANT_CLASSES

from .model import REPORT_SCHEMA_ID, SCHEMAS, CheckReport, RunResult, class_totals, verdict_counts


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
        "run": dict(run.run),
        "verdict": run.verdict,
        "examples": run.examples,
        "steps": run.steps,
        "seconds": round(run.seconds, 3),
        "clauses": list(run.clauses),
        "message": run.message,
        "trace": run.trace,
        "trace_steps": run.trace_steps,
        "replay_adapter": run.replay_adapter,
        "tallies": {name: {"checked": tally.checked, "violated": tally.violated, "skipped": tally.skipped}
                    for name, tally in sorted(run.tallies.items(), key=lambda item: INVARIANT_CLASSES.index(item[0]))},
        "skipped_because": {name: run.skipped_because[name]
                            for name in INVARIANT_CLASSES if name in run.skipped_because},
        "first_failure_seconds": None if run.first_failure_seconds is None else round(run.first_failure_seconds, 3),
        "first_failure_clauses": list(run.first_failure_clauses),
        "first_failure_step": run.first_failure_step,
        "shrink_seconds": None if run.shrink_seconds is None else round(run.shrink_seconds, 3),
        "shrink_budget_seconds": run.shrink_budget_seconds,
        "shrink_stopped_at_budget": run.shrink_stopped_at_budget,
        **({"other_failures": [dict(other) for other in run.other_failures]} if run.other_failures else {}),
    }


def to_json(report: CheckReport) -> dict:
    """The report as a report/2 document (see schemas/report.schema.json)."""
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
        **({"interrupted": {"signal": report.interrupted, "unfinished": list(report.unfinished)}}
           if report.interrupted else {}),
    }


def write_json(report: CheckReport, path: str | Path) -> None:
    """Write the report/2 document to `path` (creating its folder), after validating it:
    a document CI cannot read is a kvspec bug, and it should say so where it happens."""
    document = to_json(report)
    validate_json(document)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
