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
class ReleaseSegment:
    """[LIFE-5] One row segment a release frees."""

    start: Position
    end: Position
    with_swa: bool
    """Free full and SWA KV; False: the SWA KV is already released, free the full side only."""


def release_segments(cache_protected_len: Position, swa_evicted_seqlen: Position, owned: Position,
                     kv_allocated_len: Position, page_size: int) -> list[ReleaseSegment]:
    """[LIFE-5] What a release frees: what the request owns, `[cache_protected_len,
    owned)`, and what was allocated past it, from `ceil_page(owned)` to
    `kv_allocated_len` (the page holding `owned - 1` goes with the owned part). Each is
    split at the first position with live SWA, `max(e, cache_protected_len)`: below it
    only the full side is freed.

    pre: page_size >= 1
    pre: cache_protected_len % page_size == 0 and swa_evicted_seqlen % page_size == 0
    pre: 0 <= cache_protected_len <= owned <= kv_allocated_len
    post: all(s.start < s.end and s.start % page_size == 0 for s in __return__)
    post: all(a.end <= b.start for a, b in zip(__return__, __return__[1:]))
    post: all(s.with_swa == (s.start >= max(swa_evicted_seqlen, cache_protected_len)) for s in __return__)
    post: sum(s.end - s.start for s in __return__) == owned - cache_protected_len + max(0, kv_allocated_len - ceil_page(owned, page_size))
    """
    live_from = max(swa_evicted_seqlen, cache_protected_len)
    segments = []
    for start, end in ((cache_protected_len, owned), (ceil_page(owned, page_size), kv_allocated_len)):
        dead_end = min(max(start, live_from), end)
        if dead_end > start:
            segments.append(ReleaseSegment(start, dead_end, with_swa=False))
        if end > dead_end:
            segments.append(ReleaseSegment(dead_end, end, with_swa=True))
    return segments


def pages_to_evict(needed_pages: int, free_pages: int) -> int:
    """[LIFE-7] An allocation that finds a pool short asks the prefix cache to evict the
    shortfall, in pages.

    pre: needed_pages >= 0 and free_pages >= 0
    post: __return__ == max(0, needed_pages - free_pages)
    """
    return max(0, needed_pages - free_pages)
