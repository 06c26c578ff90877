"""Hybrid allocator bugs (ALLOC, MAP): the two pools and the full->SWA mapping."""

from kvspec.reference.hybrid import HybridAllocator
from kvspec.spec.outcomes import InvalidFree

from .seeding import Mutant, Run, engine_with_allocator


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
