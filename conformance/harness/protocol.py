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
    chunk_release        optional: False for an engine whose chunked prefill keeps every
                         chunk's SWA (the policy's chunk_release, spec WIN-4; default True)
    null_block_counted   optional: False for a shared block pool that does not maintain its
                         null block's reference count (the policy's, spec BLOCK-3; default True)
    uncached_first       optional: the group kinds ("full", "swa") whose releases queue the
                         blocks they free without a key at the head (the policy's, spec
                         BLOCK-10; default both)
    memory_model         optional: the name of the memory model of its policy_version
                         (kvspec.spec.models.MODELS; default "two-pool"); its snapshots are
                         that model's type and only that model's invariants apply
    capabilities         a collection of the Capability names it has (declarations.py, one
                         table with what each turns on); rules that need one it
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
    built_for            optional: the engine releases it drives (built_for.BuiltFor); where
                         another release is installed, loading it is an AdapterError naming
                         both and what to use instead (exit 2), never a run

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
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kvspec.spec.accounting import AllocatorState
from kvspec.spec.allocator import AllocatorOperation, HybridAllocatorOperations
from kvspec.spec.lifecycle import EngineOperation, EngineOperations
from kvspec.spec.models import MODELS, TWO_POOL, MemoryModel
from kvspec.spec.scheduler import SchedulerConfig, SchedulerOperations
from kvspec.spec.snapshot import EngineConfig, EngineSnapshot
from kvspec.spec.window import EVERY_GROUP, POLICY_VERSIONS, PolicyVersion

from . import families
from .built_for import BuiltFor, release_problem
from .declarations import OPTIONAL_OPERATIONS, Capability, Tier


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
ENGINE_OPERATIONS = tuple(operation for operation in operations(Engine) if operation not in OPTIONAL_OPERATIONS)
SCHEDULER_OPERATIONS = operations(Scheduler)
PARAMETERS: dict[str, tuple[str, ...]] = {
    operation.value: tuple(inspect.signature(getattr(EngineOperations, operation.value)).parameters)[1:]
    for operation in EngineOperation}
"""Each engine operation's arguments, in the order it takes them: a trace step's `args`."""
# The protocol classes and the spec's operation names are written in two places; a
# difference is kvspec's own mistake, raised at import (never an `assert`: `python -O`)
if set(ALLOCATOR_OPERATIONS) != {*AllocatorOperation, "state", "available_sizes"} or \
        set(ENGINE_OPERATIONS) | set(OPTIONAL_OPERATIONS) != {*EngineOperation, "snapshot"}:
    raise ImportError("kvspec's protocol classes and the spec's operations (AllocatorOperation, EngineOperation) "
                      "name different operations")


class AdapterError(Exception):
    """An adapter that cannot be loaded or does not offer what it must (exit status 2)."""


@dataclass(frozen=True)
class Declaration:
    """What an adapter declares, as plain data: everything but its factories. It pickles,
    so a worker process that loaded the adapter hands it to the harness, whose own process
    never runs adapter code; the plan of a check (kvspec.conformance.runs.plan) is made
    from it."""

    name: str
    policy_version: PolicyVersion
    capabilities: frozenset[Capability]
    model: MemoryModel = TWO_POOL
    observables: frozenset[str] = frozenset(TWO_POOL.observables)
    spec: str = ""
    """What it was loaded by: a worker process loads it again by this."""
    preload: tuple[str, ...] = ()
    """Modules worker processes import before forking (the implementation's slow imports)."""
    policy_versions: tuple[PolicyVersion, ...] = ()
    """Every policy version it implements (policy_version first)."""
    version_capabilities: tuple[tuple[PolicyVersion, frozenset[Capability]], ...] = ()
    """(version, capabilities) of the versions whose engines have other capabilities."""
    tiers: frozenset[Tier] = frozenset()
    """The tiers it has a factory for."""
    built_for: BuiltFor | None = None
    """The engine releases it drives (built_for.py), where it drives a real engine."""
    home: str = ""
    """The module that defines it: its package is the adapter's own code (built_for.adapter_fault)."""
    null_block_counted: bool = True
    """Whether its engines keep the null block's reference count at 0 (the policy's, BLOCK-3)."""
    uncached_first: tuple[str, ...] = EVERY_GROUP
    """The groups whose releases queue uncached blocks at the head (the policy's, BLOCK-10)."""
    chunk_release: bool = True
    """Whether its engines release a chunked prefill's out-of-window SWA (the policy's
    `chunk_release`, WIN-4): the policy its runs are checked against."""

    def model_versions(self) -> tuple[PolicyVersion, ...]:
        """The first version of each memory model it implements, policy_version first: a
        check runs each model's runs at it."""
        firsts: dict[str, PolicyVersion] = {}
        for version in self.policy_versions or (self.policy_version,):
            firsts.setdefault(PolicyVersion(version).model_name, PolicyVersion(version))
        return tuple(firsts.values())

    def for_version(self, version: str):
        """The adapter as its engines of `version` are (that version's model, its
        capabilities and observables); None for a version it does not implement."""
        if version == self.policy_version:
            return self
        if version not in self.policy_versions:
            return None
        version = PolicyVersion(version)
        model = version.model
        return replace(self, policy_version=version, model=model,
                       capabilities=dict(self.version_capabilities).get(version, self.capabilities),
                       observables=self.observables if model is self.model else frozenset(model.observables))

    @property
    def declaration(self) -> "Declaration":
        return self


@dataclass(frozen=True)
class Adapter(Declaration):
    """A validated adapter: its declaration and its factories."""

    make_allocator: Callable[[int, int, int], Allocator] | None = None
    make_engine: Callable[[EngineConfig], Engine] | None = None
    make_scheduler: Callable[[SchedulerConfig], Scheduler] | None = None
    tiers: frozenset[Tier] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "tiers", frozenset(tier for tier, factory in (
            (Tier.ALLOCATOR, self.make_allocator), (Tier.ENGINE, self.make_engine),
            (Tier.SCHEDULER, self.make_scheduler)) if factory is not None))

    def factory(self, tier: Tier) -> Callable | None:
        return {Tier.ALLOCATOR: self.make_allocator, Tier.ENGINE: self.make_engine,
                Tier.SCHEDULER: self.make_scheduler}[tier]

    @property
    def declaration(self) -> Declaration:
        """The same without its factories: what pickles (Declaration)."""
        return Declaration(**{name: getattr(self, name) for name in Declaration.__dataclass_fields__})


def resolve(spec: str) -> Any:
    """The object an adapter spec names. Importing its module runs the adapter's code: any
    way that code ends (an exception, `sys.exit`, a KeyboardInterrupt it raises) is an
    AdapterError naming it; a check imports it in a worker process (isolation.py), where a
    crash or a hang at import cannot take the harness with it."""
    try:
        registered = families.adapter(spec)
    except (families.UnknownMember, families.UnavailableMember) as error:
        raise AdapterError(str(error)) from None
    except BaseException as error:  # noqa: BLE001 - a registered package's own code failed at import
        raise AdapterError(f"adapter {spec!r}: loading it {ended(error)}; fix or reinstall the package that "
                           f"registers it") from None
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
    except BaseException as error:  # noqa: BLE001 - a syntax error, or the module's own code: the adapter's fault
        raise AdapterError(f"adapter {spec!r}: importing module {module_name!r} {ended(error)}; fix the module"
                           ) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise AdapterError(f"adapter {spec!r}: module {module_name!r} has no attribute {attribute!r}") from None
    except BaseException as error:  # noqa: BLE001 - a module __getattr__ of the adapter's
        raise AdapterError(f"adapter {spec!r}: reading {attribute!r} of module {module_name!r} {ended(error)}"
                           ) from None


def ended(error: BaseException) -> str:
    """How the adapter's code ended, in words: 'called sys.exit(0)', 'raised ValueError: x'."""
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r}) (a module that exits at import checks nothing)"
    return f"raised {type(error).__name__}: {error}"


def names(value: Any, attribute: str, problems: list[str], one_allowed: bool = False) -> tuple[str, ...]:
    """A declared collection of names as a tuple, or () with a problem saying what is wrong
    (a single string counts as one name only where `one_allowed`)."""
    if isinstance(value, str):
        if one_allowed:
            return (value,)
        problems.append(f"{attribute} must be a collection of names, e.g. ({value!r},), not the string {value!r}")
        return ()
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        problems.append(f"{attribute} must be a collection of names (a tuple or list of str), not {value!r}")
        return ()
    try:
        found = tuple(value)
    except Exception as error:  # noqa: BLE001 - iterating the adapter's own object
        problems.append(f"{attribute}: iterating it raised {type(error).__name__}: {error}")
        return ()
    if wrong := [item for item in found if not isinstance(item, str)]:
        problems.append(f"{attribute} holds {wrong!r}, which are not names (str)")
        return tuple(item for item in found if isinstance(item, str))
    return found


def validate(candidate: Any, spec: str) -> Adapter:
    """Check an adapter object's declarations; raise AdapterError listing every problem,
    each naming the attribute (a value of the wrong type, a name the spec does not know,
    an attribute whose reading raises).
    [WIN-1] The policy version it declares must be one the spec defines: it decides what
    the window checks require."""
    problems = []

    def attribute(name: str, default: Any = None) -> Any:
        try:
            return getattr(candidate, name, default)
        except Exception as error:  # noqa: BLE001 - a property of the adapter's that raises
            problems.append(f"{name}: reading it raised {type(error).__name__}: {error}")
            return default

    name = attribute("name", spec)
    if not isinstance(name, str) or not name.strip():
        problems.append(f"name must be a non-empty string for reports (got {name!r})")
        name = spec
    model_name = attribute("memory_model", TWO_POOL.name)
    model = MODELS.get(model_name) if isinstance(model_name, str) else None
    if model is None:
        problems.append(f"memory_model must be one of {', '.join(MODELS)} (got {model_name!r})")
        model = TWO_POOL
    version = attribute("policy_version")
    if not isinstance(version, str) or version not in POLICY_VERSIONS:
        problems.append(f"policy_version must be one of {', '.join(POLICY_VERSIONS)} (got {str(version)!r})")
        version = None
    else:
        version = PolicyVersion(version)
        if version not in model.policy_versions:
            problems.append(f"policy_version {str(version)!r} is not one of the {model.name} model "
                            f"({', '.join(model.policy_versions)}); declare its memory_model")
    versions = names(attribute("policy_versions", (version,) if version else ()), "policy_versions", problems,
                     one_allowed=True)
    if version is not None and version not in versions:
        problems.append(f"policy_versions {versions} must include its policy_version {str(version)!r}")
    if stray := [v for v in versions if v not in POLICY_VERSIONS]:
        problems.append(f"policy_versions {stray} are no policy versions; choose from {', '.join(POLICY_VERSIONS)}")
    capabilities = names(attribute("capabilities", ()), "capabilities", problems)
    if unknown := sorted(set(capabilities) - set(Capability)):
        problems.append(f"unknown capabilities {unknown}; known: {', '.join(Capability)}")
    declared = attribute("version_capabilities", {})
    if not isinstance(declared, Mapping):
        problems.append(f"version_capabilities must be a mapping {{policy version: capabilities}}, not {declared!r}")
        declared = {}
    version_capabilities = {v: names(c, f"version_capabilities[{v!r}]", problems) for v, c in declared.items()}
    if stray := sorted(map(str, set(version_capabilities) - (set(versions) - {version}))):
        problems.append(f"version_capabilities names {stray}: only its other policy_versions may have other "
                        f"capabilities (those of {str(version)!r} are `capabilities`)")
    if unknown := sorted(set().union(*version_capabilities.values()) - set(Capability)):
        problems.append(f"unknown capabilities {unknown} in version_capabilities; known: {', '.join(Capability)}")
    observables = names(attribute("observables", model.observables), "observables", problems)
    if unknown := sorted(set(observables) - set(model.observables)):
        problems.append(f"unknown observables {unknown} for the {model.name} model; "
                        f"known: {', '.join(model.observables)}")
    preload = names(attribute("preload", ()), "preload", problems, one_allowed=True)
    chunk_release = attribute("chunk_release", True)
    if not isinstance(chunk_release, bool):
        problems.append(f"chunk_release must be True or False (got {chunk_release!r})")
    null_block_counted = attribute("null_block_counted", True)
    if not isinstance(null_block_counted, bool):
        problems.append(f"null_block_counted must be True or False (got {null_block_counted!r})")
    uncached_first = attribute("uncached_first", EVERY_GROUP)
    if not (isinstance(uncached_first, tuple) and set(uncached_first) <= set(EVERY_GROUP)):
        problems.append(f"uncached_first must be a tuple of group kinds, of 'full' and 'swa' (got {uncached_first!r})")
    factories = {tier: attribute(f"make_{tier}") for tier in Tier}
    if all(factory is None for factory in factories.values()):
        problems.append("offers no tier: define make_allocator(size_full, size_swa, page_size), "
                        "make_engine(config) and/or make_scheduler(config)")
    for tier, factory in factories.items():
        if factory is not None and not callable(factory):
            problems.append(f"make_{tier} must be callable (got {factory!r})")
    built_for = attribute("built_for")
    if built_for is not None and not isinstance(built_for, BuiltFor):
        problems.append(f"built_for must be a kvspec.conformance.harness.built_for.BuiltFor, the engine "
                        f"releases it drives (got {built_for!r})")
    if problems:
        raise AdapterError(f"adapter {spec!r} is not usable:\n  - " + "\n  - ".join(problems))
    if built_for is not None and (problem := release_problem(built_for, spec)):
        raise AdapterError(problem)
    versions = tuple(PolicyVersion(v) for v in versions)
    return Adapter(name, version, frozenset(map(Capability, capabilities)), model, frozenset(observables), spec,
                   preload, (version, *(v for v in versions if v != version)),
                   tuple((PolicyVersion(v), frozenset(map(Capability, c))) for v, c in version_capabilities.items()),
                   built_for=built_for, home=home_of(candidate),
                   chunk_release=chunk_release, null_block_counted=null_block_counted,
                   uncached_first=uncached_first, make_allocator=factories[Tier.ALLOCATOR],
                   make_engine=factories[Tier.ENGINE], make_scheduler=factories[Tier.SCHEDULER])


def home_of(candidate: Any) -> str:
    """The module that defines an adapter (a class, a module, or an instance)."""
    if isinstance(candidate, types.ModuleType):
        return candidate.__name__
    return getattr(candidate if isinstance(candidate, type) else type(candidate), "__module__", "") or ""


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
        return ENGINE_OPERATIONS + tuple(operation for operation, capability in OPTIONAL_OPERATIONS.items()
                                         if capability in capabilities)

    return replace(adapter, make_allocator=checked(adapter.make_allocator, ALLOCATOR_OPERATIONS, "allocator"),
                   make_engine=checked(adapter.make_engine, engine_operations, "engine"),
                   make_scheduler=checked(adapter.make_scheduler, SCHEDULER_OPERATIONS, "scheduler"))
