"""Window eviction bugs (WIN-2 .. WIN-6): the frontier below which a request's SWA KV is
freed computed wrong, an eviction that never runs, a cursor not set, and a PD-decode
admission checkpointed over a tail too short for it."""

from kvspec.conformance.harness.declarations import Run
from kvspec.reference.components import SWAComponent
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.pages import ceil_page
from kvspec.spec.window import decode_eviction_due, eviction_frontier, retention

from .seeding import (
    Mutant,
    engine_with_decode_frontier,
    engine_with_frontier,
    engine_with_swa_component,
    with_names,
)

frontier_rounded_up = with_names(eviction_frontier, floor_page=ceil_page)  # BUG: floor_page


class FRONTIER_INTO_WINDOW(Mutant, slug="frontier-into-window", engine=engine_with_frontier(frontier_rounded_up)):
    """Window eviction rounds the new cursor up to a page instead of down (WIN-3 step 4):
    whenever the threshold `pre_len - retention` is not on a page boundary the request
    frees one page too many, and that page holds positions of its window. See
    docs/engines/sglang.md, bug class 9 (evicting into the live window).

    A decode step shows it as I8 when `W + P - 2 > ceil_page(max(W, P))` (P = 4: W % 4 is
    0 or 3); a prefill checkpoint shows it as I8 and, for any P >= 3, as I10 (the new
    leaf keeps fewer than W live tokens). At P = 1 it is the reference; at P = 2 it frees
    at most one token more, which only the decode step itself still reads: I8's check of
    the window that step read sees it (see DECODE_FRONTIER_ONE_TOKEN_LATE)."""

    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=4, window=7, interval=1)
    reverts = ("docs/engines/sglang.md, bug class 9: the cursor floored to a page, "
               "`if P > 1: new = floorP(new)` in free_swa_out_of_window_slots (mem_cache/common.py:75-138)")


def frontier_one_token_late(pre_len: int, *args, **kwargs):
    return eviction_frontier(pre_len + 1, *args, **kwargs)  # BUG: pre_len, not the new seq_len


class DECODE_FRONTIER_ONE_TOKEN_LATE(Mutant, slug="decode-frontier-one-token-late",
                                     engine=engine_with_decode_frontier(frontier_one_token_late)):
    """The decode step's window eviction computes its threshold from the new `seq_len`
    instead of `pre_len = seq_len - 1`: it frees position `C - W` (P = 1; at P > 1 when
    that crosses a page), which the step itself still reads. After the step that position
    has left the window, so only I8's check of the window the step read sees it."""

    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=1, window=3, interval=4)
    reverts = ("docs/engines/sglang.md, bug class 9: the decode eviction's pre_len = seqlen - 1 "
               "(_evict_swa(req, seqlen - 1), managers/schedule_batch.py:4047-4129)")


def window_only_retention(version: str, window: int, page_size: int) -> int:
    return window  # BUG: sglang-0.5.23 retains ceil_page(max(window, page_size))


frontier_without_margin = with_names(eviction_frontier, retention=window_only_retention)


class MISSING_PAGE_MARGIN(Mutant, slug="missing-page-margin", engine=engine_with_frontier(frontier_without_margin)):
    """Window eviction retains `W` tokens below `pre_len` instead of `ceil_page(max(W, P))`
    (WIN-2) while sharing prefixes: the threshold `pre_len - W` of SGLang's
    `SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN`, which 0.5.23 replaced by rounding the window up
    to a page (docs/engines/sglang.md, bug class 2). The window of the next token stays live
    (no I8), but when `1 <= W % P <= P - 2` the floored cursor leaves the leaf a checkpoint
    inserts fewer than `W` live SWA tokens: no later request can match the prefix."""

    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = ("docs/engines/sglang.md, bug class 2: SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN, "
               "whose threshold pre_len - W 0.5.23 replaced by pre_len - ceil_align(max(W, P), P)")


def unfloored(position: int, page_size: int) -> int:
    return position  # BUG: floor_page(position, page_size)


frontier_unaligned = with_names(eviction_frontier, floor_page=unfloored)


class UNALIGNED_CURSOR(Mutant, slug="unaligned-cursor", engine=engine_with_decode_frontier(frontier_unaligned)):
    """The decode step's window eviction sets `swa_evicted_seqlen` to the raw threshold
    `pre_len - retention`, not floored to a page (WIN-3 step 4; SGLang's
    `if P > 1: new = floorP(new)` left out): the cursor splits a page between the dead
    and the live range, and the page-granular segment free releases the whole SWA page,
    live positions above the cursor included (I5 reports those alongside). See
    docs/engines/sglang.md, bug class 5.

    Seeded in the decode path only. The same line left out of the shared frontier also
    misaligns each prefill checkpoint, where the reference tree's own assertion ("rebuilt
    SWA value has unmapped slots") fires inside the step; a checkpoint is a shorter
    counterexample than a decode, so the shrinker ends on that crash, not on I6."""

    clause, invariant_class = "I6", "alignment"
    exposed_by = Run(page_size=2, window=5, interval=1)
    reverts = ("docs/engines/sglang.md, bug class 5: the cursor floored to a page "
               "(mem_cache/common.py:127-128), asserted page aligned since (swa.py:437-439, common.py:183-186)")


def unrounded(position: int, page_size: int) -> int:
    return position  # BUG: ceil_page(position, page_size)


frontier_max_window_page = with_names(eviction_frontier, retention=with_names(retention, ceil_page=unrounded))


class FRONTIER_MAX_WINDOW_PAGE(Mutant, slug="frontier-max-window-page",
                               engine=engine_with_frontier(frontier_max_window_page)):
    """Window eviction retains `max(W, P)` tokens below `pre_len` instead of
    `ceil_page(max(W, P))` (WIN-2): the threshold `pre_len - max(W, P)` of the public-fork
    snapshots between the design doc and 0.5.23 ("subtracting at least one page keeps it
    below the insert boundary"). It never leaves an all-tombstone leaf, but when `W > P`
    and `W % P != 0` the floored cursor can leave the leaf a checkpoint inserts fewer
    than `W` live SWA tokens (P = 4, W = 6, key of 15 tokens: E = 12, e = 8): I10.

    When `W >= P` this is MISSING_PAGE_MARGIN's threshold `pre_len - W` exactly; the two
    differ only when `P > W`, where this one retains `P = ceil_page(max(W, P))` and is
    the reference (engine P=16 W=5), and MISSING_PAGE_MARGIN still retains `W`. When
    `W % P == 0` it is the reference too."""

    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = ("docs/engines/sglang.md, bug class 2: the intermediate threshold pre_len - max(W, P) "
               "(section 4.1), closed by 0.5.23's pre_len - ceil_align(max(W, P), P)")


class NoChunkReleaseSWAComponent(SWAComponent):
    def free_out_of_window_slots(self, request, pre_len: int, eviction_interval: int) -> None:
        pass  # BUG: the hook left the base component's no-op (SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS=0)


class NO_CHUNK_RELEASE(Mutant, slug="no-chunk-release", engine=engine_with_swa_component(NoChunkReleaseSWAComponent)):
    """A prefill checkpoint releases no SWA KV that slid out of the window before its
    insert (WIN-3, LIFE-4): the cursor stays where it was, so each chunk is inserted with
    live SWA on all of it, and a long prompt holds O(prompt) SWA slots instead of O(W)
    per chunk. Decode steps still evict. A chunk whose insert ends more than
    `ceil_page(max(W, P)) + P` tokens past the cursor publishes more live SWA than
    `eviction_span_bound` allows: I9. A bug under a policy with chunk release (the
    default); the policy itself without it (`chunk_release` off, WIN-4: the same engine
    conforms there, tests/test_chunk_release.py)."""

    clause, invariant_class = "I9", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = ("docs/engines/sglang.md, bug class 1: SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS, "
               "the out-of-window release inside checkpoint (unified_radix_cache.py:1211-1221)")


def eviction_due_from_allocated_len(seq_len: int, cursor: int, window: int, interval: int) -> bool:
    # BUG: measured from kv_allocated_len (seq_len - 1 before the step), not from the SWA cursor
    return decode_eviction_due(seq_len, seq_len - 1, window, interval)


class NeverEvictingDecodeEngine(TwoPoolEngine):
    decode = with_names(TwoPoolEngine.decode, decode_eviction_due=eviction_due_from_allocated_len)


class DECODE_EVICTION_NEVER(Mutant, slug="decode-eviction-never", engine=NeverEvictingDecodeEngine):
    """The decode trigger (WIN-4) compares the window's start `seq_len - 1 - W` with the
    request's allocated length instead of its SWA cursor, which it never reaches: decode
    window eviction never fires, and a decoding request's private SWA grows by one token
    per step. Once it holds more than `decode_window_bound` slots (from its third decode
    step on): I9. Prefill checkpoints still evict."""

    clause, invariant_class = "I9", "window-bound"
    exposed_by = Run(page_size=4, window=8, interval=1)


class PdCursorUnsetEngine(TwoPoolEngine):
    def pd_admit(self, rid, prompt, first_output):
        outcome = super().pd_admit(rid, prompt, first_output)
        if outcome is None:
            self.requests[rid].swa_evicted_seqlen = 0  # BUG: `= fill - tail` left out; the cursor keeps its 0
        return outcome


class PD_CURSOR_UNSET(Mutant, slug="pd-cursor-unset", engine=PdCursorUnsetEngine):
    """A PD-decode pre-allocation (LIFE-6) allocates SWA KV for the tail only but does not
    set the cursor to the tail's start, `fill - tail` (WIN-6): the head, whose full slots
    map to 0, looks SWA-live. As soon as the head is not empty (a prompt of more than
    `max(W, P) + P` tokens beyond the matched prefix), positions the request holds as
    live SWA map to no SWA slot: I5. (A later window eviction or release would free SWA
    peers the head never had; the reference refuses that with InvalidFree.)"""

    clause, invariant_class = "I5", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = ("docs/engines/sglang.md, bug class 3: req.kv.set_evicted_seqlen(SWA, fill - tail) after "
               "alloc_extend_swa_tail (disaggregation/decode.py:2435-2511)")


class PdCheckpointShortEngine(TwoPoolEngine):
    def pd_admit(self, rid, prompt, first_output):
        outcome = super().pd_admit(rid, prompt, first_output)
        if outcome is None and self.tree is not None and self.page_size > 1:
            # BUG: the received prompt checkpointed at once, over WIN-6's tail, which keeps
            # max(W, P) tokens before fill - 1 unrounded: a window short where 1 <= W % P <= P - 2
            self.checkpoint(self.requests[rid], len(prompt), finished=False)
        return outcome


class PD_CHECKPOINT_SHORT(Mutant, slug="pd-checkpoint-short", engine=PdCheckpointShortEngine):
    """A PD-decode admission (LIFE-6) that checkpoints the received prompt,
    `[0, floor_page(fill))`, at once, as SGLang does (SGL-9), over WIN-6's tail, whose start
    `floor_page(fill - 1 - max(W, P))` leaves fewer than W live tokens below the checkpoint's
    end wherever `pd_checkpoint_at_risk` says so (W > P, 1 <= W % P <= P - 2): the new leaf is
    unmatchable, I10. It reverts no fix: SGLang 0.5.23 still has it (SGL-11;
    disaggregation/decode.py:572-579, the tail's start, and decode_schedule_batch_mixin.py:
    119-122, process_prebuilt's checkpoint), whose intent, a complete window before the
    insert boundary, needs the tail rounded to a page. At the windows not at risk the same
    admission checkpoint conforms."""

    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
