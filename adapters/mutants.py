"""Seeded bugs ("mutants"): the reference with one realistic bug each, a line or a few,
as adapters, to show that the conformance suite catches what it claims to catch.

    kvspec check --adapter kvspec.adapters.mutants:FRONTIER_INTO_WINDOW --profile ci

must exit 1 and name the mutant's clause. A mutant is an adapter like
kvspec.adapters.reference.ADAPTER with three more attributes: `clause`, the spec clause
the bug breaks; `invariant_class`, that clause's class (kvspec.spec.invariants); and
`exposed_by`, the conformance run that shows it. `MUTANTS` maps each mutant's slug to
it; its name is `mutant-<slug>`; each is also a module attribute, for `--adapter`.

A bug is seeded by a subclass of a reference class that overrides as little as
possible. Where the bug lives in a helper that reference code calls (a spec function
such as `eviction_frontier`), `with_names` copies the calling function with that one
name bound to a buggy helper: the rest of the code stays the reference's own.
"""

from dataclasses import dataclass
from types import FunctionType

from kvspec.adapters.reference import (
    ADAPTER,
    ReferenceAllocatorAdapter,
    ReferenceEngineAdapter,
)
from kvspec.reference.components import SWAComponent, free_swa_out_of_window_slots
from kvspec.reference.engine import Engine
from kvspec.reference.hybrid import HybridAllocator
from kvspec.spec.invariants import INVARIANTS
from kvspec.spec.lifecycle import release_segments
from kvspec.spec.outcomes import InvalidFree
from kvspec.spec.pages import ceil_page
from kvspec.spec.window import eviction_frontier

# -- how a bug is seeded --------------------------------------------------------------------


def with_names(function: FunctionType, **names) -> FunctionType:
    """A copy of `function` that reads `names` instead of the module-level names of the
    same spelling: a bug seeded in one helper it calls, the rest of its code unchanged."""
    unused = sorted(set(names) - set(function.__code__.co_names))
    # a name the reference stopped reading would leave the mutant equal to the reference
    assert not unused, f"{function.__qualname__} does not read {unused}; seed the bug where it lives now"
    copy = FunctionType(function.__code__, {**function.__globals__, **names}, function.__name__,
                        function.__defaults__, function.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = function.__kwdefaults__, function.__qualname__
    return copy


def engine_with_frontier(frontier) -> type[Engine]:
    """The reference engine with every window eviction (at a decode step, at a prefill
    checkpoint, before an extend without a prefix cache) decided by `frontier` in place
    of kvspec.spec.window.eviction_frontier."""
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


# -- mutants as adapters ----------------------------------------------------------------------

MUTANTS: dict[str, type["Mutant"]] = {}


@dataclass(frozen=True)
class Run:
    """One conformance run, as `kvspec check` makes it: the allocator machine at a page
    size, or the engine machine at a page size, window and decode eviction interval."""

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
    """A seeded bug as an adapter (kvspec.conformance.protocol). A subclass passes its
    slug and the engine and/or allocator class that carries the bug, sets `clause`,
    `invariant_class` and `exposed_by`, and says in its docstring what the bug is."""

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
        registered = {(invariant.clause, invariant.invariant_class) for invariant in INVARIANTS}
        assert engine or allocator, f"mutant {slug!r}: pass the engine or allocator class that carries the bug"
        assert (cls.clause, cls.invariant_class) in registered, \
            f"mutant {slug!r}: ({cls.clause!r}, {cls.invariant_class!r}) is no registered invariant and class"
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


# -- window eviction ----------------------------------------------------------------------------

frontier_rounded_up = with_names(eviction_frontier, floor_page=ceil_page)  # BUG: floor_page


class FRONTIER_INTO_WINDOW(Mutant, slug="frontier-into-window", engine=engine_with_frontier(frontier_rounded_up)):
    """Window eviction rounds the new cursor up to a page instead of down (WIN-3 step 4):
    whenever the threshold `pre_len - retention` is not on a page boundary the request
    frees one page too many, and that page holds positions of its window. Bug class 9 of
    the SGLang digest (evicting into the live window).

    A decode step shows it as I8 when `W + P - 2 > ceil_page(max(W, P))` (P = 4: W % 4 is
    0 or 3); a prefill checkpoint shows it as I8 and, for any P >= 3, as I10 (the new
    leaf keeps fewer than W live tokens). At P = 1 it is the reference; at P = 2 it frees
    at most one token more, which only the decode step itself still reads: I8's check of
    the window that step read sees it (see DECODE_FRONTIER_ONE_TOKEN_LATE)."""

    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=4, window=7, interval=1)


def frontier_one_token_late(pre_len: int, *args, **kwargs):
    return eviction_frontier(pre_len + 1, *args, **kwargs)  # BUG: pre_len, not the new seq_len


class OneTokenLateDecodeEngine(Engine):
    decode = with_names(Engine.decode, free_swa_out_of_window_slots=with_names(
        free_swa_out_of_window_slots, eviction_frontier=frontier_one_token_late))


class DECODE_FRONTIER_ONE_TOKEN_LATE(Mutant, slug="decode-frontier-one-token-late",
                                     engine=OneTokenLateDecodeEngine):
    """The decode step's window eviction computes its threshold from the new `seq_len`
    instead of `pre_len = seq_len - 1`: it frees position `C - W` (P = 1; at P > 1 when
    that crosses a page), which the step itself still reads. After the step that position
    has left the window, so only I8's check of the window the step read sees it."""

    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=1, window=3, interval=4)


def window_only_retention(version: str, window: int, page_size: int) -> int:
    return window  # BUG: sglang-0.5.23 retains ceil_page(max(window, page_size))


frontier_without_margin = with_names(eviction_frontier, retention=window_only_retention)


class MISSING_PAGE_MARGIN(Mutant, slug="missing-page-margin", engine=engine_with_frontier(frontier_without_margin)):
    """Window eviction retains `W` tokens below `pre_len` instead of `ceil_page(max(W, P))`
    (WIN-2) while sharing prefixes: the threshold `pre_len - W` of SGLang's
    `SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN`, which 0.5.23 replaced by rounding the window up
    to a page (bug class 2 of the SGLang digest). The window of the next token stays live
    (no I8), but when `1 <= W % P <= P - 2` the floored cursor leaves the leaf a checkpoint
    inserts fewer than `W` live SWA tokens: no later request can match the prefix."""

    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)


def unfloored(position: int, page_size: int) -> int:
    return position  # BUG: floor_page(position, page_size)


frontier_unaligned = with_names(eviction_frontier, floor_page=unfloored)


class UnalignedDecodeEvictionEngine(Engine):
    decode = with_names(Engine.decode, free_swa_out_of_window_slots=with_names(
        free_swa_out_of_window_slots, eviction_frontier=frontier_unaligned))


class UNALIGNED_CURSOR(Mutant, slug="unaligned-cursor", engine=UnalignedDecodeEvictionEngine):
    """The decode step's window eviction sets `swa_evicted_seqlen` to the raw threshold
    `pre_len - retention`, not floored to a page (WIN-3 step 4; SGLang's
    `if P > 1: new = floorP(new)` left out): the cursor splits a page between the dead
    and the live range, and the page-granular segment free releases the whole SWA page,
    live positions above the cursor included (I5 reports those alongside). Bug class 5
    of the SGLang digest.

    Seeded in the decode path only. The same line left out of the shared frontier also
    misaligns each prefill checkpoint, where the reference tree's own assertion ("rebuilt
    SWA value has unmapped slots") fires inside the step; a checkpoint is a shorter
    counterexample than a decode, so the shrinker ends on that crash, not on I6."""

    clause, invariant_class = "I6", "alignment"
    exposed_by = Run(page_size=2, window=5, interval=1)


# -- release ------------------------------------------------------------------------------------

def release_segments_up_to_owned(cache_protected_len: int, swa_evicted_seqlen: int, owned: int,
                                 kv_allocated_len: int, page_size: int):
    # BUG: the release ends at `owned`; the pages allocated past it are never freed
    return release_segments(cache_protected_len, swa_evicted_seqlen, owned, owned, page_size)


class LeakOnReleaseEngine(Engine):
    release = with_names(Engine.release, release_segments=release_segments_up_to_owned)


class LEAK_ON_RELEASE(Mutant, slug="leak-on-release", engine=LeakOnReleaseEngine):
    """A release frees what the request keeps, `[cache_protected_len, owned)`, and forgets
    the over-allocation `[ceil_page(owned), kv_allocated_len)` (LIFE-5), which a finish
    with a stop (`trim` tokens not kept) leaves: those pages are neither free nor held.
    SGLang 0.5.23 frees them in `_release_overallocated_kv_indices`; the mutant drops
    that step."""

    clause, invariant_class = "I2", "leak"
    exposed_by = Run(page_size=4, window=7, interval=1)


# -- the full->SWA mapping ---------------------------------------------------------------------

class StaleMappingAllocator(HybridAllocator):
    def release_swa_strict(self, full_slots, operation):
        peers = self.mapping[full_slots]
        unmapped = full_slots[peers <= 0]
        if unmapped.numel():
            raise InvalidFree(f"{operation}: full slots {unmapped.tolist()} have no live SWA peer",
                              unmapped.tolist())
        self.swa.release_pages(self.swa.held_pages_of(peers, operation))
        # BUG: the freed full pages' mapping is not reset to NO_SWA_PEER


class STALE_MAPPING(Mutant, slug="stale-mapping", allocator=StaleMappingAllocator,
                    engine=engine_with_allocator(StaleMappingAllocator)):
    """The strict SWA free (`free_swa_segment`, `free_segment`, `free_swa` at page size 1)
    returns the SWA pages but leaves the freed full slots mapped to them (MAP-2):
    released positions still name SWA slots the pool may give to another request, and a
    later free through the mapping frees that request's KV. Bug class 6 of the SGLang
    digest; 0.5.23 resets the mapping on every SWA free. Both tiers carry the bug."""

    clause, invariant_class = "I5", "mapping"
    exposed_by = Run(page_size=4)
