"""Replaying a trace: its steps, in order, on an adapter's implementation.

Each step goes through the tier's driver, so every invariant is checked after it, and
what the implementation shows is compared with the step's `expect` (the observables
the spec fixes, OBS-3). A replay ends at the first step that violates a clause or crashes.
Observables other than expected are a violation of OBS-3, reported at the first step
that shows them when no later step breaks a clause (a divergence often leads to one,
which is then the finding) or when a later step cannot be applied.
"""

import copy
import traceback
from dataclasses import dataclass, replace

from kvspec.spec.models import model_for
from kvspec.spec.outcomes import InvalidRequest
from kvspec.spec.snapshot import EngineConfig

from .allocator_driver import AllocatorDriver
from .checks import InvariantViolation, StepFailure, StepNotApplicable, Tally
from .declarations import Capability
from .engine_driver import EngineDriver
from .needs import needs
from .protocol import Adapter, AdapterError, Declaration, load_adapter
from .scheduler_driver import SchedulerDriver
from .trace import Trace, TraceError


@dataclass
class Replay:
    """How a replay went: the `failure` (a StepFailure) at step `stopped_at`, if any. An
    observable other than the expected one is a failure of OBS-3."""

    steps: int
    """Steps applied and checked."""
    failure: StepFailure | None = None
    stopped_at: int | None = None
    tally: Tally | None = None
    observed: list | None = None
    """What the implementation showed after each applied step."""
    cause: str = ""
    """The traceback of what the implementation raised at the failing step (a crash, a
    refusal), or "": text, as the failure's own `__cause__` does not cross from a worker."""

    @property
    def conforms(self) -> bool:
        return self.failure is None

    def reproduces(self, trace: Trace) -> bool:
        """Whether this replay broke a clause the trace records, at the same step (a trace
        of no steps records a failure of the fresh implementation: any failure there)."""
        if not trace.steps:
            return self.failure is not None and self.stopped_at == 0
        at = next((i for i, step in enumerate(trace.steps) if step.violated), None)
        return (self.failure is not None and at == self.stopped_at
                and bool(set(self.failure.clauses or (self.failure.kind,)) & set(trace.steps[at].violated)))

    def verdict(self) -> str:
        if self.failure is not None:
            return f"{self.failure.kind} at step {self.stopped_at}: {self.failure}"
        return f"conforms: {self.steps} steps"


def unmet_requirements(trace: Trace, adapter: Declaration) -> list[str]:
    """What the trace needs that the adapter lacks (its tier, its policy version, a
    capability its header's `needs` names, or, without them, its steps need: needs.py):
    such a trace is skipped, and reported as skipped, never as passed."""
    unmet = [] if trace.tier in adapter.tiers else [f"the {trace.tier} tier"]
    version = trace.config["policy"]["version"] if trace.tier == "engine" else adapter.policy_version
    if version not in adapter.policy_versions:  # WIN-1: a version it does not implement, or another model's
        unmet.append(f"policy version {version} (it implements {', '.join(adapter.policy_versions)})")
    capabilities = (adapter.for_version(version) or adapter).capabilities
    return unmet + [f"capability {capability}" for capability in needs(trace) if capability not in capabilities]


def build_driver(trace: Trace, adapter: Adapter, log=lambda line: None):
    """The implementation the trace's configuration describes, behind its tier's driver."""
    observables = adapter.observables
    config = trace.config
    if trace.tier == "allocator":
        if adapter.make_allocator is None:
            raise AdapterError(f"adapter {adapter.name!r} has no allocator tier, but the trace is an allocator trace")
        return AllocatorDriver(adapter.make_allocator(config["size_full"], config["size_swa"], config["page_size"]),
                               config["page_size"], observables, log=log, capabilities=adapter.capabilities)
    if trace.tier == "scheduler":
        if adapter.make_scheduler is None:
            raise AdapterError(f"adapter {adapter.name!r} has no scheduler tier, but the trace is a scheduler trace")
        scheduler_config = trace.scheduler_config()
        return SchedulerDriver(adapter.make_scheduler(scheduler_config), scheduler_config, adapter.model, observables,
                               log=log)
    if adapter.make_engine is None:
        raise AdapterError(f"adapter {adapter.name!r} has no engine tier, but the trace is an engine trace")
    engine_config: EngineConfig = trace.engine_config()
    engines = adapter.for_version(engine_config.policy.version) or adapter  # its engines of the trace's model
    return EngineDriver(adapter.make_engine(engine_config), model_for(engines.model, engine_config),
                        engines.observables, log=log)


def mismatch(expected: dict, observed: dict) -> str | None:
    """The first observable that differs, in words."""
    for key, value in expected.items():
        if observed.get(key) != value:
            return f"{key}: expected {value!r}, observed {observed.get(key)!r}"
    return None


def replay(trace: Trace, adapter: Adapter, log=lambda line: None, compare: bool = True, journal=None,
           judge_trace: bool = False) -> Replay:
    """Apply the trace's steps to a fresh implementation; see the module docstring.
    `journal` (isolation.Journal) hears of each step before it runs, and of the build.
    With `judge_trace`, a step that fails because the trace itself breaks the lifecycle
    raises TraceError instead (trace_fault): a bad trace, not a failure of the adapter."""
    if journal is not None:
        journal("building", trace.tier)  # a hang building the implementation is a step's hang
    try:
        driver = build_driver(trace, adapter, log)
    except StepFailure as failure:  # the fresh engine already breaks an invariant
        return Replay(0, failure, stopped_at=0, cause=raised(failure))
    observed = []
    divergence: tuple[int, StepFailure] | None = None  # the first step whose observables differ
    differed = ""  # how they differ there
    for index, step in enumerate(trace.steps):
        log(f"step {index}: {step}")
        if journal is not None:
            journal("step", step)
        try:
            now = driver.apply(replace(step, args=copy.deepcopy(step.args)))  # the trace stays what it says
        except StepFailure as failure:
            # judged whether or not an observable differed before: the reference judges by
            # what the implementation showed, never by the trace's own `expect`, which may be
            # what is wrong (then a later step the lifecycle forbids is the trace's fault too)
            if judge_trace and (why := trace_fault(trace, index, observed)):
                raise TraceError(f"step {index} (line {index + 2}: {step}) is not a step the spec's lifecycle "
                                 f"allows here: {why}; the trace is at fault, not the implementation: fix or drop "
                                 f"that step (mark a misuse the spec requires refused with \"refuse\": true)"
                                 + (f"; its expect after step {divergence[0]} is not what the reference shows "
                                    f"either ({differed})" if divergence is not None else "")
                                 ) from failure
            if isinstance(failure, StepNotApplicable) and divergence is not None:
                break  # the implementation went another way at the divergence: that is the finding
            failure = unmarked_refusal(failure, step)
            return Replay(index, failure, stopped_at=index, tally=driver.tally, observed=observed,
                          cause=raised(failure))
        observed.append(now)
        if compare and divergence is None and step.expect is not None and (difference := mismatch(step.expect, now)):
            divergence = index, InvariantViolation(f"after {step}, {difference} (the spec fixes it)", ["OBS-3"])
            differed = difference
    if divergence is not None:
        at, failure = divergence
        return Replay(at, failure, stopped_at=at, tally=driver.tally, observed=observed)
    return Replay(len(trace.steps), tally=driver.tally, observed=observed)


def unmarked_refusal(failure: StepFailure, step) -> StepFailure:
    """[LIFE-1] A refusal, at a step the trace neither marks refused nor records an
    expectation for, of a call the lifecycle allows: worded for the trace that is then the
    likely cause (one written by hand, where a misuse lacks `"refuse": true`), not only for
    the engine. The clause stays LIFE-1: the spec requires the step accepted either way.
    Any other failure is returned as it is."""
    if (step.refuse or step.expect is not None or step.op == "drain" or not isinstance(failure, InvariantViolation)
            or failure.clauses != ("LIFE-1",) or not isinstance(failure.__cause__, InvalidRequest)):
        return failure
    reworded = InvariantViolation(
        f"{step.op} was refused ({failure.__cause__}), but the trace does not mark this step \"refuse\": true, so "
        f"replay expected it to be accepted: the lifecycle allows it in the state the engine showed before it. "
        f"If the step is meant as a misuse the engine must refuse, mark it \"refuse\": true in the trace (replay "
        f"then says whether the lifecycle forbids it); else the engine refused a step it must accept", ["LIFE-1"])
    reworded.__cause__ = failure.__cause__
    return reworded


def raised(failure: StepFailure) -> str:
    """The traceback of what the implementation raised under `failure`, or "" (Replay.cause)."""
    return "".join(traceback.format_exception(failure.__cause__)) if failure.__cause__ is not None else ""


def trace_fault(trace: Trace, index: int, observed: list) -> str | None:
    """[LIFE-1] Why step `index` of the trace is itself at fault, or None when the
    failure there is the implementation's. A trace may name a request it never admitted,
    or (from the outcomes its `expect` records) admit one still running, whatever the
    model. Of a trace of a version the reference implements, it decides the rest (the spec's lifecycle
    state: a prefill still going on, a trim beyond a request's own tokens, a sequence
    the allocator tier never made): the step is at fault when the reference, which
    showed what the implementation showed at every step before (OBS-3, so both stood in
    the spec's same state), cannot apply it either, or must refuse it while the trace
    does not mark it refused, or accepts it while the trace marks it refused."""
    step = trace.steps[index]
    if trace.tier != "allocator" and not step.refuse and (why := unknown_request(trace, index)):
        return why
    if trace.tier == "scheduler":
        return None  # no reference for the plans of a scheduler: only what the trace itself shows
    try:
        reference = load_adapter("reference")
        if trace.tier == "engine" and reference.for_version(trace.config["policy"]["version"]) is None:
            return None  # no reference for this version: only what the trace itself shows
        prefix = replace(trace, steps=tuple(replace(s, expect=None) for s in trace.steps[:index + 1]))
        result = replay(prefix, reference, compare=False)
    except AdapterError:  # the reference cannot build this configuration: it cannot judge
        return None
    failure = result.failure
    if failure is None or result.stopped_at != index or (result.observed or [])[:index] != observed[:index]:
        return None
    if isinstance(failure, StepNotApplicable):
        return str(failure)
    if isinstance(failure.__cause__, InvalidRequest):
        return f"the spec refuses it ({failure.__cause__})"
    if step.refuse and failure.clauses == ("LIFE-1",):
        return "it is marked refused, but the lifecycle allows it"
    return None


ARRIVALS = ("admit", "pd_admit", "submit")
"""The steps that bring a request in: the engine tier's admissions, the scheduler tier's submission."""


def unknown_request(trace: Trace, index: int) -> str | None:
    """What the trace alone shows wrong with step `index`: a request it never admitted
    (submitted), or one it admits while an earlier admission (recorded as ok) still
    runs; at the scheduler tier, one it submits a second time."""
    step = trace.steps[index]
    rid = step.args.get("rid")
    admitted: set[str] = set()
    running: set[str] = set()
    for earlier in trace.steps[:index]:
        if earlier.refuse:
            continue
        if earlier.op in ARRIVALS:
            admitted.add(earlier.args["rid"])
            if earlier.op == "submit" or earlier.expect is not None and earlier.expect.get("outcome") == "ok":
                running.add(earlier.args["rid"])
        elif earlier.op in ("finish", "abort", "retract"):
            running.discard(earlier.args["rid"])
        elif earlier.op == "finish_batch":
            running.difference_update(finish["rid"] for finish in earlier.args["finishes"])
        elif earlier.op == "prefill_batch" and (earlier.expect is None or earlier.expect.get("outcome") == "ok"):
            running.difference_update(chunk["rid"] for chunk in earlier.args["chunks"] if chunk.get("finish"))
        elif earlier.op == "drain":
            running.clear()
    if step.op == "submit" and rid in admitted:
        return f"request {rid!r} was submitted before; a request id is submitted once"
    if step.op in ("admit", "pd_admit"):
        return f"request {rid!r} is already running (admitted earlier, not released since)" if rid in running else None
    if rid is not None and rid not in admitted:
        return f"request {rid!r} was never admitted before this step"
    return None


def with_expectations(trace: Trace, reference: Adapter) -> Trace:
    """The trace with each step's `expect` set to what the reference shows (OBS-3), up to
    the first step the reference cannot apply or does not conform on. A trace of a
    policy version the reference does not implement keeps none, nor does a scheduler-tier
    trace, whose plans are the scheduler's to choose."""
    if trace.tier == "scheduler" or (trace.tier == "engine"
                                     and reference.for_version(trace.engine_config().policy.version) is None):
        return trace
    result = replay(replace(trace, steps=tuple(replace(s, expect=None) for s in trace.steps)), reference, compare=False)
    steps = [replace(step, expect=seen) for step, seen in zip(trace.steps, result.observed or [])]
    return replace(trace, steps=(*steps, *trace.steps[len(steps):]))
