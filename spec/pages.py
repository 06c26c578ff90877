"""Page arithmetic [PAGE-1 .. PAGE-4].

Every pool is cut into pages of `page_size` slots; positions of one request are laid
on pages so that a position's offset inside its page equals the slot's offset inside
its page (PAGE-3). The functions here are the whole of the arithmetic the allocator
and the window eviction use. Contracts are PEP 316 docstrings that `crosshair check`
verifies.
"""

from dataclasses import dataclass

from .notation import Position


def floor_page(x: int, page_size: int) -> int:
    """[PAGE-1] The largest multiple of `page_size` that is <= x.

    pre: page_size >= 1
    pre: x >= 0
    post: __return__ % page_size == 0
    post: __return__ <= x < __return__ + page_size
    """
    return x // page_size * page_size


def ceil_page(x: int, page_size: int) -> int:
    """[PAGE-1] The smallest multiple of `page_size` that is >= x.

    pre: page_size >= 1
    pre: x >= 0
    post: __return__ % page_size == 0
    post: __return__ - page_size < x <= __return__
    """
    return (x + page_size - 1) // page_size * page_size


def pages_for(tokens: int, page_size: int) -> int:
    """[PAGE-1] How many pages hold `tokens` tokens laid from a page start.

    pre: page_size >= 1
    pre: tokens >= 0
    post: __return__ * page_size == ceil_page(tokens, page_size)
    """
    return ceil_page(tokens, page_size) // page_size


def new_pages_for_extend(prefix_len: Position, seq_len: Position, page_size: int) -> int:
    """[PAGE-2] Pages a request needs to grow from `prefix_len` to `seq_len` tokens:
    its prefix already holds `pages_for(prefix_len)` pages (the last one maybe partial).
    SGLang: `get_num_new_pages(seq_lens, page_size, prefix_lens)`.

    pre: page_size >= 1
    pre: 0 <= prefix_len <= seq_len
    post: __return__ >= 0
    post: __return__ * page_size <= seq_len - prefix_len + page_size - 1
    """
    return pages_for(seq_len, page_size) - pages_for(prefix_len, page_size)


def new_pages_for_decode(seq_len: Position, page_size: int) -> int:
    """[PAGE-2] Pages a decode step that grows a request to `seq_len` tokens needs: one
    exactly when the new token is the first of a page. SGLang's decode form
    `seq_len % page_size == 1` is this for page_size > 1.

    pre: page_size >= 1
    pre: seq_len >= 1
    post: __return__ == new_pages_for_extend(seq_len - 1, seq_len, page_size)
    """
    return 1 if (seq_len - 1) % page_size == 0 else 0


@dataclass(frozen=True)
class ExtendPlacement:
    """[PAGE-3] Where the `seq_len - prefix_len` new tokens of one request go, in three
    phases (SGLang's `alloc_extend_naive`)."""

    in_partial_page: int
    """Phase 1: tokens that fill the prefix's last, partial page, at `last_loc + 1 + i`."""
    on_whole_pages: int
    """Phase 2: tokens on whole new pages (a multiple of page_size)."""
    on_last_page: int
    """Phase 3: tokens at the start of one more new page (fewer than page_size)."""
    new_pages: int
    """Pages taken from the free list: phase 2's pages plus phase 3's one."""


def extend_placement(prefix_len: Position, seq_len: Position, page_size: int) -> ExtendPlacement:
    """[PAGE-3] Split an extend into its three phases.

    pre: page_size >= 1
    pre: 0 <= prefix_len <= seq_len
    post: __return__.in_partial_page + __return__.on_whole_pages + __return__.on_last_page == seq_len - prefix_len
    post: __return__.on_whole_pages % page_size == 0
    post: 0 <= __return__.on_last_page < page_size
    post: __return__.in_partial_page < page_size
    post: __return__.new_pages == new_pages_for_extend(prefix_len, seq_len, page_size)
    """
    in_partial_page = min(seq_len, ceil_page(prefix_len, page_size)) - prefix_len
    # Whole pages start where the prefix's last page ends; none if seq_len ends inside it.
    on_whole_pages = max(0, floor_page(seq_len, page_size) - ceil_page(prefix_len, page_size))
    on_last_page = seq_len - prefix_len - in_partial_page - on_whole_pages
    new_pages = on_whole_pages // page_size + (1 if on_last_page > 0 else 0)
    return ExtendPlacement(in_partial_page, on_whole_pages, on_last_page, new_pages)


def slot_offset_matches(slot: int, position: Position, page_size: int) -> bool:
    """[PAGE-4] A slot may hold a position only at the same offset inside its page; this
    is what lets one page of the full pool map onto one page of the SWA pool (MAP-3).

    pre: page_size >= 1
    pre: slot >= 0 and position >= 0
    """
    return slot % page_size == position % page_size
