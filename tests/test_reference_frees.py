"""[ALLOC-6, MAP-1 .. MAP-3, I16] The reference allocator's frees, free groups and
observations, at page sizes 1 and 4; every refused free raises the typed error naming
the offending slots and leaves `state()` as it was; `PoolAllocator` on its own; the
reference on CUDA when there is one."""

import pytest
import torch
from allocator_helpers import (
    PAGE_SIZES,
    assert_clean,
    assert_out_of_memory,
    assert_refused,
    free_page_sets,
    held,
    hybrid,
    new_sequence,
    translate,
)

from kvspec.reference import HybridAllocator, PoolAllocator
from kvspec.spec.outcomes import InvalidAllocation, InvalidFree
from kvspec.spec.pages import pages_for

# -- free ----------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_returns_both_pools_to_empty(page_size):
    P = page_size
    allocator = hybrid(P)
    first, second = new_sequence(allocator, 2 * P + 1), new_sequence(allocator, P)
    allocator.free(first)
    assert_clean(allocator, held(second))
    allocator.free(second)
    state = allocator.state()
    assert sorted(state.full.free_pages) == sorted(state.swa.free_pages) == list(range(1, 9))
    assert set(state.mapping[:-1]) == {0} and state.mapping[-1] == -1
    assert_clean(allocator)


def test_free_is_page_granular_with_pages_larger_than_one():
    allocator = hybrid(4)
    row = new_sequence(allocator, 8)
    full_before, swa_before = free_page_sets(allocator)
    allocator.free([row[1]])  # any slot frees its whole page, in both pools
    full_after, swa_after = free_page_sets(allocator)
    assert full_after - full_before == {row[0] // 4}
    assert len(swa_after - swa_before) == 1
    assert translate(allocator, row[:4]) == [0] * 4
    assert_clean(allocator, held(row, first=4))


# -- free_swa -------------------------------------------------------------------------------

def test_free_swa_is_strict_with_page_size_1():
    allocator = hybrid(1)
    row = new_sequence(allocator, 4)
    swa_free_before = allocator.swa_available_size()
    allocator.free_swa(row[:2])
    assert translate(allocator, row[:2]) == [0, 0]
    assert allocator.swa_available_size() == swa_free_before + 2
    assert allocator.full_available_size() == 4
    assert_clean(allocator, held(row, swa_live_from=2))
    assert_refused(allocator, InvalidFree, allocator.free_swa, row[:2], slots=row[:2], match="no live SWA peer")
    assert_refused(allocator, InvalidFree, allocator.free_swa, [row[1], row[2]], slots=[row[1]])


def test_free_swa_is_lenient_and_page_granular_with_larger_pages():
    allocator = hybrid(4)
    row = new_sequence(allocator, 10)
    swa_before = allocator.swa.available_pages()
    allocator.free_swa([row[1]])
    assert translate(allocator, row[:4]) == [0] * 4, "every slot of the touched full page loses its peer"
    assert allocator.swa.available_pages() == swa_before + 1
    before = allocator.state()
    allocator.free_swa([row[1]])  # nothing left to release on that page: skipped, no error
    assert allocator.state() == before
    allocator.free_swa([row[0], row[5]])  # page 0 skipped, page 1 released
    assert allocator.swa.available_pages() == swa_before + 2
    assert_clean(allocator, held(row, swa_live_from=8))


# -- free_full ------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_full_refuses_a_live_swa_peer(page_size):
    """[MAP-2] Freeing the full slot would strand its SWA peer."""
    P = page_size
    allocator = hybrid(P)
    row = new_sequence(allocator, 2 * P)
    assert_refused(allocator, InvalidFree, allocator.free_full, row[:P], slots=row[:P], match="still have live SWA")
    allocator.free_swa_segment(row[:P], 0)
    allocator.free_full(row[:P])
    assert_clean(allocator, held(row, first=P))


def test_free_full_refuses_a_page_whose_other_slots_have_live_peers():
    # REFERENCE BUG (reported): free_full is page-granular but checks the live-peer guard
    # only on the slots it is given. Slot 6 lies on the page of a 2-token sequence
    # (slots 4, 5, both with live SWA peers); freeing it frees the whole page, leaving
    # slots 4 and 5 mapped on a free full page and their SWA page leaked.
    allocator = hybrid(4)
    row = new_sequence(allocator, 2)
    unheld_slot_on_the_same_page = row[0] + 2
    assert_refused(allocator, InvalidFree, allocator.free_full, [unheld_slot_on_the_same_page],
                   match="live SWA peer")


# -- segment frees ------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_segment_releases_whole_pages_the_last_one_too(page_size):
    P = page_size
    allocator = hybrid(P)
    row = new_sequence(allocator, 3 * P - 1)  # ends inside its last page when P > 1
    full_before, swa_before = allocator.full.available_pages(), allocator.swa.available_pages()
    allocator.free_segment(row[P:], P)
    released = pages_for(3 * P - 1, P) - 1
    assert released == (2 if P > 1 else 1)
    assert allocator.full.available_pages() == full_before + released
    assert allocator.swa.available_pages() == swa_before + released
    assert_clean(allocator, held(row[:P]))


def test_free_segment_refuses_unaligned_and_misplaced_segments():
    allocator = hybrid(4)
    row = new_sequence(allocator, 8)
    assert_refused(allocator, InvalidFree, allocator.free_segment, row[1:], 1, match="not a multiple of page_size")
    assert_refused(allocator, InvalidFree, allocator.free_segment, row[1:3], 0, slots=row[1:3],
                   match="in-page offsets")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_swa_segment_is_strict(page_size):
    P = page_size
    allocator = hybrid(P, 16, 8)
    row = allocator.alloc_extend_swa_tail(0, 3 * P, -1, P).tolist()  # head 2P, tail P
    head, tail = row[:2 * P], row[2 * P:]
    assert_refused(allocator, InvalidFree, allocator.free_swa_segment, head[:P], 0, slots=head[:P],
                   match="no live SWA peer")
    assert_refused(allocator, InvalidFree, allocator.free_swa_segment, row[P:], P, slots=head[P:])
    swa_before = allocator.swa.available_pages()
    allocator.free_swa_segment(tail, 2 * P)
    assert allocator.swa.available_pages() == swa_before + 1
    assert translate(allocator, row) == [0] * (3 * P)
    assert_clean(allocator, held(row, swa_live_from=3 * P))


def test_free_swa_segment_ending_inside_a_page_clears_the_whole_page():
    allocator = hybrid(4)
    row = new_sequence(allocator, 3)
    allocator.free_swa_segment(row[:1], 0)
    state = allocator.state()
    assert state.mapping[row[0] // 4 * 4: row[0] // 4 * 4 + 4] == (0, 0, 0, 0)
    assert len(state.swa.free_pages) == 8


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_full_segment(page_size):
    P = page_size
    allocator = hybrid(P, 16, 8)
    row = allocator.alloc_extend_swa_tail(0, 3 * P, -1, P).tolist()
    head, tail = row[:2 * P], row[2 * P:]
    assert_refused(allocator, InvalidFree, allocator.free_full_segment, tail, 2 * P, slots=tail,
                   match="still have live SWA")
    if P > 1:
        assert_refused(allocator, InvalidFree, allocator.free_full_segment, head[1:], 1,
                       match="not a multiple of page_size")
    full_before = allocator.full.available_pages()
    allocator.free_full_segment(head, 0)
    assert allocator.full.available_pages() == full_before + 2
    assert_clean(allocator, held(row, swa_live_from=2 * P, first=2 * P))


# -- free groups ([I16]) --------------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_group_releases_nothing_until_its_end(page_size):
    P = page_size
    allocator = hybrid(P, 16, 8)
    first, second = new_sequence(allocator, 2 * P), new_sequence(allocator, P + 1)
    sizes_before = (allocator.full_available_size(), allocator.swa_available_size())
    allocator.free_group_begin()
    allocator.free(first)
    allocator.free_swa_segment(second[:P], 0)
    assert translate(allocator, first + second[:P]) == [0] * (3 * P), "the mapping is cleared at enqueue time"
    assert (allocator.full_available_size(), allocator.swa_available_size()) == sizes_before
    state = allocator.state()
    assert len(state.full.pending_pages) == 2 and len(state.swa.pending_pages) == 3
    remaining = held(second, swa_live_from=P)
    assert_clean(allocator, remaining)
    allocator.free_group_end()
    state = allocator.state()
    assert state.full.pending_pages == state.swa.pending_pages == ()
    assert allocator.full_available_size() == sizes_before[0] + 2 * P
    assert allocator.swa_available_size() == sizes_before[1] + 3 * P
    assert_clean(allocator, remaining)


def test_free_groups_do_not_nest():
    allocator = hybrid(4)
    allocator.free_group_begin()
    assert_refused(allocator, InvalidFree, allocator.free_group_begin, match="do not nest")
    allocator.free_group_end()
    assert_refused(allocator, InvalidFree, allocator.free_group_end, match="without free_group_begin")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_group_refuses_a_page_queued_twice(page_size):
    P = page_size
    allocator = hybrid(P)
    row = new_sequence(allocator, 2 * P)
    allocator.free_group_begin()
    allocator.free([row[0]])
    same_page = row[P - 1]
    assert_refused(allocator, InvalidFree, allocator.free, [same_page], slots=[same_page],
                   match="freed in the open free group")
    assert_refused(allocator, InvalidFree, allocator.free_full_segment, row[:P], 0, slots=row[:P])
    allocator.free_group_end()
    assert_clean(allocator, held(row, first=P))


# -- observation: available sizes, translate, state, clear -----------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_available_sizes(page_size):
    P = page_size
    allocator = hybrid(P, 8, 4)
    assert (allocator.full_available_size(), allocator.swa_available_size(), allocator.available_size()) == \
        (8 * P, 4 * P, 4 * P)
    new_sequence(allocator, P)
    assert (allocator.full_available_size(), allocator.swa_available_size(), allocator.available_size()) == \
        (7 * P, 3 * P, 3 * P)
    allocator.alloc_extend_swa_tail(0, 5 * P, -1, P)  # 5 full pages, 1 SWA page
    assert (allocator.full_available_size(), allocator.swa_available_size(), allocator.available_size()) == \
        (2 * P, 2 * P, 2 * P)
    allocator.alloc_extend_swa_tail(0, P, -1, 0)
    assert (allocator.full_available_size(), allocator.swa_available_size(), allocator.available_size()) == \
        (P, 2 * P, P)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_translate(page_size):
    allocator = hybrid(page_size)
    assert translate(allocator, [-1]) == [-1], "[MAP-1] the sentinel translates last_loc -1 to -1"
    assert translate(allocator, []) == []
    row = new_sequence(allocator, page_size + 1)
    assert translate(allocator, row) == [allocator.state().mapping[slot] for slot in row]
    assert translate(allocator, [0]) == [0]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_clear_restores_the_initial_state(page_size):
    P = page_size
    allocator = hybrid(P, 8, 6)
    initial = allocator.state()
    row = new_sequence(allocator, 3 * P)
    allocator.free_group_begin()
    allocator.free(row[:P])
    allocator.clear()
    assert allocator.state() == initial
    allocator.free_group_begin()  # the group was closed by clear
    allocator.free_group_end()


def test_state_mapping_shape():
    allocator = hybrid(4, 8, 6)
    state = allocator.state()
    assert len(state.mapping) == 8 * 4 + 4 + 1 and state.mapping[-1] == -1
    assert (state.full.num_pages, state.swa.num_pages, state.page_size, state.size_full) == (8, 6, 4, 32)


# -- every refused free ([ALLOC-6]) ---------------------------------------------------------

SET_SHAPED = ["free", "free_swa", "free_full"]
SEGMENT_SHAPED = ["free_segment", "free_swa_segment", "free_full_segment"]


def call_free(allocator, operation: str, slots: list[int], start_pos: int = 0):
    function = getattr(allocator, operation)
    return (function, slots) if operation in SET_SHAPED else (function, slots, start_pos)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("operation", SET_SHAPED + SEGMENT_SHAPED)
def test_every_free_refuses_the_padding_page(page_size, operation):
    allocator = hybrid(page_size)
    new_sequence(allocator, 2 * page_size)
    assert_refused(allocator, InvalidFree, *call_free(allocator, operation, [0]), slots=[0], match="padding page")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("operation", SET_SHAPED + SEGMENT_SHAPED)
def test_every_free_refuses_a_free_page(page_size, operation):
    allocator = hybrid(page_size)
    new_sequence(allocator, 2 * page_size)
    slot = max(allocator.state().full.free_pages) * page_size
    assert_refused(allocator, InvalidFree, *call_free(allocator, operation, [slot]), slots=[slot],
                   match="already free")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("operation", SET_SHAPED + SEGMENT_SHAPED)
def test_every_free_refuses_the_same_slot_twice(page_size, operation):
    allocator = hybrid(page_size)
    row = new_sequence(allocator, 2 * page_size)
    slot = row[0]
    assert_refused(allocator, InvalidFree, *call_free(allocator, operation, [slot, slot]), slots=[slot])


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("operation", SET_SHAPED + SEGMENT_SHAPED)
def test_every_free_refuses_a_slot_outside_the_pool(page_size, operation):
    allocator = hybrid(page_size)
    new_sequence(allocator, page_size)
    outside = (8 + 1) * page_size  # first slot after the last page
    assert_refused(allocator, InvalidFree, *call_free(allocator, operation, [outside]), slots=[outside],
                   match="not slots of the pool")


@pytest.mark.parametrize("page_size, operation", [
    (1, "free_swa"), (1, "free_segment"), (1, "free_swa_segment"),
    (4, "free_segment"), (4, "free_swa_segment"),
])
def test_every_strict_free_refuses_an_unmapped_swa_peer(page_size, operation):
    P = page_size
    allocator = hybrid(P)
    row = new_sequence(allocator, 3 * P)
    allocator.free_swa_segment(row[:P], 0)
    released = row[:P]
    assert_refused(allocator, InvalidFree, *call_free(allocator, operation, row[:2 * P]), slots=released,
                   match="no live SWA peer")


@pytest.mark.parametrize("page_size", [1, 4])
def test_free_is_no_strict_path_it_frees_a_released_ranges_full_kv_only(page_size):
    """ALLOC-6: what an allocator without free_full (SGLang before 0.5.19) frees a released range with."""
    P = page_size
    allocator = hybrid(P)
    row = new_sequence(allocator, 3 * P)
    allocator.free_swa_segment(row[:P], 0)
    full, swa = allocator.full_available_size(), allocator.swa_available_size()
    allocator.free(row)
    assert (allocator.full_available_size() - full, allocator.swa_available_size() - swa) == (3 * P, 2 * P)


@pytest.mark.parametrize("operation", SEGMENT_SHAPED)
def test_every_segment_free_refuses_an_unaligned_start(operation):
    allocator = hybrid(4)
    row = new_sequence(allocator, 8)
    allocator.free_swa_segment(row[:4], 0)  # so that free_full_segment would otherwise accept
    assert_refused(allocator, InvalidFree, *call_free(allocator, operation, row[2:4], 2),
                   match="start_pos 2 is not a multiple of page_size 4")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_a_refused_free_in_a_batch_frees_nothing_of_the_batch(page_size):
    # one bad slot anywhere in the call refuses the whole call
    allocator = hybrid(page_size)
    row = new_sequence(allocator, 2 * page_size)
    free_slot = max(allocator.state().full.free_pages) * page_size
    assert_refused(allocator, InvalidFree, allocator.free, row + [free_slot], slots=[free_slot])


# -- reference bug: last_loc outside the pool -------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_a_last_loc_outside_the_pool_is_an_invalid_allocation(page_size):
    # REFERENCE BUG (reported): HybridAllocator.swa_last_loc indexes the mapping with
    # last_loc before anything validates it, so a last_loc past the mapping raises a
    # torch IndexError instead of InvalidAllocation (the prefix here ends on a page
    # boundary, so the pool never looks at last_loc).
    P = page_size
    allocator = hybrid(P)
    row = new_sequence(allocator, P)
    outside = 10 ** 6
    assert_refused(allocator, InvalidAllocation, allocator.alloc_extend, [P], [P + 1], [outside])
    assert_refused(allocator, InvalidAllocation, allocator.alloc_decode, [P + 1], [outside])
    assert_clean(allocator, held(row))


# -- PoolAllocator on its own ---------------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_pool_alloc_whole_pages(page_size):
    pool = PoolAllocator(8 * page_size, page_size)
    slots = pool.alloc(2 * page_size).tolist()
    assert len(slots) == 2 * page_size and len({slot // page_size for slot in slots}) == 2
    assert all(slot % page_size == i % page_size for i, slot in enumerate(slots))
    assert pool.available_pages() == 6
    if page_size > 1:
        before = pool.state()
        with pytest.raises(InvalidAllocation, match="whole pages"):
            pool.alloc(page_size + 1)
        assert pool.state() == before
    before = pool.state()
    assert_out_of_memory(pool, pool.alloc(7 * page_size), "full", 7, 6)
    assert pool.state() == before


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_pool_extend_decode_and_free(page_size):
    P = page_size
    pool = PoolAllocator(8 * P, P, name="swa")
    row = pool.alloc_extend([0], [P + 1], [-1]).tolist()
    row += pool.alloc_decode([P + 2], [row[-1]]).tolist()
    assert all(slot % P == position % P for position, slot in enumerate(row))
    held = pages_for(P + 2, P)
    assert pool.available_pages() == 8 - held
    state = pool.state()
    assert state.name == "swa" and state.num_pages == 8 and len(state.free_pages) == 8 - held
    pool.free_segment(row[P:], P)
    assert pool.available_pages() == 7
    before = pool.state()
    with pytest.raises(InvalidFree) as info:
        pool.free(row[P:])
    assert info.value.slots == tuple(row[P:]) and pool.state() == before
    pool.free([row[0]])
    assert sorted(pool.state().free_pages) == list(range(1, 9))


def test_pool_free_group():
    pool = PoolAllocator(16, 4)
    row = pool.alloc_extend([0], [8], [-1]).tolist()
    pool.free_group_begin()
    pool.free(row[:4])
    assert pool.available_pages() == 2 and len(pool.state().pending_pages) == 1
    with pytest.raises(InvalidFree):
        pool.free([row[3]])
    with pytest.raises(InvalidFree, match="do not nest"):
        pool.free_group_begin()
    pool.free(row[4:])
    pool.free_group_end()
    assert pool.available_pages() == 4 and pool.state().pending_pages == ()


# -- the reference on CUDA ----------------------------------------------------------------------

def extend_decode_free(device: str) -> HybridAllocator:
    allocator = hybrid(4, 16, 8, device=device)
    first = allocator.alloc_extend([0], [10], [-1])
    assert first.device.type == torch.device(device).type
    first = first.tolist()
    for seq_len in range(11, 14):
        first += allocator.alloc_decode([seq_len], [first[-1]]).tolist()
    second = allocator.alloc_extend_swa_tail(0, 14, -1, 6).tolist()
    batch = allocator.alloc_extend([13, 14], [15, 16], [first[-1], second[-1]]).tolist()
    first += batch[:2]
    second += batch[2:]
    allocator.free_swa_segment(first[:8], 0)
    assert_clean(allocator, held(first, swa_live_from=8),
                 held(second, swa_live_from=8))
    allocator.free_group_begin()
    allocator.free_full_segment(first[:8], 0)
    allocator.free_segment(first[8:], 8)
    allocator.free_group_end()
    allocator.free_full_segment(second[:8], 0)
    allocator.free(second[8:])
    assert translate(allocator, [-1]) == [-1]
    return allocator


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reference_runs_on_cuda():
    on_cuda = extend_decode_free("cuda")
    assert on_cuda.state() == extend_decode_free("cpu").state()
    assert_clean(on_cuda)
    assert sorted(on_cuda.state().full.free_pages) == list(range(1, 17))


def test_extend_decode_free_sequence_on_cpu():
    # the same sequence the CUDA test runs, so it is checked on every machine
    assert_clean(extend_decode_free("cpu"))
