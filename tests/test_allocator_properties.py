"""Random operation sequences against the reference allocator at page sizes 1, 2, 4 and
16, every allocator invariant (I1-I6, ALLOC-*) checked after every step."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.reference import ReferenceAllocatorAdapter
from kvspec.conformance.allocator_machine import allocator_machine
from kvspec.conformance.profiles import profile


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
def test_reference_allocator_holds_every_invariant(page_size):
    machine = allocator_machine(ReferenceAllocatorAdapter, page_size)
    run_state_machine_as_test(machine, settings=settings(profile("ci"), database=None))
    # the run really explored: many examples, many checked steps
    assert machine.examples >= profile("ci").max_examples
    assert machine.steps > 10 * machine.examples
    print(f"page_size {page_size}: {machine.examples} examples, {machine.steps} checked steps")
