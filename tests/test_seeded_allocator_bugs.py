"""The allocator state machine catches realistic allocator bugs.

Each test seeds one small bug into the reference (a subclass of `HybridAllocator` or of
`PoolAllocator` with a line or two changed), wraps it in an adapter, runs
`allocator_machine` against it and checks that the machine fails *for the right reason*:
the failure text names the clause the bug breaks. A check that no seeded bug can make
fail would be a check that tests nothing (style.md)."""

import re

import pytest
import torch
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.reference import ReferenceAllocatorAdapter
from kvspec.conformance.harness.allocator_machine import allocator_machine
from kvspec.reference.hybrid import HybridAllocator
from kvspec.reference.pool import PoolAllocator
from kvspec.spec.accounting import HeldSequence
from kvspec.spec.allocator import swa_tail_split
from kvspec.spec.invariants.allocator import allocator_violations
from kvspec.spec.notation import NO_SWA_PEER
from kvspec.spec.outcomes import InvalidFree, OutOfMemory

# Shrinking is left out: it would make the file take minutes (each bug is found within
# a few dozen examples, shrinking one takes 5 to 35 s), and the assertion is on the
# clause, not on a minimal reproduction. A fixed seed, not derandomize: derandomize draws
# one fixed sequence per test, and for the page-4 non-atomic decode that sequence missed
# the bug in 345 examples where random seeds find it in 13 to 98.
# derandomize=False explicitly: under CI=true Hypothesis' own `ci` profile is the default,
# with derandomize=True, which would ignore the seed (and missed this file's tail bug in
# one CI run that the seed finds in 50 examples).
SETTINGS = settings(max_examples=300, stateful_step_count=30, deadline=None, database=None, derandomize=False,
                    phases=[Phase.explicit, Phase.generate])
SEED = 20261130


# -- harness ---------------------------------------------------------------------------------

def adapter_for(allocator_class: type[HybridAllocator]) -> type[ReferenceAllocatorAdapter]:
    """The reference adapter, building `allocator_class` instead of the reference."""

    class BuggyAdapter(ReferenceAllocatorAdapter):
        name = f"seeded:{allocator_class.__name__}"

        def __init__(self, size_full: int, size_swa: int, page_size: int, device: str = "cpu"):
            self.allocator = allocator_class(size_full, size_swa, page_size, device=device)

    return BuggyAdapter


def with_pools(full_class: type[PoolAllocator] = PoolAllocator,
               swa_class: type[PoolAllocator] = PoolAllocator) -> type[HybridAllocator]:
    """A hybrid allocator whose sub-pools are (possibly buggy) subclasses."""

    class HybridWithPools(HybridAllocator):
        def __init__(self, size_full, size_swa, page_size=1, *, device="cpu"):
            super().__init__(size_full, size_swa, page_size, device=device)
            self.full = full_class(size_full, page_size, name="full", device=self.device)
            self.swa = swa_class(size_swa, page_size, name="swa", device=self.device)
            self.clear()

    HybridWithPools.__name__ = f"HybridWith{full_class.__name__}And{swa_class.__name__}"
    return HybridWithPools


def failure_text(error: BaseException | None) -> str:
    """Every message of a failure: the members of an exception group, and the exceptions
    it was raised while handling. (The machine's teardown drains the allocator in a
    `finally`; when a buggy allocator makes the drain fail too, that error masks the
    step's own failure, which survives as its `__context__`.)"""
    if error is None:
        return ""
    if hasattr(error, "exceptions"):  # an exception group (Python 3.11+, or its backport)
        text = "\n".join(failure_text(member) for member in error.exceptions)
    else:
        text = f"{type(error).__name__}: {error}"
    return "\n".join(filter(None, [text, failure_text(error.__cause__ or error.__context__)]))


def machine_failure(allocator_class: type[HybridAllocator], page_size: int) -> str:
    """Run the allocator machine against `allocator_class`; return why it failed."""
    machine = allocator_machine(adapter_for(allocator_class), page_size)
    with pytest.raises(Exception) as info:  # what matters is the clause the text names
        run_state_machine_as_test(seed(SEED)(machine), settings=SETTINGS)
    return failure_text(info.value)


def assert_caught(allocator_class, page_size: int, *clauses: str):
    """The machine fails, and its failure names one of `clauses`."""
    text = machine_failure(allocator_class, page_size)
    named = re.findall(r"\[([A-Z0-9, -]+)\]", text)  # "[ALLOC-4, I15] ..." names both
    assert any(clause in group.split(", ") for group in named for clause in clauses), \
        f"the machine failed, but not for {' or '.join(clauses)}:\n{text}"


def test_the_unmodified_reference_passes():
    # the control: with no bug seeded, the same harness does not fail
    for page_size in (1, 4):
        machine = allocator_machine(adapter_for(HybridAllocator), page_size)
        machine.TestCase.settings = settings(SETTINGS, max_examples=40)
        machine.TestCase().runTest()


# -- the bugs -----------------------------------------------------------------------------------

class StaleMappingOnSwaFree(HybridAllocator):
    """Strict SWA free that returns the SWA pages but forgets to clear the mapping."""

    def release_swa_strict(self, full_slots, operation):
        peers = self.mapping[full_slots]
        if (peers <= 0).any():
            raise InvalidFree(f"{operation}: unmapped", full_slots[peers <= 0].tolist())
        self.swa.release_pages(self.swa.held_pages_of(peers, operation))
        # BUG: self.mapping[full pages] = NO_SWA_PEER is missing


@pytest.mark.parametrize("page_size", [1, 4])
def test_swa_free_leaving_the_mapping_stale_breaks_i5(page_size):
    assert_caught(StaleMappingOnSwaFree, page_size, "I5")


class LeakingPool(PoolAllocator):
    """A free that forgets to return one page of what it frees."""

    def release_pages(self, pages):
        super().release_pages(pages[1:])  # BUG: the first page is neither free nor held


@pytest.mark.parametrize("page_size", [1, 4])
def test_free_forgetting_a_page_breaks_i2(page_size):
    assert_caught(with_pools(full_class=LeakingPool), page_size, "I2")


class DoubleReturningPool(PoolAllocator):
    """A free that puts the first freed page on the free list twice."""

    def release_pages(self, pages):
        super().release_pages(torch.cat((pages, pages[:1])))  # BUG


@pytest.mark.parametrize("page_size", [1, 4])
def test_free_returning_a_page_twice_breaks_i1(page_size):
    # outside a free group the duplicate lands in the free list (I1); inside one it is
    # queued twice (I16)
    assert_caught(with_pools(swa_class=DoubleReturningPool), page_size, "I1", "I16")


class FullOnlyCapacityCheck(HybridAllocator):
    """The capacity check looks at the full pool only. The sub-allocators then run full
    side first, and the SWA one comes back short after the full pages were taken (what
    ALLOC-2's single check of both pools prevents)."""

    def capacity_shortfall(self, full_pages, swa_pages):
        if full_pages > self.full.available_pages():
            return OutOfMemory("full", full_pages, self.full.available_pages())
        if swa_pages > self.swa.available_pages():  # BUG: found out only by the SWA sub-allocator,
            self.full.take_pages(full_pages)         # after the full one already took its pages
            return OutOfMemory("swa", swa_pages, self.swa.available_pages())
        return None


@pytest.mark.parametrize("page_size", [1, 4])
def test_capacity_check_on_the_full_pool_only_is_caught(page_size):
    # A full-only check is never stricter than the real one, so the machine's
    # "[ALLOC-2] OutOfMemory although both pools had room" cannot fire; what shows is the
    # SWA side failing after the full side consumed its pages.
    text = machine_failure(FullOnlyCapacityCheck, page_size)
    assert "[ALLOC-4, I15] a failed allocation changed the allocator" in text or "[ALLOC-2]" in text, text


class FullPageCountToSwaTail(HybridAllocator):
    """alloc_extend_swa_tail hands the SWA sub-allocator the full page count (the
    design-doc-era bug): it takes as many SWA pages as the whole extend needs and the
    tail uses only the first few; the rest are neither free nor held."""

    def alloc_extend_swa_tail(self, prefix_len, seq_len, last_loc, swa_tail_len):
        split = swa_tail_split(prefix_len, seq_len, swa_tail_len, self.page_size)
        full_plans = self.full.plan_extend([prefix_len], [seq_len], [last_loc])
        swa_plans = self.swa.plan_extend([0], [swa_tail_len], [-1])
        shortfall = self.capacity_shortfall(split.full_pages, split.swa_pages)
        if shortfall:
            return shortfall
        full_slots = self.full.place_extend(full_plans, [last_loc], self.full.take_pages(split.full_pages))
        swa_pages = self.swa.take_pages(split.full_pages)  # BUG: split.swa_pages
        if isinstance(swa_pages, OutOfMemory):
            return swa_pages  # the sub-allocator's own check fails, after the full side
        swa_slots = self.swa.place_extend(swa_plans, [-1], swa_pages)
        self.mapping[full_slots[:split.head_len]] = NO_SWA_PEER
        self.set_mapping(full_slots[split.head_len:], swa_slots)
        return full_slots


@pytest.mark.parametrize("allocator_class, clauses", [(FullPageCountToSwaTail, {"I3"}), (HybridAllocator, set())])
def test_full_page_count_on_the_swa_tail_side_breaks_i3(allocator_class, clauses):
    # One call shows it: a one-page SWA tail of a two-page extend takes two SWA pages and
    # uses one; the other is neither free nor held (I3). (The machine finds the same bug as
    # the zoo's mutant-tail-full-page-count. Run here by the machine at a fixed seed, it was
    # found within 50 examples alone, yet missed in 300 within CI's full test run twice,
    # for a reason not found: the scripted call is the deterministic test.)
    allocator = allocator_class(32, 32, 4)
    slots = allocator.alloc_extend_swa_tail(0, 8, -1, 4)
    held = [HeldSequence(tuple(slots.tolist()), start=0, swa_live_from=4)]
    assert {v.clause for v in allocator_violations(allocator.state(), held)} == clauses


class NonAtomicDecode(HybridAllocator):
    """SGLang 0.5.23's alloc_decode: full side first, SWA side second, no rollback."""

    def alloc_decode(self, seq_lens, last_loc):
        swa_last = self.swa_last_loc(last_loc)
        full_plans = self.full.plan_decode(seq_lens, last_loc)
        swa_plans = self.swa.plan_decode(seq_lens, swa_last)
        pages = sum(plan.new_pages for plan in full_plans)
        full_pages = self.full.take_pages(pages)
        if not isinstance(full_pages, torch.Tensor):
            return full_pages
        swa_pages = self.swa.take_pages(pages)
        if not isinstance(swa_pages, torch.Tensor):
            return swa_pages  # BUG: the full page stays taken
        full_slots = self.full.place_extend(full_plans, last_loc, full_pages)
        self.set_mapping(full_slots, self.swa.place_extend(swa_plans, swa_last, swa_pages))
        return full_slots


@pytest.mark.parametrize("page_size", [1, 4])
def test_non_atomic_decode_breaks_alloc_4(page_size):
    assert_caught(NonAtomicDecode, page_size, "ALLOC-4")


class OffByOnePlacement(PoolAllocator):
    """New pages are filled from in-page offset 1 instead of 0."""

    def place_extend(self, plans, last_loc, pages):
        pieces = []
        next_page = 0
        for plan, last in zip(plans, last_loc):
            if plan.in_partial_page:
                pieces.append(torch.arange(last + 1, last + 1 + plan.in_partial_page, device=self.device))
            mine = pages[next_page:next_page + plan.new_pages]
            next_page += plan.new_pages
            # BUG: + 1 shifts every token on a new page by one slot
            pieces.append(self.page_slots(mine)[:plan.on_whole_pages + plan.on_last_page] + 1)
        return torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64, device=self.device)


def test_off_by_one_placement_breaks_i6():
    assert_caught(with_pools(full_class=OffByOnePlacement), 4, "I6")


class UncheckedSwaSegmentFree(HybridAllocator):
    """free_swa_segment with SGLang's invariant checks off: an unmapped peer reads as SWA
    slot 0, and page 0 (the padding page) is freed."""

    def free_swa_segment(self, full_slots, start_pos):
        full_slots = self.as_slots(full_slots)
        self.full.check_segment(full_slots, start_pos, "free_swa_segment")
        peers = self.mapping[full_slots]  # BUG: no check that the peers are mapped
        swa_pages = torch.unique(peers // self.page_size)
        self.mapping[self.full.page_slots(torch.unique(full_slots // self.page_size))] = NO_SWA_PEER
        self.swa.release_pages(swa_pages)


@pytest.mark.parametrize("page_size", [1, 4])
def test_unchecked_swa_segment_free_is_caught(page_size):
    # The machine's own misuse rule (free_swa_segment of released slots) sees the call
    # accepted first and reports ALLOC-6; the padding page in the free list (I1) is what
    # the call left behind.
    text = machine_failure(UncheckedSwaSegmentFree, page_size)
    assert "[ALLOC-6] free_swa_segment" in text or "[I1]" in text, text


class DedupingPool(PoolAllocator):
    """A free that silently dedups the slots it is given (SGLang's paged `unique`), so
    a slot named twice is freed once instead of being refused."""

    def held_pages_of(self, slots, operation):
        slots = torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)
        return super().held_pages_of(torch.unique(slots), operation)  # BUG


@pytest.mark.parametrize("page_size", [1, 4])
def test_free_accepting_a_slot_twice_breaks_alloc_6(page_size):
    assert_caught(with_pools(full_class=DedupingPool, swa_class=DedupingPool), page_size, "ALLOC-6")


# -- an allocator without capability atomic_alloc_decode: still called without room --------------

WITHOUT_ATOMIC_DECODE = frozenset({"swa_tail", "free_groups", "refuses_misuse", "full_frees", "segment_frees"})


def run_without_atomic_decode(allocator_class, page_size: int):
    machine = allocator_machine(adapter_for(allocator_class), page_size, WITHOUT_ATOMIC_DECODE)
    run_state_machine_as_test(seed(SEED)(machine), settings=SETTINGS)


def test_a_decode_that_keeps_its_full_page_is_charged_to_the_failed_call_and_the_rest_still_checks():
    """SGLang's known divergence (SGL-6), modelled by NonAtomicDecode: without the
    capability the machine still calls alloc_decode without room; what the failed call kept
    is charged to it, so conservation and the drain hold."""
    run_without_atomic_decode(NonAtomicDecode, 4)


class GreedyFailedDecode(NonAtomicDecode):
    """A failed decode that keeps more full pages than the decode asked for."""

    def alloc_decode(self, seq_lens, last_loc):
        if self.swa.available_size() < self.page_size and self.full.available_size() >= 2 * self.page_size:
            self.full.take_pages(2)  # BUG: two pages for a one-page decode, then fails
            return OutOfMemory("swa", 1, 0)
        return super().alloc_decode(seq_lens, last_loc)


class MappedFailedDecode(NonAtomicDecode):
    """A failed decode that leaves the full slot it kept mapped to the padding SWA slot's
    neighbour, a free SWA slot."""

    def alloc_decode(self, seq_lens, last_loc):
        before = set(self.full.free_pages.tolist())
        result = super().alloc_decode(seq_lens, last_loc)
        if isinstance(result, OutOfMemory):
            for page in before - set(self.full.free_pages.tolist()):  # BUG: a peer that no one holds
                self.mapping[page * self.page_size] = self.page_size
        return result


def test_a_failed_decode_may_not_keep_more_than_it_asked_for():
    with pytest.raises(Exception) as info:
        run_without_atomic_decode(GreedyFailedDecode, 4)
    assert "[ALLOC-4] a failed alloc_decode of 1 page(s) per pool kept 2 full" in failure_text(info.value)


def test_what_a_failed_decode_kept_is_still_checked():
    with pytest.raises(Exception) as info:
        run_without_atomic_decode(MappedFailedDecode, 4)
    text = failure_text(info.value)
    assert re.search(r"\[(I5|MAP-\d|I4)[^\]]*\]", text), text
