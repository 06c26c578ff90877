"""Request release bugs (LIFE-5): what a finished, aborted or retracted request gives back."""

from kvspec.conformance.harness.declarations import CRASH, Run
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.lifecycle import release_segments

from .seeding import Mutant, with_names


def release_segments_up_to_owned(cache_protected_len: int, swa_evicted_seqlen: int, owned: int,
                                 kv_allocated_len: int, page_size: int):
    # BUG: the release ends at `owned`; the pages allocated past it are never freed
    return release_segments(cache_protected_len, swa_evicted_seqlen, owned, owned, page_size)


class LeakOnReleaseEngine(TwoPoolEngine):
    release = with_names(TwoPoolEngine.release, release_segments=release_segments_up_to_owned)


class LEAK_ON_RELEASE(Mutant, slug="leak-on-release", engine=LeakOnReleaseEngine):
    """A release frees what the request keeps, `[cache_protected_len, owned)`, and forgets
    the over-allocation `[ceil_page(owned), kv_allocated_len)` (LIFE-5), which a finish
    with a stop (`trim` tokens not kept) leaves: those pages are neither free nor held.
    SGLang 0.5.23 frees them in `_release_overallocated_kv_indices`; the mutant drops
    that step."""

    clause, invariant_class = "I2", "leak"
    exposed_by = Run(page_size=4, window=7, interval=1)
    reverts = ("SGLang 0.5.23's release of the over-allocation, _release_overallocated_kv_indices "
               "(mem_cache/common.py:447-476; docs/engines/sglang.md §3.6 step 4)")


def release_segments_live_from_protected(cache_protected_len: int, swa_evicted_seqlen: int, owned: int,
                                         kv_allocated_len: int, page_size: int):
    # BUG: SWA taken as live from cache_protected_len: the cursor's dead range is freed as full + SWA
    return release_segments(cache_protected_len, cache_protected_len, owned, kv_allocated_len, page_size)


class DeadRangeAsFullEngine(TwoPoolEngine):
    release = with_names(TwoPoolEngine.release, release_segments=release_segments_live_from_protected)


class RELEASE_DEAD_RANGE_AS_FULL(Mutant, slug="release-dead-range-as-full", engine=DeadRangeAsFullEngine):
    """A release frees the SWA-dead range [cache_protected_len, cursor) with free_segment
    (full + SWA) instead of free_full_segment (LIFE-5). Its SWA peers are already released
    (mapping 0), so the allocator's strict SWA free refuses the call (ALLOC-6): the step
    crashes with InvalidFree ("free_segment: full slots [...] have no live SWA peer")
    before any invariant is checked, hence CRASH. SGLang 0.5.23's free_swa_segment fails
    its _SWA_PEER_MAPPED expect the same way, and with its checks off frees the padding
    page 0 (bug class 4, I1: see the SGLang twin of this mutant). A lenient set-shaped free
    at page size > 1 would skip the unmapped peers: equivalent to the reference."""

    clause, invariant_class = "ALLOC-6", CRASH
    crash_message = "InvalidFree"
    exposed_by = Run(page_size=4, window=7, interval=1)
    reverts = ("docs/engines/sglang.md §3.6: free_kv_row frees [cache_protected_len, cursor) full-only "
               "(free_full_segment) and only [cursor, owned) full + SWA")
