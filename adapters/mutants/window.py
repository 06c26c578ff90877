"""Window eviction bugs (WIN-2, WIN-3): the frontier below which a request's SWA KV is
freed, computed wrong."""

from kvspec.reference.components import free_swa_out_of_window_slots
from kvspec.reference.engine import Engine
from kvspec.spec.pages import ceil_page
from kvspec.spec.window import eviction_frontier

from .seeding import Mutant, Run, engine_with_frontier, with_names

frontier_rounded_up = with_names(eviction_frontier, floor_page=ceil_page)  # BUG: floor_page


class FRONTIER_INTO_WINDOW(Mutant, slug="frontier-into-window", engine=engine_with_frontier(frontier_rounded_up)):
    """Window eviction rounds the new cursor up to a page instead of down (WIN-3 step 4):
    whenever the threshold `pre_len - retention` is not on a page boundary the request
    frees one page too many, and that page holds positions of its window. Bug class 9 of
    the SGLang digest (evicting into the live window).

    A decode step shows it as I8 when `W + P - 2 > ceil_page(max(W, P))` (P = 4: W % 4 is
    0 or 3); a prefill checkpoint shows it as I8 and, for any P >= 3, as I10 (the new
    leaf keeps fewer than W live tokens). At P = 1 it is the reference; at P = 2 it frees
    at most one token more, which only the decode step itself still reads: I8's check of
    the window that step read sees it (see DECODE_FRONTIER_ONE_TOKEN_LATE)."""

    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=4, window=7, interval=1)


def frontier_one_token_late(pre_len: int, *args, **kwargs):
    return eviction_frontier(pre_len + 1, *args, **kwargs)  # BUG: pre_len, not the new seq_len


class OneTokenLateDecodeEngine(Engine):
    decode = with_names(Engine.decode, free_swa_out_of_window_slots=with_names(
        free_swa_out_of_window_slots, eviction_frontier=frontier_one_token_late))


class DECODE_FRONTIER_ONE_TOKEN_LATE(Mutant, slug="decode-frontier-one-token-late",
                                     engine=OneTokenLateDecodeEngine):
    """The decode step's window eviction computes its threshold from the new `seq_len`
    instead of `pre_len = seq_len - 1`: it frees position `C - W` (P = 1; at P > 1 when
    that crosses a page), which the step itself still reads. After the step that position
    has left the window, so only I8's check of the window the step read sees it."""

    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=1, window=3, interval=4)


def window_only_retention(version: str, window: int, page_size: int) -> int:
    return window  # BUG: sglang-0.5.23 retains ceil_page(max(window, page_size))


frontier_without_margin = with_names(eviction_frontier, retention=window_only_retention)


class MISSING_PAGE_MARGIN(Mutant, slug="missing-page-margin", engine=engine_with_frontier(frontier_without_margin)):
    """Window eviction retains `W` tokens below `pre_len` instead of `ceil_page(max(W, P))`
    (WIN-2) while sharing prefixes: the threshold `pre_len - W` of SGLang's
    `SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN`, which 0.5.23 replaced by rounding the window up
    to a page (bug class 2 of the SGLang digest). The window of the next token stays live
    (no I8), but when `1 <= W % P <= P - 2` the floored cursor leaves the leaf a checkpoint
    inserts fewer than `W` live SWA tokens: no later request can match the prefix."""

    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)


def unfloored(position: int, page_size: int) -> int:
    return position  # BUG: floor_page(position, page_size)


frontier_unaligned = with_names(eviction_frontier, floor_page=unfloored)


class UnalignedDecodeEvictionEngine(Engine):
    decode = with_names(Engine.decode, free_swa_out_of_window_slots=with_names(
        free_swa_out_of_window_slots, eviction_frontier=frontier_unaligned))


class UNALIGNED_CURSOR(Mutant, slug="unaligned-cursor", engine=UnalignedDecodeEvictionEngine):
    """The decode step's window eviction sets `swa_evicted_seqlen` to the raw threshold
    `pre_len - retention`, not floored to a page (WIN-3 step 4; SGLang's
    `if P > 1: new = floorP(new)` left out): the cursor splits a page between the dead
    and the live range, and the page-granular segment free releases the whole SWA page,
    live positions above the cursor included (I5 reports those alongside). Bug class 5
    of the SGLang digest.

    Seeded in the decode path only. The same line left out of the shared frontier also
    misaligns each prefill checkpoint, where the reference tree's own assertion ("rebuilt
    SWA value has unmapped slots") fires inside the step; a checkpoint is a shorter
    counterexample than a decode, so the shrinker ends on that crash, not on I6."""

    clause, invariant_class = "I6", "alignment"
    exposed_by = Run(page_size=2, window=5, interval=1)
