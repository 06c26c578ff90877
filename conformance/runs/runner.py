"""One run of a check, from its planned run to its result: the one runner of `kvspec check`,
`kvspec zoo` and the pytest plugin.

A run is a `Job` (picklable: the adapter is named, not passed, and its planned run is
data, plan.py), executed by `check_job`, in a worker process (isolation.py) or, for the
pytest plugin, in pytest's own. It builds its state machine from the planned run, searches
with the profile's settings and seed, and turns whatever ends the search into a RunResult:
a failure is shrunk by Hypothesis, then saved as a trace whose steps carry the
reference's observables as expectations (OBS-3), and replayed from the saved file to
confirm that the trace reproduces it. With a picture path, the worker then draws the run
(occupancy.py): its counterexample, or its busiest example if it passed. Whatever goes
wrong writing the trace or the picture is said in the result, never taken for a failure
of the implementation.

`declare` is the job a command runs first: it loads the adapters in a worker and hands
back their declarations (protocol.Declaration), from which the harness plans; the
harness's own process never imports an adapter.
"""

import os
import re
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

from hypothesis import Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from kvspec.spec.scheduler import SchedulerConfig
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy

from ..harness.built_for import adapter_fault
from ..harness.checks import StepFailure
from ..harness.declarations import Capability
from ..harness.differential import ComparedFailure
from ..harness.front_matter import with_front_matter
from ..harness.isolation import LOAD_SECONDS, MEMORY_LIMIT, ForkserverDied, Journal, Lost, run_jobs
from ..harness.profiles import profile, shrink_budget, shrinking_within
from ..harness.protocol import Adapter, AdapterError, Declaration, load_adapter
from ..harness.replay import replay, with_expectations
from ..harness.trace import Trace, load
from ..reports.model import ClassTally, RunResult
from ..review.occupancy import timeline
from ..review.occupancy_plot import draw
from .plan import PlannedRun


def probe(adapter: Adapter) -> None:
    """Build one implementation per tier, so that an adapter that cannot build one, or
    builds one without the operations of its tier, is an AdapterError before its run
    starts. A check probes in each worker (check_job), never in the harness's own
    process: building runs the implementation's code, which may hang or kill its process."""
    page_size = 1 if Capability.PAGE_SIZE_1 in adapter.capabilities else 4
    if adapter.make_allocator is not None:
        adapter.make_allocator(4 * page_size, 4 * page_size, page_size)
    if adapter.make_engine is not None:
        for version in adapter.model_versions():
            adapter.make_engine(EngineConfig(page_size, 4, 16 * page_size, 16 * page_size, 4, Policy(version)))
    if adapter.make_scheduler is not None:
        adapter.make_scheduler(SchedulerConfig(page_size, 4, 16))


def declare(specs: tuple[str, ...], journal: Journal | None = None) -> tuple[Declaration, ...] | AdapterError:
    """A command's first job, in a worker: load each adapter (the forkserver has imported it
    already, and kept what that ended in: forkserver_preload.py) and return their
    declarations; an AdapterError travels back as the result."""
    loaded = sys.modules.get("kvspec.conformance.harness.forkserver_preload")
    failures = getattr(loaded, "FAILURES", {})
    try:
        for spec in specs:
            if spec in failures:
                raise AdapterError(failures[spec])
        return tuple(load_adapter(spec).declaration for spec in specs)
    except AdapterError as error:
        return error


def lost_declare(specs: tuple[str, ...], lost: Lost) -> AdapterError:
    """Loading the adapters killed or hung the worker that loaded them (a module at import)."""
    what = "did not finish loading" if lost.kind == "hung" else "died loading"
    return AdapterError(f"the process loading adapter {' and '.join(map(repr, specs))} {what} it ({lost.reason}): "
                        f"its module or its preload crashes or hangs at import; fix it")


def declared(specs: list[str], load_seconds: float = LOAD_SECONDS,
             memory_limit: int | None = MEMORY_LIMIT) -> tuple[Declaration, ...]:
    """The adapters' declarations, loaded in a worker process (`declare`): importing an
    adapter runs its code, which may crash or hang; here either is an AdapterError."""
    found = []
    try:
        run_jobs([tuple(specs)], declare, lost_declare, 1, load_seconds, lambda _specs, result: found.append(result),
                 adapters=specs, memory_limit=memory_limit, load_seconds=load_seconds, startup_seconds=load_seconds)
    except ForkserverDied as error:
        raise AdapterError(f"adapter {' and '.join(map(repr, specs))}: {error}; fix its module or its preload"
                           ) from None
    if isinstance(found[0], AdapterError):
        raise found[0]
    return found[0]


@dataclass(frozen=True)
class Job:
    adapter: str
    """The adapter spec the worker loads (protocol.load_adapter)."""
    planned: PlannedRun
    profile: str
    seed: int | None
    traces: str
    """Directory where a counterexample is saved (absolute: the implementation may change
    its process's directory)."""
    differential: str | None = None
    """The adapter every step is also applied to (differential mode), or None."""
    shrink: bool = True
    """False keeps the first counterexample as found: sooner, but longer."""
    shrink_seconds: float | None = None
    """Stop shrinking after this long (None: the profile's budget, profiles.shrink_budget)."""
    picture: str | None = None
    """Where to draw the run (a .png, .svg or .pdf), or None."""
    examples: int | None = None
    """Examples to search at most (None: the profile's). The zoo gives a mutant room past the
    profile's: a run ends at its first counterexample, so only a missed mutant pays for it."""
    example_database: str | None = None
    """A directory of Hypothesis' failing examples to try first and add to, or None (profiles.py)."""
    adapter_name: str = ""
    """The adapter's declared name (for the trace of a run lost with its worker)."""
    multiple_bugs: bool = False
    """Search on past the first failure and report every distinct one (a failure of other
    clauses, or a crash at another place), each shrunk and saved: the history matrix's
    way to see a member's second bug. Off, a run ends at its first, found sooner."""

    @property
    def label(self) -> str:
        return self.planned.label

    def result(self, verdict: str, message: str = "", **fields) -> RunResult:
        """The RunResult of this job, named and described by its planned run."""
        fields = {"examples": 0, "steps": 0, "seconds": 0.0, "clauses": [], **fields}
        return RunResult(self.label, str(self.planned.tier), verdict, message=message,
                         run=self.planned.description, **fields)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def trace_path(job: Job) -> Path:
    """Where the run's trace goes: `<adapter>-<run>.jsonl` in the traces folder."""
    return Path(job.traces) / f"{slug(job.adapter)}-{slug(job.label)}.jsonl"


def write_trace(trace: Trace, job: Job) -> str:
    """Save the trace at trace_path, or, where anything is at that name already (an earlier
    check's trace, one of a check running beside this one, a link planted there), at the
    first free `<adapter>-<run>-N.jsonl`: a trace never replaces a file, never writes
    through a link, and the path a report names always holds its own trace."""
    path = trace_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, written = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(trace.dumps())
        number = 1
        while True:
            try:
                os.link(written, path)  # fails where anything is at the name: nothing is replaced
                return str(path)
            except FileExistsError:
                number += 1
                path = trace_path(job).with_name(f"{trace_path(job).stem}-{number}.jsonl")
    finally:
        os.remove(written)


def save(trace: Trace, job: Job, adapter: Adapter) -> tuple[str | None, str]:
    """Save a counterexample with the expectations of the reference (or of the adapter it
    was compared with); (its path, what the result must add): that replaying the saved file
    on `adapter` (the one whose failure it is) did not reproduce the failure, or that the
    trace could not be written (the run's verdict stands)."""
    try:
        trace = with_expectations(trace, load_adapter(job.differential or "reference"))
    except (StepFailure, AdapterError):
        pass  # the reference cannot run this configuration: the steps alone still replay
    trace = with_front_matter(trace, load_adapter("reference"))
    try:
        path = write_trace(trace, job)
    except OSError as error:
        return None, (f"\n(the trace could not be saved: {trace_path(job)}: {error.strerror or error}; the "
                      f"failure above stands)")
    try:
        reproduced = replay(load(path), adapter).reproduces(trace)
    except Exception:  # noqa: BLE001 - what the replay raised is the failure being saved: it did not reproduce
        reproduced = False
    return path, "" if reproduced else ("\n(replaying the saved trace did not reproduce this failure: the "
                                        "implementation is not deterministic? " + DETERMINISTIC + ")")


DETERMINISTIC = ("An implementation must be deterministic: the same calls give the same outcomes. Give it a clock "
                 "the adapter advances (a step counter, not time.monotonic() or time.time()), seed its random "
                 "numbers, and break ties (equal timestamps, equal priorities) by block or page id, never by id() "
                 "or a set's order: docs/writing-an-adapter.md, \"Deterministic, or it cannot be checked\"")
"""How to make an implementation deterministic, said wherever a run shows it is not."""


def nondeterminism(error: BaseException) -> Flaky | None:
    """Hypothesis' word that the same choices did not run alike (Flaky: FlakyStrategyDefinition,
    "Inconsistent data generation", where the steps a machine drew depend on outcomes that
    changed; FlakyFailure, where a failure did not happen again), in `error` or, with several
    bugs reported, in its group; None where it gave none. Every rule of a machine draws from
    what the implementation showed, so this is the implementation's nondeterminism."""
    if isinstance(error, Flaky):
        return error
    if isinstance(error, BaseExceptionGroup):
        return next((found for each in error.exceptions if (found := nondeterminism(each)) is not None), None)
    return None


def nondeterministic(flaky: Flaky) -> str:
    """The `error` verdict's message for a run that found the implementation nondeterministic."""
    said = str(flaky).strip().splitlines()[0] if str(flaky).strip() else ""
    failed = leaves(flaky) if isinstance(flaky, BaseExceptionGroup) else []
    first = f" Once, it failed: {str(failed[0]).splitlines()[0]}." if failed and str(failed[0]).strip() else ""
    return (f"the implementation is not deterministic: the same steps gave different outcomes from one run of "
            f"them to the next, so no counterexample can be searched for, shrunk or replayed (Hypothesis: "
            f"{type(flaky).__name__}: {said}).{first} {DETERMINISTIC}")


def raised_by_the_implementation(error: BaseException) -> bool:
    """A BaseException that ended a search is the implementation's (a KeyboardInterrupt
    or SystemExit it raised, GeneratorExit), except Ctrl-C itself where it reaches this
    process: a worker ignores SIGINT, pytest's own process does not."""
    return not isinstance(error, KeyboardInterrupt) or signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def check_job(job: Job, journal: Journal | None = None) -> RunResult:
    """Run one planned run; in a worker process, `journal` is its lifeline. An adapter that
    cannot build the implementation of this run is this run's `error`, the others' verdicts
    stand."""
    try:
        adapter = load_adapter(job.adapter)
        shadow = load_adapter(job.differential) if job.differential else None
        if journal is not None:
            journal("building", job.label)  # from here a hang is a step's hang (--step-timeout), not a slow import
        probe(adapter)
        if shadow is not None:
            probe(shadow)
        machine = job.planned.machine(adapter, shadow)
    except AdapterError as error:
        return job.result("error", str(error))
    machine.journal = journal
    if job.seed is not None:
        machine = hypothesis_seed(job.seed)(machine)  # run_state_machine_as_test reads it here
    machine.reset_counters()
    started = time.perf_counter()
    budget = job.shrink_seconds or shrink_budget(job.profile)
    try:
        chosen = profile(job.profile)
        if job.examples is not None:
            chosen = settings(chosen, max_examples=job.examples)
        if not job.shrink:
            chosen = settings(chosen, phases=[phase for phase in chosen.phases if phase is not Phase.shrink])
        if job.multiple_bugs:
            chosen = settings(chosen, report_multiple_bugs=True)
        if job.example_database is not None:
            chosen = settings(chosen, database=DirectoryBasedExampleDatabase(job.example_database))
        with shrinking_within(budget):
            run_state_machine_as_test(machine, settings=chosen)
    except AdapterError as error:  # a factory that cannot build this run's configuration
        return job.result("error", str(error), examples=machine.examples, steps=machine.steps,
                          seconds=time.perf_counter() - started)
    except BaseException as error:  # noqa: BLE001 - any failure of the implementation is a verdict
        if not raised_by_the_implementation(error):
            raise
        machine.journal = None
        elapsed = time.perf_counter() - started
        if (flaky := nondeterminism(error)) is not None:  # no counterexample to keep: no step replays alike
            return job.result("error", nondeterministic(flaky), examples=machine.examples, steps=machine.steps,
                              seconds=elapsed, **tallies(machine))
        # several distinct bugs (job.multiple_bugs) come as one group, each with its example
        first, *others = [failed(job, machine, adapter, each) for each in
                          (leaves(error) if isinstance(error, BaseExceptionGroup) else [error])]
        drawn, drawing = picture(job, first.pop("counterexample"), adapter)
        raised, message = first.pop("raised"), first.pop("message")
        return job.result(**first, message=message + drawing,
                          examples=machine.examples, steps=machine.steps, seconds=elapsed, **tallies(machine),
                          first_failure_seconds=machine.first_failure_seconds,
                          first_failure_clauses=list(machine.first_failure_clauses),
                          first_failure_step=machine.first_failure_step, picture=drawn,
                          cause="".join(traceback.format_exception(raised)) if raised is not None else "",
                          other_failures=[{key: value for key, value in other.items()
                                           if key not in ("counterexample", "raised")} for other in others],
                          **shrinking(machine, job.shrink and budget))
    elapsed = time.perf_counter() - started
    drawn, drawing = picture(job, machine.busiest_example(adapter.name, job.seed, job.label), adapter)
    return job.result("ok", drawing.strip(), examples=machine.examples, steps=machine.steps, seconds=elapsed,
                      **tallies(machine), picture=drawn)


def leaves(group: BaseExceptionGroup) -> list[BaseException]:
    """The exceptions of a group, nested groups flattened, in the order raised."""
    return [leaf for each in group.exceptions for leaf in (leaves(each) if isinstance(each, BaseExceptionGroup)
                                                             else [each])]


def failed(job: Job, machine, adapter: Adapter, error: BaseException) -> dict:
    """One failure of a run, its counterexample saved: the result's fields for it
    (verdict, clauses, message, trace, trace_steps, replay_adapter), its counterexample
    and what the implementation raised, if it did."""
    failure = error if isinstance(error, StepFailure) else None
    # the adapter compared against may fail itself: then the trace is a finding about it
    other = job.differential if isinstance(error, ComparedFailure) else None
    trace = machine.counterexample_of(error, adapter.name, job.seed, job.label)
    if failure is None and trace.steps and not trace.steps[-1].violated:  # it escaped the driver: its step
        trace = replace(trace, steps=(*trace.steps[:-1], replace(trace.steps[-1], violated=("crashed",))))
    path, note = save(trace, job, load_adapter(other) if other else adapter)
    kind = failure.kind if failure else "crashed"
    raised = error.__cause__ if failure is not None else error
    if kind == "crashed" and (fault := adapter_fault(raised, adapter)):  # release day: not the engine's crash
        return {"verdict": "error", "clauses": [], "message": fault + note, "trace": path,
                "trace_steps": len(trace.steps) if path else None, "replay_adapter": other,
                "counterexample": trace, "raised": raised}
    return {"verdict": "crashed" if kind == "crashed" else "violated",
            "clauses": list(failure.clauses) if failure and failure.clauses else (["OBS-3"] if kind == "diverged" else []),
            "message": (str(error) if failure else f"{type(error).__name__}: {error}") + note,
            "trace": path, "trace_steps": len(trace.steps) if path else None, "replay_adapter": other,
            "counterexample": trace, "raised": raised}


def tallies(machine) -> dict:
    rows = machine.tally.as_rows()
    return {"tallies": {c: ClassTally(*counts) for c, counts in rows.items()},
            "skipped_because": {c: why for c, why in machine.tally.skipped_because.items() if c in rows}}


def shrinking(machine, budget: float | None) -> dict:
    """How long the run shrank its counterexample, and whether it stopped at the budget:
    from the first failing example to the start of the last example run, Hypothesis'
    replay of the one it keeps. Hypothesis only stops at an example that ended past the
    budget, so a shrink that reached it stopped there. Nothing when it did not shrink."""
    if not budget or machine.first_failure_seconds is None:
        return {}
    seconds = max(0.0, machine.last_example_started - machine.started - machine.first_failure_seconds)
    return {"shrink_seconds": seconds, "shrink_budget_seconds": budget, "shrink_stopped_at_budget": seconds >= budget}


def picture(job: Job, trace: Trace, adapter: Adapter) -> tuple[str | None, str]:
    """Draw `trace` on the adapter to the job's picture path, if it has one: (its path, what
    the result must add where it could not be drawn: a picture is never a verdict)."""
    if job.picture is None:
        return None, ""
    try:
        return str(draw(timeline(trace, adapter, job.label), job.picture)), ""
    except Exception as error:  # noqa: BLE001 - a path that cannot be written, or matplotlib itself
        return None, f"\n(no picture: drawing {job.picture} raised {type(error).__name__}: {error})"


def isolated_check(job: Job, journal: Journal) -> RunResult:
    """A worker's job. Hypothesis keeps a cache of constants in `.hypothesis/` of the current
    folder; a check writes only where it is told (its traces, its reports), so the cache goes
    to a folder of kvspec's in the temporary directory, unless HYPOTHESIS_STORAGE_DIRECTORY
    names one."""
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        set_hypothesis_home_dir(Path(tempfile.gettempdir()) / f"kvspec-hypothesis-{os.getuid()}")
    return check_job(job, journal)


def lost_check(job: Job, lost: Lost) -> RunResult:
    """The result of a run whose worker crashed or hung: the steps up to that point."""
    tier = job.planned.tier
    if lost.config is None:  # no example had started: the adapter's module or factory did it
        return job.result(lost.kind, f"{lost.reason} before its first step, loading the adapter or building the "
                                     f"implementation (make_{tier})")
    steps = [*lost.steps[:-1], replace(lost.steps[-1], violated=(lost.kind,), message=lost.reason)] \
        if lost.steps else []
    trace = Trace(str(tier), lost.config, job.adapter_name or job.adapter, tuple(steps), job.seed, job.label,
                  f"{lost.kind} during kvspec check ({job.label}): {lost.reason}")
    trace = with_front_matter(trace, None)  # its needs; no replay here, in the harness's own process
    try:
        path = write_trace(trace, job)
    except OSError as error:
        return job.result(lost.kind, f"{lost.reason}\n(the trace could not be saved: {trace_path(job)}: "
                                     f"{error.strerror or error})")
    return job.result(lost.kind, lost.reason, trace=path, trace_steps=len(steps))
