"""Seeded bugs ("mutants"): the reference with one realistic bug each, a line or a few,
as adapters, to show that the conformance suite catches what it claims to.

    kvspec check --adapter kvspec.adapters.mutants:FRONTIER_INTO_WINDOW --profile ci

must exit 1 and name the mutant's `clause`. Each mutant is an adapter like
kvspec.adapters.reference.ADAPTER with three more attributes: `clause`, the spec clause
it breaks; `invariant_class`, that clause's class (kvspec.spec.invariants); and
`exposed_by`, the one conformance run that shows it (the CLI's label of that run).
`MUTANTS` maps each mutant's slug to it; its name is `mutant-<slug>`.

A bug is seeded by a subclass of a reference class that overrides as little as
possible. Where the bug lives in a helper the reference calls (a spec function such as
`eviction_frontier`), `with_names` copies the calling method with that one name bound to
a buggy helper, so the rest of the code stays the reference's own.
"""

from dataclasses import dataclass
from types import FunctionType

from kvspec.adapters.reference import ADAPTER, ReferenceAllocatorAdapter, ReferenceEngineAdapter
from kvspec.reference.components import SWAComponent, free_swa_out_of_window_slots
from kvspec.reference.engine import Engine
from kvspec.reference.hybrid import HybridAllocator
from kvspec.spec.invariants import INVARIANT_CLASSES
from kvspec.spec.lifecycle import release_segments
from kvspec.spec.outcomes import InvalidFree
from kvspec.spec.pages import ceil_page
from kvspec.spec.window import eviction_frontier

# -- how a bug is seeded ------------------------------------------------------------------


def with_names(function: FunctionType, **names) -> FunctionType:
    """A copy of `function` that reads `names` instead of the module-level names of the same
    spelling: a bug seeded in one helper it calls, with the rest of its code unchanged."""
    unused = sorted(set(names) - set(function.__code__.co_names))
    # a name the reference stopped using would leave the mutant identical to the reference
    assert not unused, f"{function.__qualname__} does not read {unused}; seed the bug where it now lives"
    copy = FunctionType(function.__code__, {**function.__globals__, **names}, function.__name__,
                        function.__defaults__, function.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = function.__kwdefaults__, function.__qualname__
    return copy


def engine_with_frontier(frontier) -> type[Engine]:
    """The reference engine with every window eviction (at a decode step, at a prefill
    checkpoint, before an extend without a prefix cache) decided by `frontier`, a
    replacement for kvspec.spec.window.eviction_frontier."""
    evict = with_names(free_swa_out_of_window_slots, eviction_frontier=frontier)

    class SeededSWAComponent(SWAComponent):
        free_out_of_window_slots = with_names(SWAComponent.free_out_of_window_slots,
                                              free_swa_out_of_window_slots=evict)

    class SeededEngine(Engine):
        decode = with_names(Engine.decode, free_swa_out_of_window_slots=evict)
        prefill_chunk = with_names(Engine.prefill_chunk, free_swa_out_of_window_slots=evict)

        def __init__(self, config, device="cpu"):
            super().__init__(config, device)
            if self.tree is not None:  # the tree builds its own components; it is still empty here
                self.tree.swa = SeededSWAComponent(self.tree)
                self.tree.components = (self.tree.full, self.tree.swa)

    return SeededEngine


def engine_with_allocator(allocator_class: type[HybridAllocator]) -> type[Engine]:
    """The reference engine on a seeded hybrid allocator."""

    class SeededEngine(Engine):
        __init__ = with_names(Engine.__init__, HybridAllocator=allocator_class)

    return SeededEngine


# -- mutants as adapters --------------------------------------------------------------------

MUTANTS: dict[str, type["Mutant"]] = {}


@dataclass(frozen=True)
class Run:
    """One conformance run: the allocator machine at a page size, or the engine machine at
    a page size, window and decode eviction interval (as `kvspec check` runs them)."""

    page_size: int
    window: int | None = None
    interval: int | None = None

    @property
    def tier(self) -> str:
        return "allocator" if self.window is None else "engine"

    @property
    def label(self) -> str:
        if self.tier == "allocator":
            return f"allocator P={self.page_size}"
        return f"engine P={self.page_size} W={self.window} I={self.interval}"


class Mutant:
    """A seeded bug as an adapter (kvspec.conformance.protocol). A subclass names its slug,
    the engine and/or allocator class that carries the bug, and sets `clause`,
    `invariant_class` and `exposed_by`; its docstring says what the bug is."""

    name: str
    policy_version = ADAPTER.policy_version
    capabilities = ADAPTER.capabilities
    make_allocator = None
    make_engine = None
    clause: str
    invariant_class: str
    exposed_by: Run

    def __init_subclass__(cls, slug: str, engine: type[Engine] | None = None,
                          allocator: type[HybridAllocator] | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        assert engine or allocator, f"mutant {slug!r}: seed the bug in an engine or an allocator class"
        assert cls.invariant_class in INVARIANT_CLASSES, \
            f"mutant {slug!r}: invariant class {cls.invariant_class!r} is none of {INVARIANT_CLASSES}"
        assert cls.__doc__, f"mutant {slug!r}: say in a docstring what the bug is"
        cls.name = f"mutant-{slug}"
        if allocator is not None:
            cls.make_allocator = allocator_adapter(allocator, cls.name)
        if engine is not None:
            cls.make_engine = engine_adapter(engine, cls.name)
        MUTANTS[slug] = cls


def allocator_adapter(allocator_class: type[HybridAllocator], name: str) -> type[ReferenceAllocatorAdapter]:
    """The reference allocator adapter, building `allocator_class`."""

    class SeededAllocatorAdapter(ReferenceAllocatorAdapter):
        def __init__(self, size_full: int, size_swa: int, page_size: int, device: str = "cpu"):
            self.allocator = allocator_class(size_full, size_swa, page_size, device=device)

    SeededAllocatorAdapter.name = name
    return SeededAllocatorAdapter


def engine_adapter(engine_class: type[Engine], name: str) -> type[ReferenceEngineAdapter]:
    """The reference engine adapter, building `engine_class`."""

    class SeededEngineAdapter(ReferenceEngineAdapter):
        def __init__(self, config, device: str = "cpu"):
            self.engine = engine_class(config, device=device)

    SeededEngineAdapter.name = name
    return SeededEngineAdapter


# -- the mutants ------------------------------------------------------------------------------

# 1. Window eviction rounds the frontier up to a page instead of down.
frontier_rounded_up = with_names(eviction_frontier, floor_page=ceil_page)


class FRONTIER_INTO_WINDOW(Mutant, slug="frontier-into-window", engine=engine_with_frontier(frontier_rounded_up)):
    """Window eviction rounds the new cursor up to a page (`ceil_page`) instead of down
    (WIN-3 step 4): whenever the threshold `pre_len - retention` is not on a page boundary
    the request frees one page too many, and that page still holds positions of its window.
    Bug class 9 of the SGLang digest (evicting into the live window). Seen when
    `W + P - 2 > ceil_page(max(W, P))`: W a multiple of P > 2, or W % P == P - 1, or P > W + 1."""

    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=4, window=8, interval=128)


# 2. The frontier keeps the window only, not the page margin sglang-0.5.23 keeps.
def window_only_retention(version: str, window: int, page_size: int) -> int:
    return window  # BUG: sglang-0.5.23 keeps ceil_page(max(window, page_size))


frontier_without_margin = with_names(eviction_frontier, retention=window_only_retention)


class MISSING_PAGE_MARGIN(Mutant, slug="missing-page-margin", engine=engine_with_frontier(frontier_without_margin)):
    """Window eviction retains `W` tokens below `pre_len` instead of `ceil_page(max(W, P))`
    (WIN-2): the threshold `pre_len - W` that SGLang's `SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN`
    selected, and that 0.5.23 replaced by rounding the window up to a page (bug class 2).
    Each checkpoint still keeps the window of the next token live, but when
    `1 <= W % P <= P - 2` the floored cursor leaves the inserted leaf fewer than `W` live
    SWA tokens, so a later request cannot match the prefix it just cached."""

    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)


# 3. A release forgets the pages allocated past what the request keeps.
def release_segments_to_owned(cache_protected_len: int, swa_evicted_seqlen: int, owned: int,
                              kv_allocated_len: int, page_size: int):
    # BUG: the release ends at `owned`; the pages a stop left past it are never freed
    return release_segments(cache_protected_len, swa_evicted_seqlen, owned, owned, page_size)


class LeakOverAllocationEngine(Engine):
    release = with_names(Engine.release, release_segments=release_segments_to_owned)


class LEAK_ON_RELEASE(Mutant, slug="leak-on-release", engine=LeakOverAllocationEngine):
    """A finish with a stop (`trim` tokens not kept) frees what the request keeps but
    forgets the pages allocated past it, `[ceil_page(owned), kv_allocated_len)` (LIFE-5):
    they are neither free nor held by anyone. The over-allocation leak SGLang closed by
    freeing up to `kv_allocated_len` in `free_kv_row`, not to the committed length."""

    clause, invariant_class = "I2", "leak"
    exposed_by = Run(page_size=1, window=3, interval=4)


# 4. The strict SWA free returns the SWA pages but leaves the mapping pointing at them.
class StaleMappingAllocator(HybridAllocator):
    def release_swa_strict(self, full_slots, operation):
        peers = self.mapping[full_slots]
        unmapped = full_slots[peers <= 0]
        if unmapped.numel():
            raise InvalidFree(f"{operation}: full slots {unmapped.tolist()} have no live SWA peer",
                              unmapped.tolist())
        self.swa.release_pages(self.swa.held_pages_of(peers, operation))
        # BUG: the freed pages' mapping entries are not reset to NO_SWA_PEER


class STALE_MAPPING(Mutant, slug="stale-mapping", allocator=StaleMappingAllocator,
                    engine=engine_with_allocator(StaleMappingAllocator)):
    """The strict SWA free (`free_swa_segment`, `free_segment`, and `free_swa` at page
    size 1) returns the SWA pages but does not reset the freed full slots' mapping to
    `NO_SWA_PEER` (MAP-2): released positions still name SWA slots the pool may hand to
    another request. Bug class 6 of the SGLang digest; 0.5.23 clears the mapping on every
    SWA free (and guards `free_full` against live peers)."""

    clause, invariant_class = "I5", "mapping"
    exposed_by = Run(page_size=4)


# 5. The cursor is set to the raw threshold, not floored to a page.
def unrounded(position: int, page_size: int) -> int:
    return position  # BUG: floor_page(position, page_size)


frontier_unaligned = with_names(eviction_frontier, floor_page=unrounded)


class UNALIGNED_CURSOR(Mutant, slug="unaligned-cursor", engine=engine_with_frontier(frontier_unaligned)):
    """Window eviction sets `swa_evicted_seqlen` to the raw threshold `pre_len - retention`
    without flooring it to a page (WIN-3 step 4; SGLang's `if P > 1: new = floorP(new)`
    left out): the segment free then releases the whole SWA page holding the cursor,
    positions above it included, and the cursor splits a page between the dead and the
    live range. Bug class 5 of the SGLang digest."""

    clause, invariant_class = "I6", "alignment"
    exposed_by = Run(page_size=4, window=8, interval=128)
