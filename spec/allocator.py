"""The hybrid full/SWA allocator's decisions [ALLOC-1 .. ALLOC-3].

Two pools of the same page size: the full pool holds KV for every token, the SWA pool
only for tokens a sliding-window layer can still see. An allocation asks each pool for
its own number of pages; `new_pages_available` is the one capacity check (ALLOC-2), and
the PD-decode tail split (ALLOC-3) says how many pages each pool gives when only the
last `swa_tail_len` tokens need SWA KV.
"""

from dataclasses import dataclass

from .notation import Position
from .pages import new_pages_for_extend, pages_for


def validate_pool_config(size_full: int, size_swa: int, page_size: int) -> list[str]:
    """[MODEL-4] What is wrong with a hybrid pool configuration, as sentences that say
    how to fix it; empty when it is valid.

    post: (__return__ == []) == (page_size >= 1 and size_full >= page_size and size_swa >= page_size and size_full % page_size == 0 and size_swa % page_size == 0)
    """
    problems = []
    if page_size < 1:
        problems.append(f"page_size must be >= 1 (got {page_size}); use 1 for a token allocator")
        return problems
    for name, size in (("size_full", size_full), ("size_swa", size_swa)):
        if size < page_size:
            problems.append(f"{name} must hold at least one page of {page_size} slots (got {size})")
        elif size % page_size != 0:
            problems.append(f"{name} must be a multiple of page_size {page_size} (got {size}; "
                            f"use {size // page_size * page_size} or {(size // page_size + 1) * page_size})")
    return problems


def new_pages_available(num_full_pages: int, num_swa_pages: int,
                        full_free_pages: int, swa_free_pages: int) -> bool:
    """[ALLOC-2] The single capacity check of the hybrid allocator: both pools must
    have their own number of pages free. (Checking one pool only is a bug: the other
    sub-allocator then fails half-way.)

    pre: num_full_pages >= 0 and num_swa_pages >= 0
    pre: full_free_pages >= 0 and swa_free_pages >= 0
    post: __return__ == (num_full_pages <= full_free_pages and num_swa_pages <= swa_free_pages)
    """
    return num_full_pages <= full_free_pages and num_swa_pages <= swa_free_pages


@dataclass(frozen=True)
class SwaTailSplit:
    """[ALLOC-3] Pages each pool gives to a PD-decode pre-allocation with an SWA tail."""

    full_pages: int
    """New full pages for the whole extend `[prefix_len, seq_len)`."""
    swa_pages: int
    """SWA pages for the tail alone, laid as a fresh sequence from a page start."""
    head_len: int
    """Extended tokens before the tail: they get full KV only (mapping 0)."""


def swa_tail_split(prefix_len: Position, seq_len: Position, swa_tail_len: int,
                   page_size: int) -> SwaTailSplit:
    """[ALLOC-3] Split a PD-decode pre-allocation: the full pool extends from
    `prefix_len` to `seq_len`; the SWA pool gives pages for the last `swa_tail_len`
    tokens only, each pool its own count.

    The tail must start on a page boundary: only then does each full page of the tail
    map onto one SWA page at the same offsets (MAP-3).

    pre: page_size >= 1
    pre: 0 <= prefix_len <= seq_len
    pre: 0 <= swa_tail_len <= seq_len - prefix_len
    pre: (seq_len - swa_tail_len) % page_size == 0
    post: __return__.full_pages == new_pages_for_extend(prefix_len, seq_len, page_size)
    post: __return__.swa_pages * page_size >= swa_tail_len > (__return__.swa_pages - 1) * page_size
    post: __return__.swa_pages <= __return__.full_pages
    post: __return__.head_len + swa_tail_len == seq_len - prefix_len
    """
    return SwaTailSplit(
        full_pages=new_pages_for_extend(prefix_len, seq_len, page_size),
        swa_pages=pages_for(swa_tail_len, page_size),
        head_len=seq_len - prefix_len - swa_tail_len,
    )


def swa_tail_starts_on_page(seq_len: Position, swa_tail_len: int, page_size: int) -> bool:
    """[ALLOC-3] The precondition of `swa_tail_split`, for callers to check first.

    pre: page_size >= 1
    pre: 0 <= swa_tail_len <= seq_len
    """
    return (seq_len - swa_tail_len) % page_size == 0
