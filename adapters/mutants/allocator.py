"""Hybrid allocator bugs (ALLOC, MAP): the two pools and the full->SWA mapping."""

import torch

from kvspec.conformance.harness.declarations import CRASH, Run
from kvspec.reference.hybrid import HybridAllocator
from kvspec.reference.pool import Slots
from kvspec.spec.allocator import swa_tail_split, swa_tail_starts_on_page
from kvspec.spec.notation import NO_SWA_PEER
from kvspec.spec.outcomes import InvalidAllocation, InvalidFree, OutOfMemory

from .seeding import Mutant, engine_with_allocator, with_names


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
    later free through the mapping frees that request's KV. docs/engines/sglang.md,
    bug class 6; 0.5.23 resets the mapping on every SWA free. Both tiers carry the bug."""

    clause, invariant_class = "I5", "mapping"
    exposed_by = Run(page_size=4)
    reverts = ("docs/engines/sglang.md, bug class 6: clear_full_to_swa_mapping in every SWA free path "
               "(allocator/swa.py:514, 577)")


class SwaTailFullPageCountAllocator(HybridAllocator):
    def alloc_extend_swa_tail(self, prefix_len: int, seq_len: int, last_loc: int,
                              swa_tail_len: int) -> Slots | OutOfMemory:
        if not 0 <= swa_tail_len <= seq_len - prefix_len:
            raise InvalidAllocation(f"alloc_extend_swa_tail: need 0 <= swa_tail_len <= seq_len - prefix_len "
                                    f"(got tail {swa_tail_len}, prefix {prefix_len}, seq {seq_len})")
        if not swa_tail_starts_on_page(seq_len, swa_tail_len, self.page_size):
            raise InvalidAllocation(f"alloc_extend_swa_tail: the SWA tail must start on a page boundary, "
                                    f"but seq_len - swa_tail_len = {seq_len - swa_tail_len} is not a multiple of "
                                    f"page_size {self.page_size}; round the tail up to reach one")
        split = swa_tail_split(prefix_len, seq_len, swa_tail_len, self.page_size)
        full_plans = self.full.plan_extend([prefix_len], [seq_len], [last_loc])
        swa_plans = self.swa.plan_extend([0], [swa_tail_len], [-1])
        shortfall = self.capacity_shortfall(split.full_pages, split.swa_pages)
        if shortfall:
            return shortfall
        full_slots = self.full.place_extend(full_plans, [last_loc], self.full.take_pages(split.full_pages))
        # BUG: the SWA sub-allocator is given the full page count, split.full_pages, not split.swa_pages
        swa_slots = self.swa.place_extend(swa_plans, [-1], self.swa.take_pages(split.full_pages))
        self.mapping[full_slots[:split.head_len]] = NO_SWA_PEER
        self.set_mapping(full_slots[split.head_len:], swa_slots)
        return full_slots


class TAIL_FULL_PAGE_COUNT(Mutant, slug="tail-full-page-count", allocator=SwaTailFullPageCountAllocator):
    """The PD-decode SWA-tail pre-allocation (ALLOC-3) checks each pool for its own page
    count but takes the full page count from the SWA pool, which lays the tail on the
    first `swa_pages` of them: the other `full_pages - swa_pages` SWA pages are neither
    free nor held by anyone (I3), whenever the tail is shorter than the extend by a page
    or more. (Where the SWA pool has the tail's pages but not the extend's, the SWA side
    comes back empty-handed instead and the reference crashes; at seed 0 the leak comes
    first.)"""

    clause, invariant_class = "I3", "leak"
    crash_message = "OutOfMemory"  # the same bug, where the SWA pool is short: see the docstring
    exposed_by = Run(page_size=4)
    reverts = ("docs/engines/sglang.md, bug class 7: design doc change 2 made alloc_extend_swa_tail pass "
               "num_new_pages=num_swa_pages to the SWA sub-allocator (section 2.4)")


class MappingResetFirstAllocator(HybridAllocator):
    def free_swa(self, full_slots: Slots) -> None:
        full_slots = self.as_slots(full_slots)
        full_pages = self.full.held_pages_of(full_slots, "free_swa")
        if self.page_size == 1:
            self.release_swa_strict(full_slots, "free_swa")
            return
        expanded = self.full.page_slots(full_pages)
        self.mapping[expanded] = NO_SWA_PEER  # BUG: reset before the SWA peers are read from it
        peers = self.mapping[expanded]
        self.swa.release_pages(torch.unique(peers[peers > 0] // self.page_size))


class FULL_FREED_BEFORE_SWA(Mutant, slug="full-freed-before-swa", allocator=MappingResetFirstAllocator):
    """The set-shaped free (`free`, and `free_swa` at page size > 1; MAP-2, ALLOC-6) does
    the full side's bookkeeping first: it resets the freed full pages' mapping to 0 (a
    free full slot has no SWA peer), then reads their SWA peers from it. It finds none
    and, lenient as SGLang's, skips them: the SWA pages are neither freed nor held (I3).

    The literal reorder is not observable in the reference: in `free_segment` the full
    pool's free leaves the mapping alone, so the SWA free after it reads the same peers
    (equivalent); in `free` the SWA free after it refuses slots on pages already free
    (InvalidFree, a crash); `free_full` first refuses live peers (its MAP-2 guard)."""

    clause, invariant_class = "I3", "leak"
    exposed_by = Run(page_size=4)
    reverts = ("docs/engines/sglang.md, bug class 6: SGLang's free releases SWA first, \"it reads the "
               "mapping\" (allocator/swa.py:467-475), and 0.5.23 guards free_full against live peers (swa.py:615-619)")


class NonAtomicDecodeAllocator(HybridAllocator):
    def alloc_decode(self, seq_lens, last_loc) -> Slots | OutOfMemory:
        for seq in seq_lens:
            if seq < 1:
                raise InvalidAllocation(f"a decode step grows a request to seq_len >= 1 (got {seq})")
        swa_last = self.swa_last_loc(last_loc)
        # BUG: each pool allocates on its own, as SGLang 0.5.23's: the full pages stay taken when the SWA pool is short
        full_slots = self.full.allocate(self.full.plan_decode(seq_lens, last_loc), last_loc)
        swa_slots = self.swa.allocate(self.swa.plan_decode(seq_lens, swa_last), swa_last)
        for slots in (full_slots, swa_slots):
            if isinstance(slots, OutOfMemory):
                return slots
        self.set_mapping(full_slots, swa_slots)
        return full_slots


class NON_ATOMIC_DECODE(Mutant, slug="non-atomic-decode", allocator=NonAtomicDecodeAllocator):
    """`alloc_decode` (ALLOC-4) runs the full and then the SWA sub-allocator and returns
    OutOfMemory if either fails, without giving back what the other took: a decode step
    that needs a new page while one pool has none keeps the other pool's page, which no
    sequence holds. At the allocator tier I15 is stated as ALLOC-4: a failed allocation
    changed the allocator. (SGLang 0.5.23's alloc_decode is written this way, bug class 8;
    its scheduler checks both pools first, as the reference engine does, so the engine
    tier never calls it without room.)"""

    clause, invariant_class = "I15", "atomicity"
    exposed_by = Run(page_size=2)


def full_pages_available(num_full_pages: int, num_swa_pages: int, full_free_pages: int, swa_free_pages: int) -> bool:
    return num_full_pages <= full_free_pages  # BUG: the SWA pool is never asked


class OnePoolCapacityAllocator(HybridAllocator):
    capacity_shortfall = with_names(HybridAllocator.capacity_shortfall, new_pages_available=full_pages_available)


class ONE_POOL_AVAILABLE(Mutant, slug="one-pool-available", allocator=OnePoolCapacityAllocator):
    """The capacity check (ALLOC-2, `new_pages_available`) asks the full pool only. When
    the SWA pool is short the allocation goes ahead and the SWA sub-allocator fails
    half-way: the allocator crashes (in the reference, TypeError: 'OutOfMemory' object is
    not subscriptable, in PoolAllocator.place_extend; SGLang asserts that both
    sub-allocations succeeded). No invariant sees it first, so it is caught as a crash
    (CRASH). The engine's own eviction before an extend (make_room) asking about one pool
    would never be seen: an OutOfMemory while the prefix cache could have freed SWA KV
    breaks no invariant."""

    clause, invariant_class = "ALLOC-2", CRASH
    crash_message = "OutOfMemory"
    exposed_by = Run(page_size=4)
    reverts = "SGLang's new_pages_available asks both sub-allocators (docs/engines/sglang.md §2.3)"


class GroupEndMappingAllocator(HybridAllocator):
    queued: list[Slots] | None = None

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self.queued = []

    def release_swa_strict(self, full_slots: Slots, operation: str) -> None:
        if self.queued is None:
            return super().release_swa_strict(full_slots, operation)
        self.queued.append(full_slots)  # BUG: the SWA peers are read at free_group_end

    def free_swa(self, full_slots: Slots) -> None:
        if self.queued is None:
            return super().free_swa(full_slots)
        self.queued.append(self.as_slots(full_slots))  # BUG: likewise

    def check_no_live_peer(self, full_slots: Slots, operation: str) -> None:
        if self.queued:  # their peers are queued for release, as SGLang 0.5.18 saw it
            full_slots = full_slots[~torch.isin(full_slots, torch.cat(self.queued))]
        super().check_no_live_peer(full_slots, operation)

    def move_swa_peers(self, from_full: Slots, to_full: Slots) -> None:
        peers = self.mapping[from_full]  # to_full's old peers may still be queued: overwritten, as SGLang did
        self.mapping[from_full] = NO_SWA_PEER
        self.set_mapping(to_full, peers)

    def free_group_end(self) -> None:
        queued, self.queued = self.queued or [], None
        for full_slots in queued:
            pages = self.full.page_slots(torch.unique(full_slots // self.page_size))
            peers = self.mapping[pages]  # whatever peers a cache action inside the group installed
            self.mapping[pages] = NO_SWA_PEER
            swa_pages = torch.unique(peers[peers > 0] // self.page_size)
            self.swa.release_pages(swa_pages[~(self.swa.page_is_free[swa_pages] | self.swa.page_is_pending[swa_pages])])
        super().free_group_end()


class GROUP_END_MAPPING(Mutant, slug="group-end-mapping", engine=engine_with_allocator(GroupEndMappingAllocator)):
    """An SWA free inside a free group queues the full slots and reads their SWA peers from
    the mapping only at free_group_end (I16's rule: resolve the mapping when the free is
    queued). A cache action later in the same group that gives one of those full slots a new
    SWA peer then has that peer freed: a prefill batch (LIFE-9) whose second request's
    checkpoint revives, onto its own SWA, a tombstone the first one's window release made
    over locked full KV, has that SWA freed under the live node: here the revived node's
    full slots then map to nothing (I5), and SGLang 0.5.18, which shipped the bug, leaves
    the tree holding a free SWA page (I4; docs/engines/sglang-findings.md,
    grouped-swa-free-remap)."""

    clause, invariant_class = "I5", "mapping"
    exposed_by = Run(page_size=4, window=8, interval=1)
    reverts = ("docs/engines/sglang-findings.md, grouped-swa-free-remap: SGLang 0.5.19 resolves and clears the "
               "mapping when a grouped free_swa is queued (mem_cache/allocator/swa.py:367-375)")
