"""The plan of a check: which runs it makes, at which policy version and memory model, with
which rules on, and what it leaves out.

`plan(adapter, against)` decides it once, from the adapter's declaration (plain data:
protocol.Declaration, never its code) and, in a differential check, the other adapter's.
Everything downstream carries the planned runs it returns: `--run` picks among them, the
workers build each one's state machine (`PlannedRun.machine`), the reports, JUnit and
the pytest items take their names and markers from them, the zoo finds a mutant's run
among them. No module parses a run's label back into a configuration.

A run is made at the adapter's own policy version; an adapter whose versions span memory
models (the reference's: chapters 01-07 and 08) also gets each other model's engine runs,
at that model's first version, named by the model ("block-pool P=4 W=6 I=4"). In a
differential check only the runs both adapters can make are planned: the spec fixes no
scheduler's plan, so none of the scheduler tier.
"""

from dataclasses import dataclass, replace

from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.models import MemoryModel, with_state
from kvspec.spec.scheduler import STATE
from kvspec.spec.window import EVERY_GROUP, Policy, PolicyVersion

from ..harness.allocator_machine import allocator_machine
from ..harness.declarations import RUNS, Capability, Run, Tier
from ..harness.engine_machine import engine_machine
from ..harness.protocol import Adapter, AdapterError, Declaration
from ..harness.recording import RecordingMachine
from ..harness.scheduler_machine import scheduler_machine

PAGE_SIZE_CAPABILITY = {True: Capability.PAGE_SIZE_1, False: Capability.PAGE_SIZE_GT_1}


@dataclass(frozen=True)
class Target:
    """What a run checks: an adapter's engines of one policy version (its memory model, and
    the capabilities and observables its engines of that version have)."""

    version: PolicyVersion
    model: MemoryModel
    capabilities: frozenset[Capability]
    observables: frozenset[str]
    chunk_release: bool = True
    null_block_counted: bool = True
    uncached_first: tuple[str, ...] = EVERY_GROUP

    @classmethod
    def of(cls, adapter: Declaration) -> "Target":
        return cls(adapter.policy_version, adapter.model, adapter.capabilities, adapter.observables,
                   adapter.chunk_release, adapter.null_block_counted, adapter.uncached_first)


@dataclass(frozen=True)
class PlannedRun:
    """One run of a check: a `Run` of the matrix at one target, and, in a differential
    check, the other adapter's target it is compared with."""

    run: Run
    target: Target
    label: str
    """How reports, JUnit, the pytest items and `--run` name it, e.g. "engine P=4 W=6 I=4"."""
    compared: Target | None = None

    @property
    def tier(self) -> Tier:
        return self.run.tier

    @property
    def description(self) -> dict:
        """The run as data, for the JSON report and pytest markers: its tier and
        configuration, policy version and memory model."""
        return {"tier": str(self.tier), "page_size": self.run.page_size, "window": self.run.window,
                "interval": self.run.interval, "state_grid": self.run.state_grid, "state": self.run.recurrent,
                "policy_version": str(self.target.version), "memory_model": self.target.model.name}

    @property
    def markers(self) -> dict:
        """The pytest marker's arguments: kvspec(tier='engine', P=4, W=6, I=4, state=False,
        model='two-pool', policy='sglang-0.5.23')."""
        return {"tier": str(self.tier), **self.run.settings, "state": self.run.recurrent,
                "model": self.target.model.name, "policy": str(self.target.version)}

    def machine(self, adapter: Adapter, shadow: Adapter | None = None) -> type[RecordingMachine]:
        """This run's state machine, driving `adapter` (and, in a differential check, the
        same steps on `shadow`), both as their engines of the target's version are."""
        run, target = self.run, self.target
        implementation = adapter.for_version(target.version)
        compared = shadow.for_version(target.version) if shadow is not None else None
        if run.tier == Tier.ALLOCATOR:
            return allocator_machine(implementation.make_allocator, run.page_size, target.capabilities,
                                     target.observables, shadow=compared)
        if run.tier == Tier.SCHEDULER:
            return scheduler_machine(implementation.make_scheduler, run.page_size, run.window, target.observables,
                                     target.model, (FULL, SWA, STATE) if run.state else (FULL, SWA),
                                     pressure=Capability.PREEMPTS_ONLY_WHEN_NEEDED in target.capabilities)
        return engine_machine(implementation.make_engine, run.page_size, run.window,
                              Policy(target.version, run.interval, target.chunk_release, target.null_block_counted,
                                     target.uncached_first),
                              target.capabilities,
                              target.observables, shadow=compared, model=target.model, state_grid=run.state_grid)


@dataclass(frozen=True)
class Skipped:
    """Something a check leaves out, and why: never counted as passed."""

    what: str
    why: str


@dataclass(frozen=True)
class Plan:
    """Every run of one check, and what it leaves out."""

    runs: tuple[PlannedRun, ...]
    skipped: tuple[Skipped, ...] = ()

    @property
    def labels(self) -> list[str]:
        return [planned.label for planned in self.runs]

    def select(self, texts: list[str]) -> "Plan":
        """The runs `--run TEXT ...` picks: each TEXT the run it names exactly, else every
        run whose label contains it; AdapterError when none is picked."""
        labels = self.labels
        chosen = tuple(planned for planned in self.runs
                       if any(planned.label == text or (text not in labels and text in planned.label)
                              for text in texts))
        if not chosen:
            raise AdapterError(f"no run matches --run {' '.join(texts)}; the runs are: {', '.join(labels)}")
        return replace(self, runs=chosen)

    def named(self, label: str) -> PlannedRun:
        """The planned run of this label; AdapterError when the check makes none."""
        found = next((planned for planned in self.runs if planned.label == label), None)
        if found is None:
            raise AdapterError(f"the check makes no run {label!r}; its runs are: {', '.join(self.labels)}")
        return found

    def of(self, run: Run) -> PlannedRun:
        """The planned run of `run` at the adapter's own policy version (how a mutant names the
        run that exposes it); AdapterError when the check makes no such run."""
        found = next((planned for planned in self.runs if planned.run == run and planned.label == run.label), None)
        if found is None:
            raise AdapterError(f"the check makes no run {run.label!r}; its runs are: {', '.join(self.labels)}")
        return found


def applies(adapter: Declaration, run: Run) -> bool:
    """Whether the adapter, as its engines of one version are, can make the run."""
    if PAGE_SIZE_CAPABILITY[run.page_size == 1] not in adapter.capabilities or run.tier not in adapter.tiers:
        return False
    if run.tier == Tier.SCHEDULER:
        return not run.state or Capability.STATE_GROUP in adapter.capabilities
    if run.tier == Tier.ALLOCATOR or run.state_grid is None:
        return True
    return (Capability.RECURRENT_STATE in adapter.capabilities and with_state(adapter.model) is not None
            and (run.page_size == 1 or Capability.PAGED_RECURRENT_STATE in adapter.capabilities))


def planned_runs(adapter: Declaration, against: Declaration | None = None) -> tuple[PlannedRun, ...]:
    """The runs of a check of `adapter` (with `against`: of a differential check)."""
    made = []
    for version in adapter.model_versions():
        implementation = adapter.for_version(version)
        compared = against.for_version(version) if against is not None else None
        if against is not None and compared is None:
            continue
        own = version == adapter.policy_version
        for run in RUNS:
            if (not applies(implementation, run) or (compared is not None and not applies(compared, run))
                    or run.tier != Tier.ENGINE and not own  # one allocator and one scheduler tier per adapter
                    or run.tier == Tier.SCHEDULER and against is not None):  # the spec fixes no plan to compare
                continue
            made.append(PlannedRun(run, Target.of(implementation), run.named(str(run.tier) if own else
                                                                             implementation.model.name),
                                   Target.of(compared) if compared is not None else None))
    return tuple(made)


def plan(adapter: Declaration, against: Declaration | None = None) -> Plan:
    """The plan of a check of `adapter` (see the module docstring); AdapterError where no run
    applies, or where a differential check has no run in common."""
    if not {Capability.PAGE_SIZE_1, Capability.PAGE_SIZE_GT_1} & adapter.capabilities:
        raise AdapterError(f"adapter {adapter.name!r} declares neither page_size_1 nor page_size_gt_1, so no run "
                           f"applies; add the page sizes it supports to its capabilities")
    runs = planned_runs(adapter, against)
    if against is not None and not runs:
        raise AdapterError(f"adapter {adapter.name!r} and {against.name!r} have no run in common: {against.name!r} "
                           f"implements none of {', '.join(adapter.policy_versions)} at the tiers and page sizes "
                           f"{adapter.name!r} has")
    skipped = []
    if against is not None:
        made = {planned.label for planned in runs}
        skipped += [Skipped(planned.label, f"{against.spec or against.name} cannot make this run to compare with "
                                           f"(a version, tier or capability it lacks)")
                    for planned in planned_runs(adapter) if planned.label not in made]
    skipped += [Skipped(f"{tier} tier", f"adapter has no {tier} tier") for tier in Tier if tier not in adapter.tiers]
    for capability in Capability:
        if (capability in adapter.capabilities or not set(capability.tiers) & adapter.tiers
                or capability.refines is not None and capability.refines not in adapter.capabilities):
            continue  # had, read by no tier it has, or refining one it lacks (that one is listed)
        skipped.append(Skipped(str(capability), f"adapter lacks capability {capability}: its runs or rules do not "
                                                f"run"))
    return Plan(runs, tuple(skipped))
