"""The adapter protocol: how kvspec finds and drives an implementation.

An adapter is any object (a module, a class, an instance) with these attributes:

    name                 a short name for reports
    policy_version       the spec policy version it implements (kvspec.spec.window)
    capabilities         a collection of CAPABILITIES it has; rules that need one it
                         lacks do not run, and the report says so
    observables          optional: which of kvspec.conformance.checks.OBSERVABLES its
                         snapshots fill in (default: the two-pool model's,
                         TWO_POOL_OBSERVABLES); checks that read one it
                         lacks are reported as skipped, never as passed
    make_allocator       (size_full, size_swa, page_size) -> allocator    allocator tier
    make_engine          (EngineConfig) -> engine                         engine tier
    preload              optional: modules to import once in the forkserver (slow imports)

At least one tier. An allocator offers ALLOCATOR_OPERATIONS (kvspec.spec.allocator's
HybridAllocatorOperations, plus `state()` and `available_sizes()`); an engine offers
ENGINE_OPERATIONS (chapter 06 of the spec, plus `snapshot()`). Operations return plain
data, an allocation either its slots or kvspec.spec.outcomes.OutOfMemory, and raise
kvspec.spec.outcomes errors on misuse.

`load_adapter(spec)` takes `reference` (and other built-in names: `mutant-<name>` for
each seeded bug of kvspec.adapters.mutants, `sglang-mutant-<name>` for each bug patched
into real SGLang by kvspec.adapters.sglang.mutants, `vllm-mutant-<name>` for each bug
patched into real vLLM by kvspec.adapters.vllm.mutants), a name registered by a package under the
entry-point group `kvspec.adapters`, or `module:attribute`, and
validates what it finds, with errors that say what is missing and how to fix it.
"""

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from typing import Any

from kvspec.spec.window import POLICY_VERSIONS

from .checks import OBSERVABLES, TWO_POOL_OBSERVABLES

BUILT_IN = {"reference": "kvspec.adapters.reference:ADAPTER", "sglang": "kvspec.adapters.sglang:SGLANG",
            "sglang-python": "kvspec.adapters.sglang:SGLANG_PYTHON", "vllm": "kvspec.adapters.vllm:VLLM",
            "vllm-dense": "kvspec.adapters.vllm:VLLM_DENSE"}
ENTRY_POINT_GROUP = "kvspec.adapters"

CAPABILITIES = ("page_size_1", "page_size_gt_1", "swa_tail", "prefix_sharing", "free_groups",
                "chunked_prefill", "pd_decode", "refuses_misuse", "atomic_alloc_decode")
"""refuses_misuse: an invalid free raises InvalidFree and changes nothing (ALLOC-6);
atomic_alloc_decode: a failed alloc_decode changes nothing (ALLOC-4). Without them the
allocator machine does not try the misuse, and calls alloc_decode only with room."""
ALLOCATOR_OPERATIONS = ("state", "available_sizes", "alloc", "alloc_extend", "alloc_decode",
                        "alloc_extend_swa_tail", "free", "free_swa", "free_full", "free_segment",
                        "free_swa_segment", "free_full_segment", "free_group_begin", "free_group_end",
                        "translate", "clear")
ENGINE_OPERATIONS = ("snapshot", "admit", "pd_admit", "prefill_chunk", "decode", "finish", "abort",
                     "retract", "evict")


class AdapterError(Exception):
    """An adapter that cannot be loaded or does not offer what it must (exit status 2)."""


@dataclass(frozen=True)
class Adapter:
    """A validated adapter."""

    name: str
    policy_version: str
    capabilities: frozenset[str]
    make_allocator: Callable | None
    make_engine: Callable | None
    observables: frozenset[str] = frozenset(TWO_POOL_OBSERVABLES)
    spec: str = ""
    """What it was loaded by: a worker process loads it again by this."""
    preload: tuple[str, ...] = ()
    """Modules worker processes import before forking (the implementation's slow imports)."""


def resolve(spec: str) -> Any:
    """The object an adapter spec names."""
    if spec.startswith("mutant-"):
        from kvspec.adapters.mutants import MUTANTS

        if spec.removeprefix("mutant-") not in MUTANTS:
            raise AdapterError(f"unknown mutant {spec!r}; the seeded bugs are "
                               + ", ".join(f"mutant-{name}" for name in MUTANTS))
        return MUTANTS[spec.removeprefix("mutant-")]
    if spec.startswith("sglang-mutant-"):
        from kvspec.adapters.sglang.mutants import MUTANTS as SGLANG_MUTANTS
        from kvspec.adapters.sglang.mutants import NOT_PATCHED

        slug = spec.removeprefix("sglang-mutant-")
        if slug not in SGLANG_MUTANTS:
            why = f" ({slug} has no SGLang patch: {NOT_PATCHED[slug]})" if slug in NOT_PATCHED else ""
            raise AdapterError(f"unknown SGLang mutant {spec!r}{why}; the bugs patched into SGLang are "
                               + ", ".join(f"sglang-mutant-{name}" for name in SGLANG_MUTANTS))
        return SGLANG_MUTANTS[slug]
    if spec.startswith("vllm-mutant-"):
        from kvspec.adapters.vllm.mutants import MUTANTS as VLLM_MUTANTS

        slug = spec.removeprefix("vllm-mutant-")
        if slug not in VLLM_MUTANTS:
            raise AdapterError(f"unknown vLLM mutant {spec!r}; the bugs patched into vLLM are "
                               + ", ".join(f"vllm-mutant-{name}" for name in VLLM_MUTANTS))
        return VLLM_MUTANTS[slug]
    target = BUILT_IN.get(spec)
    if target is None:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if found:
            return found[0].load()
        target = spec
    if ":" not in target:
        from kvspec.adapters.mutants import MUTANTS
        from kvspec.adapters.sglang.mutants import MUTANTS as SGLANG_MUTANTS
        from kvspec.adapters.vllm.mutants import MUTANTS as VLLM_MUTANTS

        known = sorted(set(BUILT_IN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
        raise AdapterError(f"unknown adapter {spec!r}; use one of {', '.join(known)}, a seeded bug "
                           f"({', '.join(f'mutant-{name}' for name in MUTANTS)}), a bug patched into SGLang "
                           f"({', '.join(f'sglang-mutant-{name}' for name in SGLANG_MUTANTS)}), a bug patched "
                           f"into vLLM ({', '.join(f'vllm-mutant-{name}' for name in VLLM_MUTANTS)}), "
                           f"or module:attribute for your own")
    module_name, _, attribute = target.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # like `python -m`: an adapter beside you is found
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise AdapterError(f"adapter {spec!r}: cannot import module {module_name!r} ({error}); "
                           f"is it installed, or on PYTHONPATH?") from error
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
    if version not in POLICY_VERSIONS:
        problems.append(f"policy_version must be one of {', '.join(POLICY_VERSIONS)} (got {version!r})")
    capabilities = frozenset(getattr(candidate, "capabilities", ()))
    unknown = sorted(capabilities - set(CAPABILITIES))
    if unknown:
        problems.append(f"unknown capabilities {unknown}; known: {', '.join(CAPABILITIES)}")
    observables = frozenset(getattr(candidate, "observables", TWO_POOL_OBSERVABLES))
    if unknown := sorted(observables - set(OBSERVABLES)):
        problems.append(f"unknown observables {unknown}; known: {', '.join(OBSERVABLES)}")
    make_allocator = getattr(candidate, "make_allocator", None)
    make_engine = getattr(candidate, "make_engine", None)
    if make_allocator is None and make_engine is None:
        problems.append("offers no tier: define make_allocator(size_full, size_swa, page_size) "
                        "and/or make_engine(config)")
    for factory, label in ((make_allocator, "make_allocator"), (make_engine, "make_engine")):
        if factory is not None and not callable(factory):
            problems.append(f"{label} must be callable")
    if problems:
        raise AdapterError(f"adapter {spec!r} is not usable:\n  - " + "\n  - ".join(problems))
    preload = getattr(candidate, "preload", ())
    preload = (preload,) if isinstance(preload, str) else tuple(preload)
    return Adapter(name, version, capabilities, make_allocator, make_engine, observables, spec, preload)


def missing_operations(instance: Any, operations: tuple[str, ...]) -> list[str]:
    return [operation for operation in operations if not callable(getattr(instance, operation, None))]


def check_instance(instance: Any, operations: tuple[str, ...], tier: str, adapter: str) -> Any:
    """An allocator or engine an adapter built must offer every operation of its tier."""
    missing = missing_operations(instance, operations)
    if missing:
        raise AdapterError(f"adapter {adapter!r}: its {tier} lacks {', '.join(missing)}; "
                           f"implement them (see kvspec.conformance.protocol)")
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
            return check_instance(instance, operations, tier, spec)

        return build

    return replace(adapter, make_allocator=checked(adapter.make_allocator, ALLOCATOR_OPERATIONS, "allocator"),
                   make_engine=checked(adapter.make_engine, ENGINE_OPERATIONS, "engine"))
