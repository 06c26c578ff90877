"""The hybrid full/SWA allocator's decisions [ALLOC-1 .. ALLOC-3].

Two pools of the same page size: the full pool holds KV for every token, the SWA pool
only for tokens a sliding-window layer can still see. An allocation asks each pool for
its own number of pages; `new_pages_available` is the one capacity check (ALLOC-2), and
the PD-decode tail split (ALLOC-3) says how many pages each pool gives when only the
last `swa_tail_len` tokens need SWA KV.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .notation import Position
from .outcomes import Name, OutOfMemory
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


class AllocatorOperation(Name):
    """[ALLOC-1] The operations of a hybrid allocator, as traces name them."""

    ALLOC = "alloc"
    ALLOC_EXTEND = "alloc_extend"
    ALLOC_DECODE = "alloc_decode"
    ALLOC_EXTEND_SWA_TAIL = "alloc_extend_swa_tail"
    FREE = "free"
    FREE_SWA = "free_swa"
    FREE_FULL = "free_full"
    FREE_SEGMENT = "free_segment"
    FREE_SWA_SEGMENT = "free_swa_segment"
    FREE_FULL_SEGMENT = "free_full_segment"
    FREE_GROUP_BEGIN = "free_group_begin"
    FREE_GROUP_END = "free_group_end"
    TRANSLATE = "translate"
    CLEAR = "clear"


ALLOCATIONS = frozenset({AllocatorOperation.ALLOC, AllocatorOperation.ALLOC_EXTEND, AllocatorOperation.ALLOC_DECODE,
                         AllocatorOperation.ALLOC_EXTEND_SWA_TAIL})
"""[ALLOC-1] The calls that return the new tokens' full slots, a list of ints, or OutOfMemory."""


class HybridAllocatorOperations(Protocol):
    """[ALLOC-1] The operations of a hybrid full/SWA allocator. Slots are full slots;
    an allocation returns the new tokens' full slots in position order, or OutOfMemory
    (ALLOC-4); a free of what is not held raises InvalidFree (ALLOC-6)."""

    def alloc(self, num_tokens: int) -> "list[int] | OutOfMemory":
        """page_size 1: `num_tokens` slots in each pool, paired in the mapping."""

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int],
                     last_loc: Sequence[int]) -> "list[int] | OutOfMemory":
        """Grow each request from prefix_len to seq_len tokens in both pools (PAGE-3)."""

    def alloc_decode(self, seq_lens: Sequence[int], last_loc: Sequence[int]) -> "list[int] | OutOfMemory":
        """One slot per request in both pools, for position seq_len - 1."""

    def alloc_extend_swa_tail(self, prefix_len: int, seq_len: int, last_loc: int,
                              swa_tail_len: int) -> "list[int] | OutOfMemory":
        """Full slots for `[prefix_len, seq_len)`, SWA slots for the last swa_tail_len (ALLOC-3)."""

    def free(self, slots: Sequence[int]) -> None:
        """Free full slots and their SWA peers, page-granular."""

    def free_segment(self, slots: Sequence[int], start_pos: int) -> None:
        """`free` of a row segment starting at page-aligned position start_pos."""

    def free_swa(self, slots: Sequence[int]) -> None:
        """Free only the SWA peers (MAP-2)."""

    def free_swa_segment(self, slots: Sequence[int], start_pos: int) -> None:
        """Free only the SWA peers of a row segment; every peer must be live (MAP-2)."""

    def free_full(self, slots: Sequence[int]) -> None:
        """Free full slots whose SWA peers are already released (MAP-2)."""

    def free_full_segment(self, slots: Sequence[int], start_pos: int) -> None:
        """`free_full` of a row segment starting at page-aligned position start_pos."""

    def free_group_begin(self) -> None:
        """Collect frees until free_group_end (I16)."""

    def free_group_end(self) -> None:
        """Release what the group collected (I16)."""

    def translate(self, full_slots: Sequence[int]) -> list[int]:
        """The SWA peers of full slots: 0 where none, -1 for -1 (MAP-1)."""

    def clear(self) -> None:
        """Every page free, every mapping entry 0 but the sentinel."""
