"""The report as text: a table per run and one per invariant class, as `kvspec check` prints them."""

from .model import CheckReport, RunResult, class_totals, every_check_skipped, skip_reasons, verdict_counts


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
    for other in run.other_failures:  # --multiple-bugs
        text += f"; and {other['verdict'].upper()} {', '.join(other['clauses'])}".rstrip()
    return text


def shrinking_text(run: RunResult) -> str:
    """How long a failing run shrank, and whether it stopped at its budget."""
    if run.shrink_seconds is None:
        return "-"
    return f"{run.shrink_seconds:.1f} s" + (f" (stopped at {run.shrink_budget_seconds:g} s)"
                                            if run.shrink_stopped_at_budget else "")


def run_table(report: CheckReport) -> str:
    """One row per run (examples, checked steps, steps per second, the time to its first
    counterexample and the time spent shrinking it, result) and a total."""
    rows = [["run", "examples", "steps", "steps/s", "found after", "shrinking", "result"]]
    for run in report.runs:
        found = "-" if run.first_failure_seconds is None else f"{run.first_failure_seconds:.1f} s"
        rows.append([run.label, str(run.examples), str(run.steps), rate(run.steps, run.seconds), found,
                     shrinking_text(run), result_text(run)])
    counts = verdict_counts(report)
    summary = ", ".join(f"{count} {verdict if verdict == 'ok' else verdict.upper()}"
                        for verdict, count in counts.items() if count)
    rows.append([f"total ({len(report.runs)} runs)", str(sum(run.examples for run in report.runs)),
                 str(sum(run.steps for run in report.runs)),
                 rate(sum(run.steps for run in report.runs), sum(run.seconds for run in report.runs)), "", "",
                 summary or "no runs"])
    return aligned(rows, right_aligned={1, 2, 3, 4})


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
