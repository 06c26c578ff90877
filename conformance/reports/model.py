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

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kvspec.spec.clauses import CLAUSE_ID
from kvspec.spec.registry import INVARIANT_CLASSES

REPORT_SCHEMA_ID = "https://kvspec.dev/schemas/report/2"
TIERS = ("allocator", "engine", "scheduler")
VERDICTS = ("ok", "violated", "crashed", "hung", "error")
"""error: the adapter could not build the implementation of this run (an AdapterError in
its worker), or its own code failed reading the engine (an attribute gone, a signature
changed: harness/built_for.adapter_fault), or the implementation is not deterministic (the
same steps ran differently: runs/runner.nondeterministic), so nothing it did can be
searched or replayed; the other runs' verdicts stand."""
FAILED = ("violated", "crashed", "hung")
"""The verdicts that are a failure of the implementation (exit status 1)."""
INTERRUPTS = {"SIGHUP": 1, "SIGINT": 2, "SIGTERM": 15}
"""The signals that stop a check with a partial report (a closed terminal, Ctrl-C, a
cancelled CI job)."""
RUN_FIELDS = ("tier", "page_size", "window", "interval", "state_grid", "state", "policy_version", "memory_model")
"""`RunResult.run`: the run's configuration, as its plan made it (plan.PlannedRun.description)."""
UTC_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|\+00:00)")
"""`CheckReport.started`: ISO 8601 in UTC, as `utc_now()` writes it (the schema's pattern)."""
SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
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
    tier: str  # "allocator" | "engine" | "scheduler"
    verdict: str  # "ok" | "violated" | "crashed" | "hung" | "error"
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
    first_failure_step: int | None = None  # steps checked, over every example, before the first failing one
    shrink_seconds: float | None = None  # from the first failing example to the end of shrinking; None: not shrunk
    shrink_budget_seconds: float | None = None  # the budget it shrank under
    shrink_stopped_at_budget: bool = False  # shrinking was cut at the budget, not finished
    picture: str | None = None  # path of the picture of the run (kvspec check --plot), not in the JSON report
    replay_adapter: str | None = None  # the adapter the trace fails on, when not the checked one (a differential's other)
    run: dict = field(default_factory=dict)  # its configuration, RUN_FIELDS: what reports and tables read, never the label
    cause: str = ""  # a crash's own traceback, where the implementation raised (not in the JSON report)
    other_failures: list[dict] = field(default_factory=list)
    """With --multiple-bugs, each further distinct failure of the run: its verdict, clauses,
    message, trace, trace_steps and replay_adapter, as the run's own fields give its first."""

    def __post_init__(self):
        where = f"RunResult {self.label!r}"
        require(bool(self.label), "RunResult needs a label, e.g. 'engine P=4 W=6 I=4'")
        require(self.tier in TIERS, f"{where}: tier {self.tier!r}; use one of {TIERS}")
        require(self.verdict in VERDICTS, f"{where}: verdict {self.verdict!r}; use one of {VERDICTS}")
        require(set(self.run) == set(RUN_FIELDS) and self.run["tier"] == self.tier,
                f"{where}: run {self.run!r} must give the run's {', '.join(RUN_FIELDS)} (its planned run's "
                f"description), with the same tier")
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
    interrupted: str | None = None
    """The signal that stopped the check before every run finished ("SIGHUP", "SIGINT",
    "SIGTERM"), or None: `runs` are those that finished, `unfinished` the rest."""
    unfinished: dict[str, str] = field(default_factory=dict)
    """The label and tier of each run that did not finish."""

    def __post_init__(self):
        require(self.interrupted in INTERRUPTS or self.interrupted is None,
                f"CheckReport: interrupted {self.interrupted!r}; use one of {tuple(INTERRUPTS)} or None")
        require(self.interrupted is not None or not self.unfinished,
                "CheckReport: unfinished runs without an interruption; set interrupted")
        for name in ("kvspec_version", "adapter", "policy_version", "profile"):
            require(bool(getattr(self, name)), f"CheckReport: {name} is empty")
        require(UTC_TIMESTAMP.fullmatch(self.started) is not None,
                f"CheckReport: started {self.started!r} is not ISO 8601 UTC; write it with report.utc_now()")
        require_seconds(self.seconds, "CheckReport: seconds")

    @property
    def exit_status(self) -> int:
        """The exit status of `kvspec check`: 0 when every run is ok; 1 when a run failed
        (violated, crashed, hung); else 2 when a run ended in an adapter error; 128 + the
        signal's number when it was interrupted, as a shell reports a process it stopped."""
        if self.interrupted is not None:
            return 128 + INTERRUPTS[self.interrupted]
        if any(run.verdict in FAILED for run in self.runs):
            return 1
        return 2 if any(run.verdict == "error" for run in self.runs) else 0


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
    if run.verdict in ("crashed", "hung", "error"):
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
