"""The adapter protocol: the one place an adapter writer reads (docs/writing-an-adapter.md
walks through it).

An adapter is any object (a module, a class, an instance) with these attributes:

    name                 a short name for reports
    policy_version       the spec policy version it implements (kvspec.spec.window)
    policy_versions      optional: every policy version it implements, policy_version among
                         them (default: policy_version alone); a trace of another version
                         is skipped by a replay, and reported as skipped. The versions may
                         be of several memory models: an engine built for a version is of
                         that version's model (kvspec.spec.models.model_of_version), and a
                         check runs each model's runs, at its first version listed
    memory_model         optional: the name of the memory model of its policy_version
                         (kvspec.spec.models.MODELS; default "two-pool"); its snapshots are
                         that model's type and only that model's invariants apply
    capabilities         a collection of CAPABILITIES it has; rules that need one it
                         lacks do not run, and the report says so
    version_capabilities optional: {policy version: capabilities} for the versions whose
                         engines have other capabilities than `capabilities`
    observables          optional: which of its model's observables its snapshots fill
                         in (default: all); checks that read one it lacks are reported as
                         skipped, never as passed (an engine of another of its models
                         shows all of that model's)
    make_allocator       (size_full, size_swa, page_size) -> Allocator    allocator tier
    make_engine          (EngineConfig) -> Engine                         engine tier
    make_scheduler       (SchedulerConfig) -> Scheduler                   scheduler tier
    preload              optional: modules to import once in the forkserver (slow imports)

At least one tier. What the factories build is typed below (`Allocator`, `Engine`,
`Scheduler`). At the scheduler tier (spec chapter 10) the implementation's own scheduler
makes the plans; kvspec only submits requests and returns each forward's result.
Operations return plain data, an allocation either its slots or
kvspec.spec.outcomes.OutOfMemory, and raise kvspec.spec.outcomes errors on misuse.

`load_adapter(spec)` takes a name registered under the entry-point group
`kvspec.adapters` (the built-in `reference`, `sglang`, `vllm`, ... are registered by
kvspec's own pyproject.toml), a member of a registered family (`mutant-<slug>`,
`sglang-mutant-<slug>`, ...: kvspec.conformance.harness.families), or `module:attribute`, and
validates what it finds, with errors that say what is missing and how to fix it.
"""

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kvspec.spec.accounting import AllocatorState
from kvspec.spec.allocator import AllocatorOperation, HybridAllocatorOperations
from kvspec.spec.lifecycle import EngineOperation, EngineOperations
from kvspec.spec.models import MODELS, TWO_POOL, MemoryModel, model_of_version
from kvspec.spec.scheduler import SchedulerConfig, SchedulerOperations
from kvspec.spec.snapshot import EngineConfig, EngineSnapshot
from kvspec.spec.window import POLICY_VERSIONS

from . import families

CAPABILITIES = ("page_size_1", "page_size_gt_1", "swa_tail", "prefix_sharing", "free_groups",
                "chunked_prefill", "pd_decode", "refuses_misuse", "atomic_alloc_decode", "recurrent_state",
                "paged_recurrent_state", "releases_state_at_stop", "preempts_only_when_needed", "state_group",
                "pd_checkpoint_keeps_window", "batched_prefill")
"""recurrent_state: engines built with a state pool (EngineConfig.state_slots, chapter 09)
show its memory model's snapshot with state; the runs with state need it, and those at a
page size > 1 need paged_recurrent_state too (SGLang keeps a state at page size 1 only,
without its extra buffer). releases_state_at_stop: a finish with a stop that leaves written
outputs past it frees the working state, which has read them, instead of keeping it as
the checkpoint of the shorter insert (STATE-9); without it the state runs finish without
such a stop. refuses_misuse: an invalid free raises InvalidFree and changes nothing (ALLOC-6);
atomic_alloc_decode: a failed alloc_decode changes nothing (ALLOC-4). Without them the
allocator machine does not try the misuse, and calls alloc_decode only with room.
preempts_only_when_needed: at the scheduler tier, a plan preempts a request only when its
rows need the pages (SCHED-7); without it the scheduler runs give every request room of
its own, so that no plan preempts (page pressure is then not exercised). state_group: at
the scheduler tier, a recurrent-state group beside the attention groups (the
scheduler+state runs, SCHED-9). pd_checkpoint_keeps_window: a PD-decode admission whose
prompt the engine checkpoints at once leaves that leaf a window (I10) at every window;
without it pd_admit is drawn only at windows where WIN-6's tail keeps one anyway
(`kvspec.spec.window.pd_checkpoint_at_risk`). batched_prefill: the engine offers
prefill_batch (LIFE-9), one chunk of each of several requests in one step; without it
every prefill step is one request's (CAPABILITY_OPERATIONS)."""

CAPABILITY_OPERATIONS = {"prefill_batch": "batched_prefill"}
"""Engine operations an adapter offers only with a capability: required then, else never called."""


class Allocator(HybridAllocatorOperations, Protocol):
    """What `make_allocator` builds: the operations of spec chapter 02, and what it shows."""

    def state(self) -> AllocatorState:
        """[OBS-1] Both pools, their free and pending pages, and the full->SWA mapping."""

    def available_sizes(self) -> tuple[int, int]:
        """The tokens each pool can still allocate (full, SWA)."""


class Engine(EngineOperations, Protocol):
    """What `make_engine` builds: the operations of spec chapter 06, and what it shows.
    An engine with large pools may also offer `partial_snapshot()` (OBS-4)."""

    def snapshot(self) -> EngineSnapshot:
        """[OBS-1] Everything observable, as its memory model's snapshot type."""


class Scheduler(SchedulerOperations, Protocol):
    """What `make_scheduler` builds: the operations of spec chapter 10, and what it shows."""


def operations(protocol: type) -> tuple[str, ...]:
    """The methods a protocol class requires, its own first, each once."""
    return tuple(dict.fromkeys(name for klass in protocol.__mro__ if klass not in (object, Protocol)
                               for name, member in vars(klass).items()
                               if callable(member) and not name.startswith("_")))


ALLOCATOR_OPERATIONS = operations(Allocator)
ENGINE_OPERATIONS = tuple(operation for operation in operations(Engine) if operation not in CAPABILITY_OPERATIONS)
SCHEDULER_OPERATIONS = operations(Scheduler)
PARAMETERS: dict[str, tuple[str, ...]] = {
    operation.value: tuple(inspect.signature(getattr(EngineOperations, operation.value)).parameters)[1:]
    for operation in EngineOperation}
"""Each engine operation's arguments, in the order it takes them: a trace step's `args`."""
assert set(ALLOCATOR_OPERATIONS) == {*AllocatorOperation, "state", "available_sizes"}
assert set(ENGINE_OPERATIONS) | set(CAPABILITY_OPERATIONS) == {*EngineOperation, "snapshot"}


class AdapterError(Exception):
    """An adapter that cannot be loaded or does not offer what it must (exit status 2)."""


@dataclass(frozen=True)
class Adapter:
    """A validated adapter."""

    name: str
    policy_version: str
    capabilities: frozenset[str]
    make_allocator: Callable[[int, int, int], Allocator] | None
    make_engine: Callable[[EngineConfig], Engine] | None
    model: MemoryModel = TWO_POOL
    observables: frozenset[str] = frozenset(TWO_POOL.observables)
    spec: str = ""
    """What it was loaded by: a worker process loads it again by this."""
    preload: tuple[str, ...] = ()
    """Modules worker processes import before forking (the implementation's slow imports)."""
    policy_versions: tuple[str, ...] = ()
    """Every policy version it implements (policy_version first)."""
    make_scheduler: Callable[[SchedulerConfig], Scheduler] | None = None
    version_capabilities: tuple[tuple[str, frozenset[str]], ...] = ()
    """(version, capabilities) of the versions whose engines have other capabilities."""

    def model_versions(self) -> tuple[str, ...]:
        """The first version of each memory model it implements, policy_version first: a
        check runs each model's runs at it."""
        firsts: dict[str, str] = {}
        for version in self.policy_versions or (self.policy_version,):
            firsts.setdefault(model_of_version(version).name, version)
        return tuple(firsts.values())

    def for_version(self, version: str) -> "Adapter | None":
        """The adapter as its engines of `version` are (that version's model, its
        capabilities and observables); None for a version it does not implement."""
        if version == self.policy_version:
            return self
        if version not in self.policy_versions:
            return None
        model = model_of_version(version)
        return replace(self, policy_version=version, model=model,
                       capabilities=dict(self.version_capabilities).get(version, self.capabilities),
                       observables=self.observables if model is self.model else frozenset(model.observables))


def resolve(spec: str) -> Any:
    """The object an adapter spec names."""
    try:
        registered = families.adapter(spec)
    except (families.UnknownMember, families.UnavailableMember) as error:
        raise AdapterError(str(error)) from None
    if registered is not None:
        return registered
    if ":" not in spec:
        raise AdapterError(f"unknown adapter {spec!r}; use one of {families.known_adapters()}, "
                           f"or module:attribute for your own")
    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # like `python -m`: an adapter beside you is found
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise AdapterError(f"adapter {spec!r}: cannot import module {module_name!r} ({error}); "
                           f"is it installed, or on PYTHONPATH?") from error
    except Exception as error:  # a syntax error, or the module's own code raised: the adapter's fault
        raise AdapterError(f"adapter {spec!r}: importing module {module_name!r} raised {type(error).__name__}: "
                           f"{error}; fix the module") from error
    if not hasattr(module, attribute):
        raise AdapterError(f"adapter {spec!r}: module {module_name!r} has no attribute {attribute!r}")
    return getattr(module, attribute)


def validate(candidate: Any, spec: str) -> Adapter:
    """Check an adapter object's declarations; raise AdapterError listing every problem.
    [WIN-1] The policy version it declares must be one the spec defines: it decides what
    the window checks require."""
    problems = []
    name = getattr(candidate, "name", spec)
    version = getattr(candidate, "policy_version", None)
    model = MODELS.get(getattr(candidate, "memory_model", TWO_POOL.name))
    if model is None:
        problems.append(f"memory_model must be one of {', '.join(MODELS)} (got {candidate.memory_model!r})")
        model = TWO_POOL
    if version not in POLICY_VERSIONS:
        problems.append(f"policy_version must be one of {', '.join(POLICY_VERSIONS)} (got {version!r})")
    elif version not in model.policy_versions:
        problems.append(f"policy_version {version!r} is not one of the {model.name} model "
                        f"({', '.join(model.policy_versions)}); declare its memory_model")
    versions = getattr(candidate, "policy_versions", (version,))
    versions = (versions,) if isinstance(versions, str) else tuple(versions)
    if version not in versions:
        problems.append(f"policy_versions {versions} must include its policy_version {version!r}")
    if stray := [v for v in versions if v not in POLICY_VERSIONS]:
        problems.append(f"policy_versions {stray} are no policy versions; choose from {', '.join(POLICY_VERSIONS)}")
    capabilities = frozenset(getattr(candidate, "capabilities", ()))
    unknown = sorted(capabilities - set(CAPABILITIES))
    if unknown:
        problems.append(f"unknown capabilities {unknown}; known: {', '.join(CAPABILITIES)}")
    version_capabilities = {v: frozenset(c) for v, c in dict(getattr(candidate, "version_capabilities", {})).items()}
    if stray := sorted(set(version_capabilities) - (set(versions) - {version})):
        problems.append(f"version_capabilities names {stray}: only its other policy_versions may have other "
                        f"capabilities (those of {version!r} are `capabilities`)")
    if unknown := sorted(set().union(*version_capabilities.values()) - set(CAPABILITIES)):
        problems.append(f"unknown capabilities {unknown} in version_capabilities; known: {', '.join(CAPABILITIES)}")
    observables = frozenset(getattr(candidate, "observables", model.observables))
    if unknown := sorted(observables - set(model.observables)):
        problems.append(f"unknown observables {unknown} for the {model.name} model; "
                        f"known: {', '.join(model.observables)}")
    make_allocator = getattr(candidate, "make_allocator", None)
    make_engine = getattr(candidate, "make_engine", None)
    make_scheduler = getattr(candidate, "make_scheduler", None)
    if make_allocator is None and make_engine is None and make_scheduler is None:
        problems.append("offers no tier: define make_allocator(size_full, size_swa, page_size), "
                        "make_engine(config) and/or make_scheduler(config)")
    for factory, label in ((make_allocator, "make_allocator"), (make_engine, "make_engine"),
                           (make_scheduler, "make_scheduler")):
        if factory is not None and not callable(factory):
            problems.append(f"{label} must be callable")
    if problems:
        raise AdapterError(f"adapter {spec!r} is not usable:\n  - " + "\n  - ".join(problems))
    preload = getattr(candidate, "preload", ())
    preload = (preload,) if isinstance(preload, str) else tuple(preload)
    return Adapter(name, version, capabilities, make_allocator, make_engine, model, observables, spec, preload,
                   (version, *(v for v in versions if v != version)), make_scheduler,
                   tuple(version_capabilities.items()))


def missing_operations(instance: Any, operations: tuple[str, ...]) -> list[str]:
    return [operation for operation in operations if not callable(getattr(instance, operation, None))]


def check_instance(instance: Any, operations: tuple[str, ...], tier: str, adapter: str) -> Any:
    """An allocator or engine an adapter built must offer every operation of its tier."""
    missing = missing_operations(instance, operations)
    if missing:
        raise AdapterError(f"adapter {adapter!r}: its {tier} lacks {', '.join(missing)}; "
                           f"implement them (see kvspec.conformance.harness.protocol)")
    return instance


def load_adapter(spec: str) -> Adapter:
    """Find, validate and wrap an adapter: its factories check what they build."""
    adapter = validate(resolve(spec), spec)

    def checked(factory, operations, tier):
        if factory is None:
            return None
        def build(*args):
            try:
                instance = factory(*args)
            except Exception as error:  # the adapter cannot even build its implementation
                raise AdapterError(f"adapter {spec!r}: make_{tier}{args} raised "
                                   f"{type(error).__name__}: {error}") from error
            return check_instance(instance, operations(*args) if callable(operations) else operations, tier, spec)

        return build

    def engine_operations(config: EngineConfig) -> tuple[str, ...]:
        """Every engine's operations, and those of the capabilities of its version's engines."""
        capabilities = (adapter.for_version(config.policy.version) or adapter).capabilities
        return ENGINE_OPERATIONS + tuple(operation for operation, capability in CAPABILITY_OPERATIONS.items()
                                         if capability in capabilities)

    return replace(adapter, make_allocator=checked(adapter.make_allocator, ALLOCATOR_OPERATIONS, "allocator"),
                   make_engine=checked(adapter.make_engine, engine_operations, "engine"),
                   make_scheduler=checked(adapter.make_scheduler, SCHEDULER_OPERATIONS, "scheduler"))
