"""What a conformance check runs, and how one run becomes a result.

A check is a list of runs, one state machine each: the allocator tier at page sizes 1,
2, 4 and 16; the engine tier at windows that are and are not page multiples, with
decode eviction intervals 1, 4 and 128 (see ENGINE_CONFIGS); the scheduler tier at such
windows too (SCHEDULER_CONFIGS). Each run is a `Job`
(picklable: the adapter is named, not passed) executed by `check_job` in a worker
process (isolation.py); a failure is shrunk by Hypothesis, then saved as a trace whose
steps carry the reference's observables as expectations (OBS-3), and replayed from the
saved file to confirm that the trace reproduces it. With a picture path, the worker then
draws the run (occupancy.py): its counterexample, or its busiest example if it passed.
"""

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hypothesis import Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.models import with_state
from kvspec.spec.scheduler import STATE, SchedulerConfig
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy

from ..harness.allocator_machine import allocator_machine
from ..harness.checks import StepFailure
from ..harness.differential import ComparedFailure
from ..harness.engine_machine import engine_machine
from ..harness.families import RUNS, Run
from ..harness.isolation import Journal, Lost
from ..harness.profiles import profile, shrink_budget, shrinking_within
from ..harness.protocol import Adapter, AdapterError, load_adapter
from ..harness.replay import replay, with_expectations
from ..harness.scheduler_machine import scheduler_machine
from ..harness.trace import Trace, load
from ..reports.model import ClassTally, RunResult, tier_of
from ..review.occupancy import timeline
from ..review.occupancy_plot import draw

CAPABILITY_OF_PAGE_SIZE = {True: "page_size_1", False: "page_size_gt_1"}


def machines(adapter: Adapter, against: str | None = None):
    """(label, state machine class) of every run a check makes, for the tiers and page
    sizes the adapter has; with `against` (an adapter spec, e.g. "reference"), each step
    is also applied to that adapter and the observables the spec fixes must agree
    (differential mode): then only the runs both can make. An adapter whose policy
    versions are of several memory models gets each model's engine runs, at its first
    version; those of a model other than its policy_version's are named by the model
    ("block-pool P=4 W=6 I=4")."""
    shadow = load_adapter(against) if against else None
    made = 0
    for version in adapter.model_versions():
        implementation = adapter.for_version(version)
        compared = shadow.for_version(version) if shadow else None
        if shadow and compared is None:
            continue
        # another model's runs are named by it: "block-pool P=4 W=6 I=4" (never matched by --run "engine P=4")
        renamed = "engine" if version == adapter.policy_version else implementation.model.name
        for run in RUNS:
            if (not applies(implementation, run) or (compared and not applies(compared, run))
                    or run.tier in ("allocator", "scheduler") and version != adapter.policy_version  # one of each
                    or run.tier == "scheduler" and shadow):  # the spec fixes no plan: nothing to compare
                continue
            made += 1
            if run.tier == "allocator":
                yield run.label, allocator_machine(adapter.make_allocator, run.page_size, adapter.capabilities,
                                                   adapter.observables, shadow=compared)
            elif run.tier == "scheduler":
                yield run.label, scheduler_machine(adapter.make_scheduler, run.page_size, run.window,
                                                   adapter.observables, adapter.model,
                                                   (FULL, SWA, STATE) if run.state else (FULL, SWA),
                                                   pressure="preempts_only_when_needed" in adapter.capabilities)
            else:
                policy = Policy(version, decode_eviction_interval=run.interval)
                yield renamed + run.label.removeprefix("engine"), engine_machine(
                    implementation.make_engine, run.page_size, run.window, policy, implementation.capabilities,
                    implementation.observables, shadow=compared, model=implementation.model,
                    state_grid=run.state_grid)
    if shadow and not made:
        raise AdapterError(f"adapter {adapter.name!r} and {shadow.name!r} have no run in common: {shadow.name!r} "
                           f"implements none of {', '.join(adapter.policy_versions)} at the tiers and page sizes "
                           f"{adapter.name!r} has")


def applies(adapter: Adapter, run: Run) -> bool:
    """Whether the adapter (as its engines of one version are) can make the run."""
    if CAPABILITY_OF_PAGE_SIZE[run.page_size == 1] not in adapter.capabilities:
        return False
    if run.tier == "allocator":
        return adapter.make_allocator is not None
    if run.tier == "scheduler":
        return adapter.make_scheduler is not None and (not run.state or "state_group" in adapter.capabilities)
    if adapter.make_engine is None:
        return False
    return run.state_grid is None or ("recurrent_state" in adapter.capabilities
                                      and with_state(adapter.model) is not None
                                      and (run.page_size == 1 or "paged_recurrent_state" in adapter.capabilities))


def probe(adapter: Adapter) -> None:
    """Build one implementation per tier, so that an adapter that cannot build one, or
    builds one without the operations of its tier, is an AdapterError (exit 2) before its
    run starts; and refuse an adapter none of whose runs apply. A check probes in each
    worker (check_job), never in the harness's own process: building runs the
    implementation's code, which may hang or kill its process."""
    require_page_sizes(adapter)
    page_size = 1 if "page_size_1" in adapter.capabilities else 4
    if adapter.make_allocator is not None:
        adapter.make_allocator(4 * page_size, 4 * page_size, page_size)
    if adapter.make_engine is not None:
        for version in adapter.model_versions():
            adapter.make_engine(EngineConfig(page_size, 4, 16 * page_size, 16 * page_size, 4, Policy(version)))
    if adapter.make_scheduler is not None:
        adapter.make_scheduler(SchedulerConfig(page_size, 4, 16))


def require_page_sizes(adapter: Adapter) -> None:
    """Refuse an adapter none of whose runs apply (AdapterError); runs none of its code."""
    if not {"page_size_1", "page_size_gt_1"} & adapter.capabilities:
        raise AdapterError(f"adapter {adapter.name!r} declares neither page_size_1 nor page_size_gt_1, so no run "
                           f"applies; add the page sizes it supports to its capabilities")


def skipped_runs(adapter: Adapter, against: str | None = None) -> dict[str, str]:
    """Runs a check leaves out, and why: never counted as passed. With `against`, also the
    runs the adapter compared with cannot make (differential mode)."""
    left_out = {}
    if against:
        made = {label for label, _ in machines(adapter, against)}
        for label in (label for label, _ in machines(adapter) if label not in made):
            left_out[label] = f"{against} cannot make this run to compare with (a version, tier or capability it lacks)"
    for tier, factory in (("allocator", adapter.make_allocator), ("engine", adapter.make_engine),
                          ("scheduler", adapter.make_scheduler)):
        if factory is None:
            left_out[f"{tier} tier"] = f"adapter has no {tier} tier"
    state = ("paged_recurrent_state", "releases_state_at_stop") if "recurrent_state" in adapter.capabilities else ()
    pd = ("pd_checkpoint_keeps_window",) if "pd_decode" in adapter.capabilities else ()
    read_by = {"allocator": ("swa_tail", "free_groups", "refuses_misuse", "atomic_alloc_decode"),
               "engine": ("pd_decode", "chunked_prefill", "recurrent_state", *state, *pd),
               "scheduler": ("preempts_only_when_needed", "state_group")}
    tiers = [tier for tier, factory in (("allocator", adapter.make_allocator), ("engine", adapter.make_engine),
                                        ("scheduler", adapter.make_scheduler)) if factory is not None]
    for capability in ("page_size_1", "page_size_gt_1", *(c for tier in tiers for c in read_by[tier])):
        if capability not in adapter.capabilities:
            left_out[capability] = f"adapter lacks capability {capability}: its runs or rules do not run"
    return left_out


@dataclass(frozen=True)
class Job:
    adapter: str
    """The adapter spec the worker loads (protocol.load_adapter)."""
    label: str
    profile: str
    seed: int | None
    traces: str
    """Directory where a counterexample is saved."""
    differential: str | None = None
    """The adapter every step is also applied to (differential mode), or None."""
    shrink: bool = True
    """False keeps the first counterexample as found: sooner, but longer."""
    shrink_seconds: float | None = None
    """Stop shrinking after this long (None: the profile's budget, profiles.shrink_budget)."""
    picture: str | None = None
    """Where to draw the run (a .png, .svg or .pdf), or None."""
    example_database: str | None = None
    """A directory of Hypothesis' failing examples to try first and add to, or None (profiles.py)."""


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def trace_path(job: Job) -> Path:
    return Path(job.traces) / f"{slug(job.adapter)}-{slug(job.label)}.jsonl"


def tallies(machine) -> tuple[dict[str, ClassTally], dict[str, str]]:
    rows = machine.tally.as_rows()
    return ({c: ClassTally(*counts) for c, counts in rows.items()},
            {c: why for c, why in machine.tally.skipped_because.items() if c in rows})


def save(trace: Trace, job: Job, adapter: Adapter) -> tuple[str, bool]:
    """Save a counterexample with the expectations of the reference (or of the adapter
    it was compared with); whether replaying the saved file on `adapter` (the one whose
    failure it is) reproduces the failure."""
    try:
        trace = with_expectations(trace, load_adapter(job.differential or "reference"))
    except (StepFailure, AdapterError):
        pass  # the reference cannot run this configuration: the steps alone still replay
    path = trace.save(trace_path(job))
    try:
        reproduced = replay(load(path), adapter).reproduces(trace)
    except Exception:  # noqa: BLE001 - what the replay raised is the failure being saved: it did not reproduce
        reproduced = False
    return str(path), reproduced


def check_job(job: Job, journal: Journal | None = None) -> RunResult:
    """Run one state machine of a check; in a worker process, `journal` is its lifeline."""
    adapter = load_adapter(job.adapter)
    if journal is not None:
        journal("building", job.label)  # from here a hang is a step's hang (--step-timeout), not a slow import
    probe(adapter)
    if job.differential:
        probe(load_adapter(job.differential))
    machine = dict(machines(adapter, job.differential))[job.label]
    machine.journal = journal
    if job.seed is not None:
        machine = hypothesis_seed(job.seed)(machine)  # run_state_machine_as_test reads it here
    tier = machine.tier
    machine.reset_counters()
    started = time.perf_counter()
    budget = job.shrink_seconds or shrink_budget(job.profile)
    try:
        chosen = profile(job.profile)
        if not job.shrink:
            chosen = settings(chosen, phases=[phase for phase in chosen.phases if phase is not Phase.shrink])
        if job.example_database is not None:
            chosen = settings(chosen, database=DirectoryBasedExampleDatabase(job.example_database))
        with shrinking_within(budget):
            run_state_machine_as_test(machine, settings=chosen)
    except AdapterError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of the implementation is a verdict
        machine.journal = None
        elapsed = time.perf_counter() - started
        failure = error if isinstance(error, StepFailure) else None
        # the adapter compared against may fail itself: then the trace is a finding about it
        failed = job.differential if isinstance(error, ComparedFailure) else None
        trace = machine.counterexample(adapter.name, job.seed, job.label)
        path, reproduced = save(trace, job, load_adapter(failed) if failed else adapter)
        message = str(error) if failure else f"{type(error).__name__}: {error}"
        if not reproduced:
            message += "\n(replaying the saved trace did not reproduce this failure: the implementation is not deterministic?)"
        kind = failure.kind if failure else "crashed"
        return RunResult(job.label, tier, "crashed" if kind == "crashed" else "violated", machine.examples,
                         machine.steps, elapsed, list(failure.clauses) if failure and failure.clauses else
                         (["OBS-3"] if kind == "diverged" else []), message, path, len(trace.steps), *tallies(machine),
                         first_failure_seconds=machine.first_failure_seconds,
                         first_failure_clauses=list(machine.first_failure_clauses),
                         first_failure_step=machine.first_failure_step, picture=picture(job, trace, adapter),
                         replay_adapter=failed,
                         **shrinking(machine, job.shrink and budget))
    elapsed = time.perf_counter() - started
    busiest = machine.busiest_example(adapter.name, job.seed, job.label)
    return RunResult(job.label, tier, "ok", machine.examples, machine.steps, elapsed, [], "", None, None,
                     *tallies(machine), picture=picture(job, busiest, adapter))


def shrinking(machine, budget: float | None) -> dict:
    """How long the run shrank its counterexample, and whether it stopped at the budget:
    from the first failing example to the start of the last example run, Hypothesis'
    replay of the one it keeps. Hypothesis only stops at an example that ended past the
    budget, so a shrink that reached it stopped there. Nothing when it did not shrink."""
    if not budget or machine.first_failure_seconds is None:
        return {}
    seconds = max(0.0, machine.last_example_started - machine.started - machine.first_failure_seconds)
    return {"shrink_seconds": seconds, "shrink_budget_seconds": budget, "shrink_stopped_at_budget": seconds >= budget}


def picture(job: Job, trace: Trace, adapter: Adapter) -> str | None:
    """Draw `trace` on the adapter to the job's picture path, if it has one."""
    if job.picture is None:
        return None
    return str(draw(timeline(trace, adapter, job.label), job.picture))


def isolated_check(job: Job, journal: Journal):
    """A worker's job: an AdapterError travels back to the parent as the result."""
    try:
        return check_job(job, journal)
    except AdapterError as error:
        return error


def lost_check(job: Job, lost: Lost) -> RunResult:
    """The result of a run whose worker crashed or hung: the steps up to that point."""
    tier = tier_of(job.label)
    path = steps = None
    if lost.config is None:  # no example had started: the adapter's module or factory did it
        lost = replace(lost, reason=f"{lost.reason} before its first step, loading the adapter or building the "
                                    f"implementation (make_{tier})")
    if lost.config is not None:
        steps = [*lost.steps[:-1], replace(lost.steps[-1], violated=(lost.kind,), message=lost.reason)] \
            if lost.steps else []
        adapter = load_adapter(job.adapter)
        trace = Trace(tier, lost.config, adapter.name, tuple(steps), job.seed, job.label,
                      f"{lost.kind} during kvspec check ({job.label}): {lost.reason}")
        path, steps = str(trace.save(trace_path(job))), len(steps)
    return RunResult(job.label, tier, lost.kind, 0, 0, 0.0, [], lost.reason, path, steps)

