"""Helpers shared by the reference allocator tests."""

import pytest

from kvspec.reference import HybridAllocator
from kvspec.spec.accounting import HeldSequence
from kvspec.spec.invariants.allocator import allocator_violations
from kvspec.spec.outcomes import KvSpecError, OutOfMemory

PAGE_SIZES = [1, 4]

# -- helpers -------------------------------------------------------------------------------

def hybrid(page_size: int, full_pages: int = 8, swa_pages: int = 8, device: str = "cpu") -> HybridAllocator:
    return HybridAllocator(full_pages * page_size, swa_pages * page_size, page_size, device=device)


def held(row: list[int], swa_live_from: int = 0, first: int = 0) -> HeldSequence:
    """What the caller holds of `row`: positions `first ..`, with live SWA from `swa_live_from`."""
    return HeldSequence(slots=tuple(row[first:]), start=first, swa_live_from=swa_live_from)


def new_sequence(allocator, length: int) -> list[int]:
    """A fresh sequence of `length` tokens (prefix 0)."""
    result = allocator.alloc_extend([0], [length], [-1])
    assert not isinstance(result, OutOfMemory), result
    return result.tolist()


def free_page_sets(allocator: HybridAllocator) -> tuple[set, set]:
    state = allocator.state()
    return set(state.full.free_pages), set(state.swa.free_pages)


def translate(allocator, slots) -> list[int]:
    return allocator.translate(list(slots)).tolist()


def assert_clean(allocator: HybridAllocator, *sequences: HeldSequence):
    violations = allocator_violations(allocator.state(), list(sequences))
    assert violations == [], "\n".join(map(str, violations))


def assert_refused(allocator, error: type[KvSpecError], operation, *args, slots=None, match=None) -> KvSpecError:
    """[ALLOC-5, ALLOC-6] `operation(*args)` raises `error`, names `slots`, changes nothing."""
    before = allocator.state()
    with pytest.raises(error, match=match) as info:
        operation(*args)
    assert allocator.state() == before, f"refused {operation.__name__}{args} changed the allocator"
    if slots is not None:
        assert sorted(info.value.slots) == sorted(slots)
    return info.value


def assert_out_of_memory(allocator, result, pool: str, needed: int, available: int):
    """[ALLOC-4] An allocation that cannot be served returns OutOfMemory naming the pool."""
    assert isinstance(result, OutOfMemory), f"expected OutOfMemory, got {result}"
    assert (result.pool, result.needed_pages, result.available_pages) == (pool, needed, available)
    assert pool in str(result) and f"needed {needed} pages" in str(result)


def assert_oom_changes_nothing(allocator, operation, *args, pool: str, needed: int, available: int):
    before = allocator.state()
    assert_out_of_memory(allocator, operation(*args), pool, needed, available)
    assert allocator.state() == before, f"failed {operation.__name__}{args} changed the allocator"


