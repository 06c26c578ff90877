"""Decisions of the request lifecycle [LIFE-3 .. LIFE-7], as pure functions.

The engine's operations (admit, prefill chunk, decode step, finish, abort, retract,
PD-decode pre-allocation, evict) are described in 06-lifecycle.md; these are the
arithmetic they rest on, so that an implementation and the reference compute the same
boundaries.
"""

from dataclasses import dataclass

from .notation import Position
from .pages import ceil_page, floor_page


def admission_match_limit(num_tokens: int) -> int:
    """[LIFE-3] A new request may reuse a cached prefix of at most `num_tokens - 1`
    tokens: the last token is always computed, for its logits.

    pre: num_tokens >= 1
    post: 0 <= __return__ < num_tokens
    """
    return num_tokens - 1


def insert_end(up_to: Position, page_size: int) -> Position:
    """[LIFE-4] A checkpoint caches whole pages only: `[0, floor_page(up_to))`; the rest
    stays the request's own.

    pre: up_to >= 0 and page_size >= 1
    post: __return__ % page_size == 0 and up_to - page_size < __return__ <= up_to
    """
    return floor_page(up_to, page_size)


@dataclass(frozen=True)
class ReleasePlan:
    """[LIFE-5] How a released request's own KV is freed."""

    full_only: tuple[Position, Position]
    """Positions whose SWA KV the request already released: free the full side only."""
    full_and_swa: tuple[Position, Position]
    """Positions with both sides live: free both."""
    over_allocated: tuple[Position, Position]
    """Pages allocated past what the request owns (after a stop): free both."""


def release_plan(cache_protected_len: Position, swa_evicted_seqlen: Position, owned: Position,
                 kv_allocated_len: Position, page_size: int) -> ReleasePlan:
    """[LIFE-5] Split the request's private range `[cache_protected_len, owned)` at its
    SWA cursor (the dead part is freed full-only), and free whole pages from
    `ceil_page(owned)` to `kv_allocated_len` as over-allocation. The three ranges are
    disjoint, each non-empty one starts on a page boundary, and together they cover every page the request holds.

    pre: page_size >= 1
    pre: cache_protected_len % page_size == 0 and swa_evicted_seqlen % page_size == 0
    pre: 0 <= cache_protected_len <= owned <= kv_allocated_len
    post: __return__.full_only[0] == cache_protected_len
    post: __return__.full_only[1] == __return__.full_and_swa[0]
    post: __return__.full_and_swa[1] <= __return__.over_allocated[0] or __return__.over_allocated[0] == __return__.over_allocated[1]
    post: __return__.full_and_swa[0] == __return__.full_and_swa[1] or __return__.full_and_swa[0] % page_size == 0
    post: __return__.over_allocated[0] % page_size == 0
    """
    live_from = max(swa_evicted_seqlen, cache_protected_len)
    dead_end = min(live_from, owned)
    over = ceil_page(owned, page_size)
    return ReleasePlan((cache_protected_len, dead_end), (dead_end, owned),
                       (over, max(over, kv_allocated_len)))


def pages_to_evict(needed_pages: int, free_pages: int) -> int:
    """[LIFE-7] An allocation that finds a pool short asks the prefix cache to evict the
    shortfall, in pages.

    pre: needed_pages >= 0 and free_pages >= 0
    post: __return__ == max(0, needed_pages - free_pages)
    """
    return max(0, needed_pages - free_pages)
