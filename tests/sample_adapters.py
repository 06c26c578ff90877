"""Adapters for the CLI tests, loaded by `module:attribute` as a third party's would be."""

from kvspec.adapters.reference import ReferenceAllocatorAdapter
from kvspec.reference.hybrid import HybridAllocator


class LeakyHybridAllocator(HybridAllocator):
    """A realistic bug: the segment free forgets the last page of a multi-page segment."""

    def free_segment(self, full_slots, start_pos):
        full_slots = self.as_slots(full_slots)
        if full_slots.numel() > self.page_size:
            full_slots = full_slots[:-1]
        super().free_segment(full_slots, start_pos)


class LeakyAllocatorAdapter(ReferenceAllocatorAdapter):
    def __init__(self, size_full, size_swa, page_size):
        self.allocator = LeakyHybridAllocator(size_full, size_swa, page_size)


class LEAKY:
    name = "leaky"
    policy_version = "sglang-0.5.23"
    capabilities = ("page_size_1", "page_size_gt_1")
    make_allocator = LeakyAllocatorAdapter


class IncompleteAllocator:
    def __init__(self, size_full, size_swa, page_size):
        pass

    def state(self):
        raise AssertionError("never called: the adapter is refused before")


class INCOMPLETE:
    name = "incomplete"
    policy_version = "sglang-0.5.23"
    capabilities = ()
    make_allocator = IncompleteAllocator
