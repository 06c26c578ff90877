"""Replaying a trace: its steps, in order, on an adapter's implementation.

Each step goes through the tier's driver, so every invariant is checked after it, and
what the implementation shows is compared with the step's `expect` (the observables
the spec fixes, OBS-3). A replay ends at the first step that violates a clause or crashes.
Observables other than expected are a violation of OBS-3, reported at the first step
that shows them when no later step breaks a clause (a divergence often leads to one,
which is then the finding) or when a later step cannot be applied.
"""

from dataclasses import dataclass, replace

from kvspec.spec.models import TWO_POOL, model_of_version
from kvspec.spec.snapshot import EngineConfig

from .allocator_driver import AllocatorDriver
from .checks import InvariantViolation, StepFailure, StepNotApplicable, Tally
from .engine_driver import EngineDriver
from .protocol import Adapter, AdapterError
from .trace import Trace


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


def unmet_requirements(trace: Trace, adapter: Adapter) -> list[str]:
    """What the trace needs that the adapter lacks (a tier, a capability): such a trace is
    skipped, and reported as skipped, never as passed."""
    needs = {"tier": trace.tier, "page_size_1" if trace.config["page_size"] == 1 else "page_size_gt_1": True}
    for step in trace.steps:
        if step.op == "pd_admit":
            needs["pd_decode"] = True
        elif step.op == "fork" and step.args.get("tail") is not None:
            needs["swa_tail"] = True
        elif step.op.startswith("free_group"):
            needs["free_groups"] = True
    factory = adapter.make_allocator if trace.tier == "allocator" else adapter.make_engine
    unmet = [] if factory is not None else [f"the {trace.tier} tier"]
    version = trace.config["policy"]["version"] if trace.tier == "engine" else adapter.policy_version
    if model_of_version(version) is not adapter.model:  # WIN-1: another memory model
        unmet.append(f"policy version {version} (it implements {adapter.policy_version})")
    return unmet + [f"capability {c}" for c in needs if c != "tier" and c not in adapter.capabilities]


def build_driver(trace: Trace, adapter: Adapter, log=lambda line: None):
    """The implementation the trace's configuration describes, behind its tier's driver."""
    observables = adapter.observables
    config = trace.config
    if trace.tier == "allocator":
        if adapter.make_allocator is None:
            raise AdapterError(f"adapter {adapter.name!r} has no allocator tier, but the trace is an allocator trace")
        return AllocatorDriver(adapter.make_allocator(config["size_full"], config["size_swa"], config["page_size"]),
                               config["page_size"], observables, log=log,
                               atomic_decode="atomic_alloc_decode" in adapter.capabilities)
    if adapter.make_engine is None:
        raise AdapterError(f"adapter {adapter.name!r} has no engine tier, but the trace is an engine trace")
    engine_config: EngineConfig = trace.engine_config()
    return EngineDriver(adapter.make_engine(engine_config), adapter.model, observables, log=log)


def mismatch(expected: dict, observed: dict) -> str | None:
    """The first observable that differs, in words."""
    for key, value in expected.items():
        if observed.get(key) != value:
            return f"{key}: expected {value!r}, observed {observed.get(key)!r}"
    return None


def replay(trace: Trace, adapter: Adapter, log=lambda line: None, compare: bool = True, journal=None) -> Replay:
    """Apply the trace's steps to a fresh implementation; see the module docstring.
    `journal` (isolation.Journal) hears of each step before it runs."""
    try:
        driver = build_driver(trace, adapter, log)
    except StepFailure as failure:  # the fresh engine already breaks an invariant
        return Replay(0, failure, stopped_at=0)
    observed = []
    divergence: tuple[int, StepFailure] | None = None  # the first step whose observables differ
    for index, step in enumerate(trace.steps):
        log(f"step {index}: {step}")
        if journal is not None:
            journal("step", step)
        try:
            now = driver.apply(step)
        except StepFailure as failure:
            if isinstance(failure, StepNotApplicable) and divergence is not None:
                break  # the implementation went another way at the divergence: that is the finding
            return Replay(index, failure, stopped_at=index, tally=driver.tally, observed=observed)
        observed.append(now)
        if compare and divergence is None and step.expect is not None and (difference := mismatch(step.expect, now)):
            divergence = index, InvariantViolation(f"after {step}, {difference} (the spec fixes it)", ["OBS-3"])
    if divergence is not None:
        at, failure = divergence
        return Replay(at, failure, stopped_at=at, tally=driver.tally, observed=observed)
    return Replay(len(trace.steps), tally=driver.tally, observed=observed)


def with_expectations(trace: Trace, reference: Adapter) -> Trace:
    """The trace with each step's `expect` set to what the reference shows (OBS-3), up to
    the first step the reference cannot apply or does not conform on. A trace of a
    shared block pool (policy vllm-0.33, spec chapter 08) keeps none: the reference
    models the two-pool versions, whose observables are not comparable."""
    if trace.tier == "engine" and model_of_version(trace.engine_config().policy.version) is not TWO_POOL:
        return trace
    result = replay(replace(trace, steps=tuple(replace(s, expect=None) for s in trace.steps)), reference, compare=False)
    steps = [replace(step, expect=seen) for step, seen in zip(trace.steps, result.observed or [])]
    return replace(trace, steps=(*steps, *trace.steps[len(steps):]))
