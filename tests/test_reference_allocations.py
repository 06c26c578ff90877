"""[ALLOC-1 .. ALLOC-5, MODEL-4] The reference allocator's configuration and allocations,
operation by operation, at page sizes 1 and 4: alloc, batched alloc_extend, alloc_decode,
alloc_extend_swa_tail, each with its OutOfMemory and invalid-argument paths. A refused
or failed call leaves `state()` exactly as it was."""

import pytest
from allocator_helpers import (
    PAGE_SIZES,
    assert_clean,
    assert_oom_changes_nothing,
    assert_refused,
    free_page_sets,
    held,
    hybrid,
    new_sequence,
    translate,
)

from kvspec.reference import HybridAllocator, PoolAllocator
from kvspec.spec.outcomes import InvalidAllocation, InvalidConfig
from kvspec.spec.pages import new_pages_for_decode, new_pages_for_extend

# -- [MODEL-4] configuration ---------------------------------------------------------------

@pytest.mark.parametrize("size_full, size_swa, page_size, expected", [
    (10, 8, 4, "size_full must be a multiple of page_size 4 (got 10; use 8 or 12)"),
    (8, 13, 4, "size_swa must be a multiple of page_size 4 (got 13; use 12 or 16)"),
    (8, 8, 0, "page_size must be >= 1 (got 0)"),
    (2, 8, 4, "size_full must hold at least one page of 4 slots (got 2)"),
    (8, 0, 1, "size_swa must hold at least one page of 1 slots (got 0)"),
])
def test_invalid_hybrid_config_raises_with_a_helpful_message(size_full, size_swa, page_size, expected):
    with pytest.raises(InvalidConfig) as info:
        HybridAllocator(size_full, size_swa, page_size)
    assert expected in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("size, page_size", [(10, 4), (0, 1), (2, 4), (4, 0)])
def test_invalid_pool_config_raises_with_a_helpful_message(size, page_size):
    with pytest.raises(InvalidConfig, match="must be a positive multiple of page_size"):
        PoolAllocator(size, page_size)


# -- alloc (page_size 1 only) -------------------------------------------------------------

def test_alloc_maps_each_full_slot_to_its_own_swa_slot():
    allocator = hybrid(1)
    slots = allocator.alloc(3).tolist()
    assert len(slots) == len(set(slots)) == 3 and 0 not in slots
    peers = translate(allocator, slots)
    assert len(set(peers)) == 3 and min(peers) > 0
    assert allocator.full_available_size() == allocator.swa_available_size() == 5
    assert_clean(allocator, held(slots))


def test_alloc_zero_tokens_changes_nothing():
    allocator = hybrid(1)
    before = allocator.state()
    assert allocator.alloc(0).tolist() == []
    assert allocator.state() == before


def test_alloc_negative_count_is_invalid():
    allocator = hybrid(1)
    assert_refused(allocator, InvalidAllocation, allocator.alloc, -1, match=">= 0")


def test_alloc_is_the_page_size_1_path_only():
    allocator = hybrid(4)
    assert_refused(allocator, InvalidAllocation, allocator.alloc, 4, match="alloc_extend or alloc_decode")


@pytest.mark.parametrize("pool, full_pages, swa_pages", [("full", 2, 8), ("swa", 8, 2)])
def test_alloc_out_of_memory_in_either_pool(pool, full_pages, swa_pages):
    allocator = hybrid(1, full_pages, swa_pages)
    assert_oom_changes_nothing(allocator, allocator.alloc, 3, pool=pool, needed=3, available=2)


# -- alloc_extend --------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_extend_batched_three_phase_placement(page_size):
    P = page_size
    allocator = hybrid(P, 16, 16)
    grown = new_sequence(allocator, P + 1)      # ends one token into a page: phase 1 fills it
    aligned = new_sequence(allocator, 2 * P)    # ends on a page boundary: no phase 1
    prefix_lens = [0, P + 1, 2 * P]
    seq_lens = [P + 2, 3 * P - 1, 2 * P + 1]
    last_loc = [-1, grown[-1], aligned[-1]]
    rows = [[], grown, aligned]
    full_before, swa_before = free_page_sets(allocator)

    out = allocator.alloc_extend(prefix_lens, seq_lens, last_loc).tolist()

    assert len(out) == sum(s - p for p, s in zip(prefix_lens, seq_lens))
    full_after, swa_after = free_page_sets(allocator)
    expected_pages = sum(new_pages_for_extend(p, s, P) for p, s in zip(prefix_lens, seq_lens))
    assert len(full_before - full_after) == len(swa_before - swa_after) == expected_pages
    assert full_after <= full_before and swa_after <= swa_before
    new_full_pages = set()
    for prefix, seq, last, row in zip(prefix_lens, seq_lens, last_loc, rows):
        new, out = out[:seq - prefix], out[seq - prefix:]
        peers = translate(allocator, new)
        for position, slot, peer in zip(range(prefix, seq), new, peers):
            # [PAGE-4] slot offsets equal position offsets, on both sides of the mapping
            assert slot % P == position % P == peer % P, (position, slot, peer)
        in_partial = min(seq, -(-prefix // P) * P) - prefix
        # phase 1: the partial page is filled right after last_loc, in both pools
        assert new[:in_partial] == list(range(last + 1, last + 1 + in_partial))
        if in_partial:
            swa_last = translate(allocator, [last])[0]
            assert peers[:in_partial] == list(range(swa_last + 1, swa_last + 1 + in_partial))
        new_full_pages |= {slot // P for slot in new[in_partial:]}
        row.extend(new)
    # phases 2 and 3 lie exactly on the pages taken from the full free list
    assert new_full_pages == full_before - full_after
    assert_clean(allocator, *(held(row) for row in rows))


def test_alloc_extend_consumes_nothing_when_the_extend_stays_in_the_partial_page():
    allocator = hybrid(4, 4, 4)
    row = new_sequence(allocator, 1)
    before_free = free_page_sets(allocator)
    out = allocator.alloc_extend([1], [3], [row[-1]]).tolist()
    assert out == [row[-1] + 1, row[-1] + 2]
    assert free_page_sets(allocator) == before_free


def test_alloc_extend_refuses_a_last_loc_that_does_not_continue_the_sequence():
    allocator = hybrid(4)
    row = new_sequence(allocator, 5)
    free_slot = min(allocator.state().full.free_pages) * 4
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend, [5], [7], [free_slot], match="not held")
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend, [5], [7], [row[3]], match="in-page offset")
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend, [5], [7], [-1], match="not a slot")
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend, [5], [7], [row[4], row[4]],
                   match="one entry per request")
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend, [7], [5], [row[4]],
                   match="prefix_len <= seq_len")


def test_alloc_extend_refuses_to_continue_a_released_swa_page():
    # SGLang's implicit precondition: mapping[last_loc] > 0 when the prefix ends inside a
    # page, otherwise the SWA side would write into the padding page.
    allocator = hybrid(4)
    row = new_sequence(allocator, 6)
    allocator.free_swa_segment(row[4:], 4)
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend, [6], [7], [row[5]], match="swa pool")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_extend_out_of_memory_in_either_pool(page_size):
    P = page_size
    short_full = hybrid(P, 2, 8)
    assert_oom_changes_nothing(short_full, short_full.alloc_extend, [0], [3 * P], [-1],
                               pool="full", needed=3, available=2)
    short_swa = hybrid(P, 8, 2)
    assert_oom_changes_nothing(short_swa, short_swa.alloc_extend, [0], [3 * P], [-1],
                               pool="swa", needed=3, available=2)
    # a batch whose requests fit one by one but not together
    batch = hybrid(P, 3, 3)
    assert_oom_changes_nothing(batch, batch.alloc_extend, [0, 0], [2 * P, 2 * P], [-1, -1],
                               pool="full", needed=4, available=3)


# -- alloc_decode -------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_alloc_decode_takes_a_new_page_exactly_when_the_token_starts_one(page_size):
    P = page_size
    allocator = hybrid(P, 16, 16)
    row = new_sequence(allocator, 1)
    for seq_len in range(2, 3 * P + 3):
        full_before, swa_before = free_page_sets(allocator)
        slot = allocator.alloc_decode([seq_len], [row[-1]]).tolist()
        full_after, swa_after = free_page_sets(allocator)
        new_page = (seq_len - 1) % P == 0
        assert new_page == bool(new_pages_for_decode(seq_len, P))
        assert len(full_before - full_after) == len(swa_before - swa_after) == int(new_page), seq_len
        assert len(slot) == 1 and slot[0] % P == (seq_len - 1) % P
        if new_page:
            assert slot[0] // P in full_before - full_after
        else:
            assert slot == [row[-1] + 1]
            assert translate(allocator, slot) == [translate(allocator, [row[-1]])[0] + 1]
        row.extend(slot)
    assert_clean(allocator, held(row))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_decode_batched(page_size):
    P = page_size
    allocator = hybrid(P, 16, 16)
    first, second = new_sequence(allocator, P), new_sequence(allocator, P + 1)
    out = allocator.alloc_decode([P + 1, P + 2], [first[-1], second[-1]]).tolist()
    first.append(out[0])
    second.append(out[1])
    assert out[1] == second[-2] + 1 or P == 1
    assert_clean(allocator, held(first), held(second))


def test_alloc_decode_refuses_an_empty_sequence():
    allocator = hybrid(4)
    assert_refused(allocator, InvalidAllocation, allocator.alloc_decode, [0], [-1], match="seq_len >= 1")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_decode_out_of_memory_in_the_full_pool(page_size):
    P = page_size
    allocator = hybrid(P, 2, 8)
    row = new_sequence(allocator, 2 * P)
    assert_oom_changes_nothing(allocator, allocator.alloc_decode, [2 * P + 1], [row[-1]],
                               pool="full", needed=1, available=0)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_decode_is_atomic_when_only_the_swa_pool_is_short(page_size):
    # [ALLOC-4] SGLang 0.5.23 keeps the full page here (a leak); the reference takes nothing.
    P = page_size
    allocator = hybrid(P, 8, 2)
    row = new_sequence(allocator, 2 * P)
    assert allocator.full_available_size() == 6 * P and allocator.swa_available_size() == 0
    assert_oom_changes_nothing(allocator, allocator.alloc_decode, [2 * P + 1], [row[-1]],
                               pool="swa", needed=1, available=0)
    if P > 1:
        # a token that continues its page needs no page from either pool
        shorter = hybrid(P, 8, 2)
        row = new_sequence(shorter, 2 * P - 1)
        assert shorter.alloc_decode([2 * P], [row[-1]]).tolist() == [row[-1] + 1]


# -- alloc_extend_swa_tail ([ALLOC-3], the section 5 example) ---------------------------------

def test_alloc_extend_swa_tail_worked_example():
    # W=8, P=4, fill=30, no decode radix: tail 10, full pages 8, SWA pages 3, head 20.
    allocator = hybrid(4, 16, 8)
    full_before, swa_before = free_page_sets(allocator)
    row = allocator.alloc_extend_swa_tail(0, 30, -1, 10).tolist()
    full_after, swa_after = free_page_sets(allocator)
    assert len(row) == 30
    assert len(full_before - full_after) == 8 and len(swa_before - swa_after) == 3
    peers = translate(allocator, row)
    assert peers[:20] == [0] * 20, "the head (positions 0..19) has no SWA peer"
    for position in range(20, 30):
        assert row[position] % 4 == position % 4 == peers[position] % 4
    assert {peer // 4 for peer in peers[20:]} == swa_before - swa_after
    assert_clean(allocator, held(row, swa_live_from=20))


def test_alloc_extend_swa_tail_worked_example_with_l1_prefix():
    # Same request, decode radix and a 12-token L1 prefix: tail 10, 5 new full pages,
    # head [12, 20) mapped to 0.
    allocator = hybrid(4, 16, 8)
    prefix = new_sequence(allocator, 12)
    full_before, swa_before = free_page_sets(allocator)
    new = allocator.alloc_extend_swa_tail(12, 30, prefix[-1], 10).tolist()
    full_after, swa_after = free_page_sets(allocator)
    assert len(new) == 18
    assert len(full_before - full_after) == 5 and len(swa_before - swa_after) == 3
    assert translate(allocator, new[:8]) == [0] * 8
    assert min(translate(allocator, new[8:])) > 0
    assert_clean(allocator, held(prefix),
                 held(prefix + new, swa_live_from=20, first=12))


def test_alloc_extend_swa_tail_without_a_tail_takes_no_swa_page():
    allocator = hybrid(4, 16, 8)
    swa_before = allocator.state().swa
    row = allocator.alloc_extend_swa_tail(0, 8, -1, 0).tolist()
    assert allocator.state().swa == swa_before
    assert translate(allocator, row) == [0] * 8
    assert_clean(allocator, held(row, swa_live_from=8))


def test_alloc_extend_swa_tail_preconditions():
    allocator = hybrid(4, 16, 8)
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend_swa_tail, 0, 30, -1, 9,
                   match="must start on a page boundary")
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend_swa_tail, 12, 30, -1, 20,
                   match="swa_tail_len <= seq_len - prefix_len")
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend_swa_tail, 0, 30, -1, -2)


@pytest.mark.parametrize("pool, full_pages, swa_pages, needed, available", [
    ("full", 7, 8, 8, 7),
    ("swa", 16, 2, 3, 2),
])
def test_alloc_extend_swa_tail_out_of_memory_in_either_pool(pool, full_pages, swa_pages, needed, available):
    allocator = hybrid(4, full_pages, swa_pages)
    assert_oom_changes_nothing(allocator, allocator.alloc_extend_swa_tail, 0, 30, -1, 10,
                               pool=pool, needed=needed, available=available)
