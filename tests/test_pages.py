"""[PAGE-1 .. PAGE-4, ALLOC-2, ALLOC-3, MODEL-4] The page arithmetic of spec/pages.py and
spec/allocator.py against brute force over small ranges: every closed form is compared
with a count of the pages that positions actually touch."""

import pytest

from kvspec.spec.allocator import (
    new_pages_available,
    swa_tail_split,
    swa_tail_starts_on_page,
    validate_pool_config,
)
from kvspec.spec.pages import (
    ceil_page,
    extend_placement,
    floor_page,
    new_pages_for_decode,
    new_pages_for_extend,
    pages_for,
    slot_offset_matches,
)

PAGE_SIZES = range(1, 9)
LENGTHS = range(0, 41)


def pages_touched(positions, page_size: int) -> set[int]:
    """The pages a run of positions laid from position 0 lies on."""
    return {position // page_size for position in positions}


def brute_new_pages(prefix_len: int, seq_len: int, page_size: int) -> int:
    """Distinct pages touched by positions prefix..seq-1 that the prefix does not already hold."""
    prefix_pages = pages_touched(range(prefix_len), page_size)
    return len(pages_touched(range(prefix_len, seq_len), page_size) - prefix_pages)


# -- [PAGE-1] floor / ceil / pages_for -------------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_floor_and_ceil_page_match_the_nearest_multiples(page_size):
    for x in LENGTHS:
        multiples = [m for m in range(0, x + 2 * page_size) if m % page_size == 0]
        assert floor_page(x, page_size) == max(m for m in multiples if m <= x)
        assert ceil_page(x, page_size) == min(m for m in multiples if m >= x)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_pages_for_counts_the_pages_positions_touch(page_size):
    for tokens in LENGTHS:
        assert pages_for(tokens, page_size) == len(pages_touched(range(tokens), page_size))


def test_page_helpers_on_named_values():
    assert (floor_page(30, 4), ceil_page(30, 4), pages_for(30, 4)) == (28, 32, 8)
    assert (floor_page(32, 4), ceil_page(32, 4), pages_for(32, 4)) == (32, 32, 8)
    assert (floor_page(0, 4), ceil_page(0, 4), pages_for(0, 4)) == (0, 0, 0)
    assert (floor_page(7, 1), ceil_page(7, 1), pages_for(7, 1)) == (7, 7, 7)


# -- [PAGE-2] new pages for an extend and a decode step -------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_new_pages_for_extend_counts_pages_not_held_by_the_prefix(page_size):
    for seq_len in LENGTHS:
        for prefix_len in range(seq_len + 1):
            assert new_pages_for_extend(prefix_len, seq_len, page_size) == \
                brute_new_pages(prefix_len, seq_len, page_size), (prefix_len, seq_len)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_new_pages_for_decode_is_one_exactly_on_a_page_start(page_size):
    for seq_len in range(1, 41):
        expected = brute_new_pages(seq_len - 1, seq_len, page_size)
        assert new_pages_for_decode(seq_len, page_size) == expected
        assert expected == (1 if (seq_len - 1) % page_size == 0 else 0)
        if page_size > 1:  # SGLang's decode form of get_num_new_pages
            assert expected == (1 if seq_len % page_size == 1 else 0)


# -- [PAGE-3] the three phases of an extend ------------------------------------------------

@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_extend_placement_phases_match_a_position_by_position_layout(page_size):
    for seq_len in LENGTHS:
        for prefix_len in range(seq_len + 1):
            plan = extend_placement(prefix_len, seq_len, page_size)
            prefix_pages = pages_touched(range(prefix_len), page_size)
            new = range(prefix_len, seq_len)
            in_partial = [p for p in new if p // page_size in prefix_pages]
            fresh = [p for p in new if p // page_size not in prefix_pages]
            last_page = (seq_len - 1) // page_size
            on_last = [p for p in fresh if p // page_size == last_page and seq_len % page_size != 0]
            on_whole = [p for p in fresh if p not in on_last]
            context = (prefix_len, seq_len, page_size)
            assert plan.in_partial_page == len(in_partial), context
            assert plan.on_whole_pages == len(on_whole), context
            assert plan.on_last_page == len(on_last), context
            assert plan.in_partial_page + plan.on_whole_pages + plan.on_last_page == seq_len - prefix_len
            assert plan.on_whole_pages % page_size == 0
            assert 0 <= plan.on_last_page < page_size and plan.in_partial_page < page_size
            assert plan.new_pages == len(pages_touched(fresh, page_size)) == \
                new_pages_for_extend(prefix_len, seq_len, page_size), context


def test_extend_placement_named_example():
    # prefix 5, seq 14, page 4: positions 5..7 fill the prefix's page, 8..11 one whole
    # page, 12..13 start one more page.
    plan = extend_placement(5, 14, 4)
    assert (plan.in_partial_page, plan.on_whole_pages, plan.on_last_page, plan.new_pages) == (3, 4, 2, 2)
    # an extend that ends inside the prefix's last page takes no page
    plan = extend_placement(5, 7, 4)
    assert (plan.in_partial_page, plan.on_whole_pages, plan.on_last_page, plan.new_pages) == (2, 0, 0, 0)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_slot_offset_matches_compares_in_page_offsets(page_size):
    for slot in range(3 * page_size + 2):
        for position in range(3 * page_size + 2):
            assert slot_offset_matches(slot, position, page_size) == \
                ((slot - position) % page_size == 0)


# -- [ALLOC-2] the capacity check ---------------------------------------------------------

def test_new_pages_available_needs_both_pools():
    for full_need in range(4):
        for swa_need in range(4):
            for full_free in range(4):
                for swa_free in range(4):
                    assert new_pages_available(full_need, swa_need, full_free, swa_free) == \
                        (full_need <= full_free and swa_need <= swa_free)
    assert not new_pages_available(1, 3, 5, 2), "the SWA pool alone being short must fail the check"
    assert not new_pages_available(3, 1, 2, 5), "the full pool alone being short must fail the check"


# -- [ALLOC-3] the PD-decode SWA tail split -----------------------------------------------

def pd_swa_tail_len(fill_len: int, window: int, page_size: int, decode_radix: bool) -> int:
    """SGLang's `_swa_tail_len` (disaggregation/decode.py), written out for the examples."""
    window_start = fill_len - 1 - max(window, page_size) if decode_radix else fill_len - window
    return fill_len - floor_page(max(0, window_start), page_size)


def test_swa_tail_split_worked_example_without_prefix():
    # W=8, P=4, fill=30, no decode radix: ws = floor_page(30 - 8) = 20, tail 10.
    tail = pd_swa_tail_len(30, window=8, page_size=4, decode_radix=False)
    assert tail == 10
    split = swa_tail_split(prefix_len=0, seq_len=30, swa_tail_len=tail, page_size=4)
    assert (split.full_pages, split.swa_pages, split.head_len) == (8, 3, 20)


def test_swa_tail_split_worked_example_with_l1_prefix_and_decode_radix():
    # Same request with decode radix and a 12-token L1 prefix:
    # ws = floor_page(30 - 1 - max(8, 4)) = floor_page(21) = 20, tail 10, head [12, 20).
    tail = pd_swa_tail_len(30, window=8, page_size=4, decode_radix=True)
    assert tail == 10
    split = swa_tail_split(prefix_len=12, seq_len=30, swa_tail_len=tail, page_size=4)
    assert (split.full_pages, split.swa_pages, split.head_len) == (8 - 3, 3, 8)


@pytest.mark.parametrize("page_size", range(1, 6))
def test_swa_tail_split_against_brute_force(page_size):
    for seq_len in range(0, 25):
        for prefix_len in range(seq_len + 1):
            for tail in range(seq_len - prefix_len + 1):
                starts_on_page = (seq_len - tail) % page_size == 0
                assert swa_tail_starts_on_page(seq_len, tail, page_size) == starts_on_page
                if not starts_on_page:
                    continue
                split = swa_tail_split(prefix_len, seq_len, tail, page_size)
                assert split.full_pages == brute_new_pages(prefix_len, seq_len, page_size)
                # the tail is laid as a fresh sequence from a page start
                assert split.swa_pages == len(pages_touched(range(tail), page_size))
                # and, starting on a page boundary, it covers the same number of full pages
                assert split.swa_pages == len(pages_touched(range(seq_len - tail, seq_len), page_size))
                assert split.swa_pages <= split.full_pages
                assert split.head_len == seq_len - prefix_len - tail


# -- [MODEL-4] pool configuration ---------------------------------------------------------

def test_validate_pool_config_accepts_exactly_the_valid_configs():
    for page_size in range(0, 5):
        for size_full in range(0, 13):
            for size_swa in range(0, 13):
                valid = (page_size >= 1 and size_full >= page_size and size_swa >= page_size
                         and size_full % page_size == 0 and size_swa % page_size == 0)
                problems = validate_pool_config(size_full, size_swa, page_size)
                assert (problems == []) == valid, (size_full, size_swa, page_size, problems)


def test_validate_pool_config_page_size_zero():
    problems = validate_pool_config(8, 8, 0)
    assert len(problems) == 1
    assert "page_size must be >= 1" in problems[0] and "got 0" in problems[0]
    assert "use 1 for a token allocator" in problems[0]


def test_validate_pool_config_sizes_not_multiples_of_the_page():
    problems = validate_pool_config(10, 8, 4)
    assert problems == ["size_full must be a multiple of page_size 4 (got 10; use 8 or 12)"]
    problems = validate_pool_config(8, 13, 4)
    assert problems == ["size_swa must be a multiple of page_size 4 (got 13; use 12 or 16)"]
    assert len(validate_pool_config(10, 13, 4)) == 2, "each bad size gets its own sentence"


def test_validate_pool_config_sizes_smaller_than_a_page():
    problems = validate_pool_config(2, 8, 4)
    assert problems == ["size_full must hold at least one page of 4 slots (got 2)"]
    problems = validate_pool_config(8, 0, 4)
    assert problems == ["size_swa must hold at least one page of 4 slots (got 0)"]
