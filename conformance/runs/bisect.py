"""`kvspec bisect`: one trace replayed on every member of an adapter family, to find where
the failure it records comes and goes.

A family such as `sglang@` has a member per release of an engine and per tree and knobs
of each release. Its `Family` says in which order the versions came (`versions_at`), and
each member's version and line (`placed_at`): the members of one line differ only by
their version (say SGLang's Python tree at its release's default knobs). One process
imports one release of an engine, so the members of one version are replayed by one
process of their own (a harness process: each replay runs in a worker it forks, so a
crash or a hang of the engine is an outcome, not the end of the bisection). The harness
still never imports an adapter; it reads the family's members and their placement only.

Each member replays the trace at its own policy version (`at_own_policy`), without
comparing the trace's expected observables (they differ between versions), and:

  reproduces    fails on a clause the trace records broken (its header's `violates`,
                else its recorded step's `violated`), or crashes (hangs) where that was
                the recorded failure
  passes        every step, no violation
  fails         fails otherwise: on other clauses (which are said)
  cannot-run    lacks what the trace needs (replay.unmet_requirements), or cannot be
                built here (its release is not installed: the message says how to)

Then, per line, the versions it reproduces on, the first affected and the first fixed
(the first version after the last that reproduces). Exit status: 0 when it ran, whatever
it found; 2 for bad input (an unknown family or member, an unreadable or malformed trace,
a trace that records no failure).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kvspec.spec.window import EVERY_GROUP, Policy

from ..harness import families
from ..harness.isolation import LOAD_SECONDS, MEMORY_LIMIT, ForkserverDied, Journal, Lost, run_jobs
from ..harness.outputs import output_file, write_text
from ..harness.protocol import Adapter, AdapterError, load_adapter
from ..harness.replay import replay, unmet_requirements
from ..harness.trace import Trace, TraceError, load, policy_json

SCHEMA = "kvspec-bisect/1"
REPRODUCES, PASSES, FAILS, CANNOT_RUN = "reproduces", "passes", "fails", "cannot-run"
RAN = (REPRODUCES, PASSES, FAILS)
OUTCOME_LINE = "kvspec-bisect-outcome "
"""How a version's process marks an outcome on its standard output: a worker's engine may
print there too."""


# -- one member's replay ---------------------------------------------------------------------

def at_own_policy(trace: Trace, adapter) -> Trace:
    """The trace as `adapter` runs it: at the policy version the adapter declares, its
    `chunk_release` (WIN-4) where it declares one, and its block-pool settings (BLOCK-3,
    BLOCK-10), so that one trace serves releases whose retention differs; the invariants are
    then checked against the member's own policy."""
    trace = replace(trace, adapter=adapter.name)
    if trace.tier != "engine":  # only an engine trace's configuration names a policy
        return trace
    policy = Policy(**trace.config["policy"])
    policy = replace(policy, version=adapter.policy_version,
                     chunk_release=getattr(adapter, "chunk_release", policy.chunk_release),
                     null_block_counted=getattr(adapter, "null_block_counted", True),
                     uncached_first=tuple(getattr(adapter, "uncached_first", EVERY_GROUP)))
    return replace(trace, config=dict(trace.config, policy=policy_json(policy)))


def described(trace: Trace) -> dict:
    """The run a trace was recorded in, as a report describes it (plan.PlannedRun.description),
    for whoever reads an outcome by its run (a finding that shows in some runs only)."""
    config = trace.config
    recurrent = bool(config.get("state_slots"))
    return {"tier": trace.tier, "page_size": config.get("page_size"), "window": config.get("window"),
            "interval": config.get("policy", {}).get("decode_eviction_interval"),
            "state_grid": config.get("state_grid", 1) if recurrent else None, "state": recurrent}


def broken(trace: Trace) -> tuple[str, ...]:
    """What a trace records broken: its front matter's `violates` (a regression vector), else
    what its recorded run broke at its failing step (a counterexample of `kvspec check`)."""
    return trace.violates or trace.violated


@dataclass(frozen=True)
class Outcome:
    """How one member ran one trace."""

    member: str
    trace: str
    """The trace's path, as the bisection was given it."""
    verdict: str
    """reproduces, passes, fails, or cannot-run."""
    clauses: tuple[str, ...] = ()
    """The clauses the replay broke (none for a crash or a hang)."""
    kind: str = ""
    """violated, crashed, hung or diverged, when it failed."""
    step: int | None = None
    """The step it failed at."""
    message: str = ""
    """The failure, or why the member cannot run the trace."""
    label: str = ""
    run: dict | None = None
    """The trace's run (`described`)."""
    seconds: float = 0.0

    @property
    def broke(self) -> tuple[str, ...]:
        return self.clauses or ((self.kind,) if self.kind else ())

    @classmethod
    def from_json(cls, document: dict) -> "Outcome":
        return cls(**{**document, "clauses": tuple(document.get("clauses", ()))})


def replay_member(path: str, trace: Trace, adapter: Adapter, journal: Journal | None = None) -> Outcome:
    """Replay the trace on one member in this process, at its own policy."""
    started = time.perf_counter()
    own = at_own_policy(trace, adapter)
    where = {"member": adapter.name, "trace": path, "label": trace.label, "run": described(trace)}
    if unmet := unmet_requirements(own, adapter):
        return Outcome(**where, verdict=CANNOT_RUN, message=f"needs {', '.join(unmet)}")
    try:
        result = replay(own, adapter, compare=False, journal=journal)
    except AdapterError as error:  # its factory raised at this configuration
        return Outcome(**where, verdict=CANNOT_RUN, message=str(error))
    seconds = time.perf_counter() - started
    failure = result.failure
    if failure is None:
        return Outcome(**where, verdict=PASSES, seconds=seconds)
    clauses = tuple(failure.clauses or ())
    verdict = REPRODUCES if set(clauses or (failure.kind,)) & set(broken(trace)) else FAILS
    return Outcome(**where, verdict=verdict, clauses=clauses, kind=failure.kind, step=result.stopped_at,
                   message=str(failure), seconds=seconds)


def replay_job(job: tuple[str, Trace, str], journal: Journal) -> Outcome:
    """A worker's job: one trace on one member, loaded as a check's worker loads it
    (runner.declare: what loading it ended in the forkserver, it ends in here)."""
    path, trace, member = job
    loaded = sys.modules.get("kvspec.conformance.harness.forkserver_preload")
    try:
        if member in (failures := getattr(loaded, "FAILURES", {})):
            raise AdapterError(failures[member])
        adapter = load_adapter(member)
    except AdapterError as error:  # not installed, or the member's own code fails to load
        return Outcome(member, path, CANNOT_RUN, message=str(error), label=trace.label, run=described(trace))
    return replay_member(path, trace, adapter, journal)


def lost_job(job: tuple[str, Trace, str], lost: Lost) -> Outcome:
    """The replay's process died or hung: a crash or a hang of the member."""
    path, trace, member = job
    return Outcome(member, path, REPRODUCES if lost.kind in broken(trace) else FAILS, kind=lost.kind,
                   step=max(0, len(lost.steps) - 1), message=lost.reason, label=trace.label, run=described(trace))


def version_process() -> None:
    """A version's process (`replay_pairs` starts it): the pairs on its standard input, each
    outcome on its standard output as it ends (OUTCOME_LINE)."""
    task = json.loads(sys.stdin.read())
    traces = {path: load(path) for path, _ in task["pairs"]}
    jobs = [(path, traces[path], member) for path, member in task["pairs"]]
    done: set[tuple[str, str]] = set()

    def report(job, outcome: Outcome) -> None:
        done.add((job[0], job[2]))
        print(OUTCOME_LINE + json.dumps(asdict(outcome)), flush=True)

    members = list(dict.fromkeys(member for _, member in task["pairs"]))
    try:
        run_jobs(jobs, replay_job, lost_job, 1, task["step_timeout"], report, adapters=members,
                 memory_limit=task["memory_limit"], load_seconds=task["load_seconds"])
    except ForkserverDied as error:  # loading one of them crashed or hung: none of the rest can run here
        for path, trace, member in jobs:
            if (path, member) not in done:
                report((path, trace, member), Outcome(member, path, CANNOT_RUN, label=trace.label,
                                                      message=f"its version's members could not be loaded: {error}"))
    except KeyboardInterrupt:  # the bisection was stopped: it says so
        sys.exit(130)


# -- the family's members, and their processes -------------------------------------------------

@dataclass(frozen=True)
class Member:
    name: str
    version: str
    line: str


def family_named(prefix: str) -> families.Family:
    found = next((family for family in families.families() if family.prefix == prefix), None)
    if found is None:
        raise AdapterError(f"unknown family {prefix!r}; name one by its prefix: "
                           + ", ".join(f"{family.prefix} ({family.shown_as})" for family in families.families()))
    return found


def members_of(family: families.Family, prefixes: list[str] | None = None) -> list[Member]:
    """The family's members, by version (oldest first), then in the family's own order;
    with `prefixes`, those whose name (or name without the family's prefix) starts with one."""
    versions = family.versions()
    found = []
    for slug, adapter in family.members().items():  # items(): nothing is imported, nothing prepared
        version, line = family.placement(slug, adapter)
        if version not in versions:
            raise families.MalformedDeclaration(f"family {family.prefix}: member {slug!r} is of version {version!r}, "
                                                f"which is not one of its versions ({', '.join(versions)})")
        found.append(Member(family.prefix + slug, version, line))
    found.sort(key=lambda member: versions.index(member.version))  # stable: the family's order within a version
    if not prefixes:
        return found
    chosen = [member for member in found
              if any(member.name.startswith(p) or member.name.startswith(family.prefix + p) for p in prefixes)]
    if not chosen:
        raise AdapterError(f"--members {' '.join(prefixes)}: no member of {family.shown_as} ({family.prefix}) starts "
                           f"so; its members are " + ", ".join(member.name for member in found))
    return chosen


def replay_pairs(pairs: list[tuple[str, Member]], workers: int = 1, step_timeout: float = 60.0,
                 load_seconds: float = LOAD_SECONDS, memory_limit: int | None = MEMORY_LIMIT,
                 on_version=lambda version, outcomes, seconds: None) -> list[Outcome]:
    """Replay each (trace path, member): one process per version, `workers` at once; each
    version's outcomes go to `on_version` as its process ends. The outcomes, in the pairs' order."""
    by_version: dict[str, list[tuple[str, Member]]] = {}
    for pair in pairs:
        by_version.setdefault(pair[1].version, []).append(pair)
    pending, running, outcomes = list(by_version.items()), [], {}
    try:
        while pending or running:
            while pending and len(running) < max(1, workers):
                version, group = pending.pop(0)
                running.append((version, group, *start(group, step_timeout, load_seconds, memory_limit),
                                time.perf_counter()))
            time.sleep(0.05)
            for entry in [entry for entry in running if entry[2].poll() is not None]:
                running.remove(entry)
                version, group, process, stdout, stderr, started = entry
                found = collect(group, process, stdout, stderr)
                outcomes.update(((o.trace, o.member), o) for o in found)
                on_version(version, found, time.perf_counter() - started)
    finally:  # stopped (Ctrl-C, SIGTERM): no version's process outlives the bisection
        for _version, _group, process, stdout, stderr, _started in running:
            process.terminate()
            process.wait()
            stdout.close()
            stderr.close()
    return [outcomes[path, member.name] for path, member in pairs]


def start(group: list[tuple[str, Member]], step_timeout: float, load_seconds: float, memory_limit: int | None):
    """Start one version's process; its output goes to files (a pipe could fill and block it)."""
    stdout = tempfile.TemporaryFile("w+")  # noqa: SIM115 - open while the process runs; collect() closes it
    stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - the same
    task = {"pairs": [[path, member.name] for path, member in group], "step_timeout": step_timeout,
            "load_seconds": load_seconds, "memory_limit": memory_limit}
    command = [sys.executable, "-c", "from kvspec.conformance.runs.bisect import version_process; version_process()"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, text=True)
    process.stdin.write(json.dumps(task))
    process.stdin.close()
    return process, stdout, stderr


def collect(group: list[tuple[str, Member]], process, stdout, stderr) -> list[Outcome]:
    """What a version's process reported, in the group's order; a pair it never reported
    (the process itself ended early) cannot run, and says how the process ended."""
    stdout.seek(0)
    stderr.seek(0)
    reported = {}
    for line in stdout.read().splitlines():
        if line.startswith(OUTCOME_LINE):
            outcome = Outcome.from_json(json.loads(line.removeprefix(OUTCOME_LINE)))
            reported[outcome.trace, outcome.member] = outcome
    why = stderr.read().strip().splitlines()[-1:] or ["no message"]
    stdout.close()
    stderr.close()
    return [reported.get((path, member.name)) or
            Outcome(member.name, path, CANNOT_RUN, message=f"the process replaying version {member.version} ended "
                                                            f"with exit status {process.returncode}: {why[0]}")
            for path, member in group]


# -- per line: where it comes and goes -------------------------------------------------------

@dataclass(frozen=True)
class Line:
    """One line's history: its members in version order, and what each did."""

    line: str
    outcomes: tuple[tuple[Member, Outcome], ...]

    @property
    def ran(self) -> list[tuple[Member, Outcome]]:
        return [(member, outcome) for member, outcome in self.outcomes if outcome.verdict in RAN]

    @property
    def reproduces(self) -> list[str]:
        return [member.version for member, outcome in self.outcomes if outcome.verdict == REPRODUCES]

    @property
    def first_affected(self) -> str | None:
        return next(iter(self.reproduces), None)

    @property
    def first_fixed(self) -> Outcome | None:
        """The first member that ran after the last one that reproduces (None: it reproduces
        on the newest that ran, or nowhere)."""
        ran = self.ran
        last = max((i for i, (_, outcome) in enumerate(ran) if outcome.verdict == REPRODUCES), default=None)
        return ran[last + 1][1] if last is not None and last + 1 < len(ran) else None

    def version_of(self, outcome: Outcome) -> str:
        return next(member.version for member, each in self.outcomes if each is outcome)


def ranges(versions: list[str], among: list[str]) -> str:
    """`versions` (a subset of `among`, in its order) as ranges of consecutive ones:
    '0.5.15-0.5.17, 0.5.20'; '-' for none."""
    runs: list[list[str]] = []
    for version in among:
        if version in versions:
            if runs and runs[-1][-1] == among[among.index(version) - 1]:
                runs[-1].append(version)
            else:
                runs.append([version])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs) or "-"


def lines(members: list[Member], outcomes: list[Outcome]) -> list[Line]:
    """Each line's members with their outcome, lines in the order they first appear."""
    grouped: dict[str, list] = {}
    for member, outcome in zip(members, outcomes):
        grouped.setdefault(member.line, []).append((member, outcome))
    return [Line(line, tuple(each)) for line, each in grouped.items()]


# -- the command -----------------------------------------------------------------------------

def add_command(commands):
    """Register `bisect` on the CLI's subparsers; `args.func(args)` runs it."""
    parser = commands.add_parser("bisect", help="replay one trace on every member of a family (every release of an "
                                                "engine) and say where its failure comes and goes",
                                 description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a .jsonl trace that records a failure (a counterexample, a regression vector)")
    parser.add_argument("--family", required=True, metavar="PREFIX",
                        help="the family by its prefix, e.g. sglang@ (SGLang's releases) or mutant- (the bug zoo)")
    parser.add_argument("--members", nargs="+", metavar="PREFIX",
                        help="only the members whose name starts so, e.g. sglang@0.5.1 or 0.5.2 (default: all)")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help=f"write the outcomes and each line's range as JSON (schema {SCHEMA})")
    parser.set_defaults(func=bisect_command)
    return parser


def read_trace(text: str) -> Trace:
    """The trace to bisect: one file that records a failure (TraceError otherwise)."""
    from .tree import corpus

    if Path(text).is_dir():
        raise TraceError(f"{text} is a directory; kvspec bisect replays one trace: name its .jsonl file")
    ((path, trace),) = corpus(Path(text)).items()  # as replay reads it: bounded, and checked against its index
    if not broken(trace):
        raise TraceError(f"{path}: records no failure (neither `violates` in its header nor a step's `violated`), "
                         f"so there is nothing to reproduce; bisect a counterexample or a regression vector")
    return trace


def bisect_command(args) -> int:
    trace = read_trace(args.trace)
    family = family_named(args.family)
    members = members_of(family, args.members)
    path = str(Path(args.trace).resolve())
    versions = list(dict.fromkeys(member.version for member in members))
    print(f"kvspec bisect: {args.trace} ({trace.label or trace.tier}; breaks {', '.join(broken(trace))}) on "
          f"{len(members)} member(s) of {family.shown_as} ({family.prefix}), one process per version "
          f"({len(versions)}), {args.workers} at a time", flush=True)
    width = max(len(member.name) for member in members)
    finished = []

    def show(version: str, outcomes: list[Outcome], seconds: float) -> None:
        finished.append(version)
        print(f"[{len(finished)}/{len(versions)}] {version or family.prefix}: {len(outcomes)} member(s) in "
              f"{seconds:.1f} s", flush=True)
        for outcome in outcomes:
            print(f"    {outcome.member:{width}}  {said(outcome)}", flush=True)

    started = time.perf_counter()
    outcomes = replay_pairs([(path, member) for member in members], args.workers, args.step_timeout,
                            args.load_timeout, int(args.memory_limit * (1 << 30)), show)
    seconds = time.perf_counter() - started
    found = lines(members, outcomes)
    print()
    print(summary(found, outcomes, versions != [""]))
    counts = {verdict: sum(o.verdict == verdict for o in outcomes) for verdict in (REPRODUCES, PASSES, FAILS, CANNOT_RUN)}
    print(f"\nreproduces on {counts[REPRODUCES]} of {len(outcomes)} member(s); passes on {counts[PASSES]}, fails "
          f"otherwise on {counts[FAILS]}, cannot run on {counts[CANNOT_RUN]}; {seconds:.1f} s")
    if args.json:
        document = {"schema": SCHEMA, "trace": args.trace, "family": family.prefix, "label": trace.label,
                    "breaks": list(broken(trace)), "seconds": round(seconds, 3),
                    "members": [dict(asdict(outcome), version=member.version, line=member.line)
                                for member, outcome in zip(members, outcomes)],
                    "lines": [{"line": line.line, "reproduces": line.reproduces,
                               "ran": [member.version for member, _ in line.ran],
                               "first_affected": line.first_affected,
                               "first_fixed": line.version_of(line.first_fixed) if line.first_fixed else None}
                              for line in found]}
        write_text(args.json, json.dumps(document, indent=1) + "\n")
        print(f"wrote {os.path.relpath(args.json)}")
    return 0


def said(outcome: Outcome) -> str:
    """An outcome in a few words: the verdict, what broke where, the message's first line."""
    lines = outcome.message.splitlines() or [""]
    first = next((line for line in lines if line.startswith("[")), lines[0])  # the broken clause's own words
    if outcome.verdict == PASSES:
        return PASSES
    if outcome.verdict == CANNOT_RUN:
        return f"cannot run: {first}"
    return f"{outcome.verdict} {', '.join(outcome.broke)} at step {outcome.step}: {first}"


def summary(found: list[Line], outcomes: list[Outcome], versioned: bool) -> str:
    """Per line (a family with versions), else the members it reproduces on."""
    if not versioned:
        hit = [o.member for o in outcomes if o.verdict == REPRODUCES]
        return "reproduces on: " + (", ".join(hit) or "none of them")
    rows = [("line", "reproduces on", "first affected", "first fixed", "cannot run on")]
    for line in found:
        ran = [member.version for member, _ in line.ran]
        fixed = line.first_fixed
        rows.append((line.line, ranges(line.reproduces, ran), line.first_affected or "-",
                     "-" if fixed is None else line.version_of(fixed)
                     + ("" if fixed.verdict == PASSES else f" (fails {', '.join(fixed.broke)})"),
                     ", ".join(member.version for member, o in line.outcomes if o.verdict == CANNOT_RUN) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = ["per line (members that differ only by version), oldest first:"]
    text += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(text)
