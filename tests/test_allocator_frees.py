"""An allocator without free_full or the segment frees (capabilities full_frees,
segment_frees; SGLang before 0.5.19 and 0.5.20) is driven with the frees it has: a released
range is freed with `free`, every free is set-shaped. Those calls are then checked as any
other, so a `free` that mishandles a released range is caught."""

import pytest
from hypothesis import seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.reference import ReferenceAllocatorAdapter
from kvspec.conformance.harness.allocator_machine import ALL, allocator_machine
from kvspec.conformance.harness.declarations import Capability
from kvspec.reference.hybrid import HybridAllocator

SETTINGS = settings(max_examples=200, stateful_step_count=30, deadline=None, database=None, derandomize=False)
WITHOUT = ALL - {Capability.FULL_FREES, Capability.SEGMENT_FREES}
SEGMENT_AND_FULL = {"free_full", "free_segment", "free_swa_segment", "free_full_segment"}


def adapter(allocator_class, calls: set):
    class Recording(ReferenceAllocatorAdapter):
        def __init__(self, size_full, size_swa, page_size):
            self.allocator = allocator_class(size_full, size_swa, page_size)

        def __getattribute__(self, name):
            calls.add(name)
            return super().__getattribute__(name)

    return Recording


def run(allocator_class, capabilities, page_size=4) -> set:
    calls = set()
    machine = allocator_machine(adapter(allocator_class, calls), page_size, capabilities)
    machine.TestCase.settings = SETTINGS
    run_state_machine_as_test(seed(7)(machine), settings=SETTINGS)
    return calls


@pytest.mark.parametrize("page_size", [1, 4])
def test_without_them_only_the_set_shaped_frees_are_called_and_the_reference_passes(page_size):
    calls = run(HybridAllocator, WITHOUT, page_size)
    assert {"free", "free_swa"} <= calls and not calls & SEGMENT_AND_FULL
    assert SEGMENT_AND_FULL <= run(HybridAllocator, ALL, page_size)  # the control: with them, they are called


class FreeFreesOnlyMapped(HybridAllocator):
    """A `free` that frees only the full slots still mapped to an SWA peer: a released
    range (what free_full frees elsewhere) is never returned to the pool."""

    def free(self, full_slots):
        full_slots = self.as_slots(full_slots)
        super().free(full_slots[self.mapping[full_slots] > 0])


def test_a_free_that_leaks_released_ranges_is_caught_where_it_replaces_free_full():
    with pytest.raises(AssertionError, match=r"\[I2\]"):
        run(FreeFreesOnlyMapped, WITHOUT - {Capability.REFUSES_MISUSE})
