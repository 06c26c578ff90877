"""How a bug is seeded into the reference, and a seeded bug as an adapter (`Mutant`).

A bug is seeded by a subclass of a reference class that overrides as little as
possible. Where the bug lives in a helper that reference code calls (a spec function
such as `eviction_frontier`), `with_names` copies the calling function with that one
name bound to a buggy helper: the rest of the code stays the reference's own.
"""

from types import FunctionType

from kvspec.adapters.reference import (
    ADAPTER,
    ReferenceAllocatorAdapter,
    ReferenceEngineAdapter,
)
from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.harness.families import MalformedDeclaration, check_declaration
from kvspec.reference.components import SWAComponent, free_swa_out_of_window_slots
from kvspec.reference.engine import TwoPoolEngine
from kvspec.reference.hybrid import HybridAllocator
from kvspec.spec.window import TWO_POOL_VERSIONS

# -- how a bug is seeded --------------------------------------------------------------------


def with_names(function: FunctionType, **names) -> FunctionType:
    """A copy of `function` that reads `names` instead of the module-level names of the
    same spelling: a bug seeded in one helper it calls, the rest of its code unchanged."""
    unused = sorted(set(names) - set(function.__code__.co_names))
    # a name the reference stopped reading would leave the mutant equal to the reference
    if unused:
        raise MalformedDeclaration(f"{function.__qualname__} does not read {unused}; seed the bug where it lives now")
    copy = FunctionType(function.__code__, {**function.__globals__, **names}, function.__name__,
                        function.__defaults__, function.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = function.__kwdefaults__, function.__qualname__
    return copy


def engine_with_decode_frontier(frontier) -> type[TwoPoolEngine]:
    """The reference engine with the decode step's window eviction (only) decided by
    `frontier` in place of kvspec.spec.window.eviction_frontier."""

    class SeededEngine(TwoPoolEngine):
        decode = with_names(TwoPoolEngine.decode, free_swa_out_of_window_slots=with_names(
            free_swa_out_of_window_slots, eviction_frontier=frontier))

    return SeededEngine


def engine_with_frontier(frontier) -> type[TwoPoolEngine]:
    """The reference engine with every window eviction (at a decode step, at a prefill
    checkpoint, before an extend without a prefix cache) decided by `frontier` in place
    of kvspec.spec.window.eviction_frontier."""
    evict = with_names(free_swa_out_of_window_slots, eviction_frontier=frontier)

    class SeededSWAComponent(SWAComponent):
        free_out_of_window_slots = with_names(SWAComponent.free_out_of_window_slots,
                                              free_swa_out_of_window_slots=evict)

    class SeededEngine(engine_with_swa_component(SeededSWAComponent)):
        decode = with_names(TwoPoolEngine.decode, free_swa_out_of_window_slots=evict)
        prefill = with_names(TwoPoolEngine.prefill, free_swa_out_of_window_slots=evict)

    return SeededEngine


def engine_with_swa_component(component_class: type[SWAComponent]) -> type[TwoPoolEngine]:
    """The reference engine whose prefix tree keeps its SWA KV with a seeded component."""

    class SeededEngine(TwoPoolEngine):
        def __init__(self, config, device="cpu"):
            super().__init__(config, device)
            if self.tree is not None:  # the tree builds its own components; it is still empty here
                self.tree.swa = component_class(self.tree)
                self.tree.components = (self.tree.full, self.tree.swa, *[self.tree.state] * bool(self.tree.state))

    return SeededEngine


def engine_with_allocator(allocator_class: type[HybridAllocator]) -> type[TwoPoolEngine]:
    """The reference engine on a seeded hybrid allocator."""

    class SeededEngine(TwoPoolEngine):
        __init__ = with_names(TwoPoolEngine.__init__, HybridAllocator=allocator_class)

    return SeededEngine


# -- mutants as adapters ----------------------------------------------------------------------

MUTANTS: dict[str, type["Mutant"]] = {}


class Mutant:
    """A seeded bug as an adapter (kvspec.conformance.harness.protocol). A subclass passes its
    slug and the engine and/or allocator class that carries the bug, sets `clause`,
    `invariant_class` and `exposed_by` (and `reverts` where the bug undoes a known SGLang
    fix), and says in its docstring what the bug is."""

    name: str
    policy_version = ADAPTER.policy_version
    policy_versions = TWO_POOL_VERSIONS  # a bug of the two-pool engine (block_pool.py: the shared pool's)
    capabilities = ADAPTER.capabilities
    make_allocator = None
    make_engine = None
    make_scheduler = None
    clause: str
    invariant_class: str
    exposed_by: Run
    reverts: str = ""
    """The upstream SGLang change the bug undoes, where one is known (a bug class of
    docs/engines/sglang.md section 7, a flag, a commit)."""
    crash_message: str = ""
    """For invariant_class CRASH: the text the crash must show. For another class: the text
    of a crash that is the same bug's other manifestation (where a pool is short, say, the
    step fails before any invariant looks), which also counts as caught; empty if none."""
    also: tuple[str, ...] = ()
    """Other clauses the same bug breaks first on some searches of its run (its docstring
    says how each follows from the bug): a failure of one of them also counts as caught for
    its clause. The zoo still requires the class of `clause`."""

    def __init_subclass__(cls, slug: str, engine: type[TwoPoolEngine] | None = None,
                          allocator: type[HybridAllocator] | None = None, scheduler: type | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if not (engine or allocator or scheduler):
            raise MalformedDeclaration(f"mutant {slug!r}: pass the engine, allocator or scheduler class that carries "
                                       f"the bug")
        check_declaration(cls, slug)
        cls.name = f"mutant-{slug}"
        if allocator is not None:
            cls.make_allocator = allocator_adapter(allocator, cls.name)
        if engine is not None:
            cls.make_engine = engine_adapter(engine, cls.name)
        if scheduler is not None:  # the reference scheduler's operations take and return plain data already
            cls.make_scheduler = scheduler
        MUTANTS[slug] = cls


def allocator_adapter(allocator_class: type[HybridAllocator], name: str) -> type[ReferenceAllocatorAdapter]:
    """The reference allocator adapter, building `allocator_class`."""

    class SeededAllocatorAdapter(ReferenceAllocatorAdapter):
        def __init__(self, size_full: int, size_swa: int, page_size: int, device: str = "cpu"):
            self.allocator = allocator_class(size_full, size_swa, page_size, device=device)

    SeededAllocatorAdapter.name = name
    return SeededAllocatorAdapter


def engine_adapter(engine_class: type[TwoPoolEngine], name: str) -> type[ReferenceEngineAdapter]:
    """The reference engine adapter, building `engine_class`."""

    class SeededEngineAdapter(ReferenceEngineAdapter):
        def __init__(self, config, device: str = "cpu"):
            self.engine = engine_class(config, device=device)

    SeededEngineAdapter.name = name
    return SeededEngineAdapter


