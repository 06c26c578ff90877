"""Bugs of the reference scheduler (chapter 10, SCHED-2 .. SCHED-9), one per clause, seeded
into kvspec.reference.scheduler (and, where the bug lives in an allocation, into its
shared block pool or its state group): each is the class of a bug found in, or seeded
into, a real scheduler (TokenSpeed's, vLLM's) or memory manager, named in its docstring.

Each is an adapter of the scheduler tier alone (`scheduler P=.. W=..` runs; SCHED-9's
`scheduler+state P=.. W=..`).
"""

import torch

from kvspec.conformance.harness.declarations import Run
from kvspec.reference.block_pool_engine import BlockPoolEngine
from kvspec.reference.scheduler import ReferenceScheduler
from kvspec.reference.scheduler_state import StateGroup
from kvspec.spec.block_pool import NULL_BLOCK
from kvspec.spec.scheduler import PagePool, SchedulerView

from .seeding import Mutant

P4_W7 = Run(4, 7, scheduler=True)


class ChunkResultOneTokenShort(ReferenceScheduler):
    def result(self, rid, token):
        row = self.rows[rid]
        super().result(rid, token)
        request = self.engine.requests[rid]
        if token is None:  # BUG: an intermediate chunk's last token is not counted as computed
            request.computed = row.start + row.tokens - 1


class CHUNK_RESULT_ONE_TOKEN_SHORT(Mutant, slug="chunk-result-one-token-short", scheduler=ChunkResultOneTokenShort):
    """The result of a prefill chunk short of the prompt's end counts one token fewer as
    computed than the row computed, so the next chunk starts one token early and computes
    it again (its KV written twice; a position count off by one for every later row).
    The class of TokenSpeed's seeded `empty-result-not-landed` (a result without tokens
    handled apart) and of vLLM's `num_computed_tokens` corrections after a partial step."""

    clause, invariant_class = "SCHED-2", "scheduling"
    exposed_by = P4_W7


class WindowReleaseOneTokenEarly(ReferenceScheduler):
    def plan(self):
        for request in self.engine.requests.values():  # BUG: the window ends one token late
            self.engine.release_window(request, request.computed + 1)
        return super().plan()


class WINDOW_RELEASE_ONE_TOKEN_EARLY(Mutant, slug="scheduler-window-release-one-token-early",
                                     scheduler=WindowReleaseOneTokenEarly):
    """Each plan first releases every running request's window as if one more token were
    computed: where `p + 1 - W` is a page boundary, the page holding position `p - W`,
    which the row still reads, is released. TokenSpeed's seeded
    `window-release-one-token-early` (the same off-by-one in its window geometry)."""

    clause, invariant_class = "SCHED-3", "window-liveness"
    exposed_by = P4_W7


class DecodeSkipsReleaseEngine(BlockPoolEngine):
    def release_window(self, request, processed):
        if not request.finished_prefill:  # BUG: only a prefilling request releases what left its window
            super().release_window(request, processed)


class DecodeSkipsWindowRelease(ReferenceScheduler):
    engine_class = DecodeSkipsReleaseEngine


class DECODE_SKIPS_WINDOW_RELEASE(Mutant, slug="scheduler-decode-skips-window-release",
                                  scheduler=DecodeSkipsWindowRelease):
    """Decode steps never release what left the window (only prefill chunks do): a
    decoding request keeps every page its window slid past until it ends. TokenSpeed's
    seeded `decode-skips-window-release` (its decode fast path), and the missing
    out-of-window release of SGLang's `decode-eviction-never`."""

    clause, invariant_class = "SCHED-4", "window-bound"
    exposed_by = P4_W7


class HeldCountsTableEntries(ReferenceScheduler):
    def snapshot(self):
        view = super().snapshot()
        entries = sum(1 for _, tables in view.tables for table in tables for page in table if page)
        # BUG: the gauge counts a page once per table that holds it (a prefix hit's shared pages twice)
        return SchedulerView(PagePool(view.pool.pages, view.pool.free, entries), view.tables, view.memory)


class HELD_COUNTS_TABLE_ENTRIES(Mutant, slug="held-counts-table-entries", scheduler=HeldCountsTableEntries):
    """The held-pages gauge counts table entries, not pages: a page a prefix hit shares
    between two requests counts twice, so free + held exceeds the pool while they run. The
    class of TokenSpeed's seeded `available-counts-pinned-cache` (a gauge that counts one
    page on both sides)."""

    clause, invariant_class = "SCHED-5", "ownership"
    exposed_by = P4_W7


class FinishNeverReleases(ReferenceScheduler):
    def finish(self, rid):
        self.arrivals.remove(rid)  # BUG: the engine is never told: every block the request held stays held


class FINISH_NEVER_RELEASES(Mutant, slug="finish-never-releases", scheduler=FinishNeverReleases):
    """A finished request is dropped from the scheduler's queue but its blocks are never
    released: every page it held stays held with nobody running (a leak). TokenSpeed's
    seeded `empty-result-not-landed` (a request that stays Finishing), SGLang's leaks on a
    path that skips the release (sgl-project/sglang#16067)."""

    clause, invariant_class = "SCHED-6", "leak"
    exposed_by = P4_W7


class GreedyPreemption(ReferenceScheduler):
    def spare(self, victims, free):
        return victims  # BUG: a victim marked for one row is kept when a later one made room for both


class GREEDY_PREEMPTION(Mutant, slug="greedy-preemption", scheduler=GreedyPreemption):
    """Victims are chosen row by row and never spared: when one row's victim turns out to
    free enough for an earlier row too, the earlier row's victim was preempted for
    nothing, its KV recomputed later. vLLM's scheduler chooses victims so, row by row
    (divergences VLLM-2, VLLM-3)."""

    clause, invariant_class = "SCHED-7", "scheduling"
    exposed_by = P4_W7  # two victims, the second making room for both rows, is rare: at seed 0 the ci profile meets it here


class PreemptedNeverResumed(ReferenceScheduler):
    def preempt(self, victim):
        self.engine.release(victim)  # BUG: it is not put back among the waiting: nobody admits it again


class PREEMPTED_NEVER_RESUMED(Mutant, slug="preempted-never-resumed", scheduler=PreemptedNeverResumed):
    """A preempted request is never queued again: it waits for good, and its client never
    gets the rest of its outputs. TokenSpeed's retraction without its acknowledgement
    (docs/engines/tokenspeed.md, section 8: the request stays retracted for good)."""

    clause, invariant_class = "SCHED-8", "scheduling"
    exposed_by = Run(2, 5, scheduler=True)


class HitSharesStateGroup(StateGroup):
    def adopt(self, request, checkpoint):
        super().adopt(request, checkpoint)
        if checkpoint != NULL_BLOCK:  # BUG: no copy-on-write: the request runs on the checkpoint's own page
            self.tables[request.rid] = torch.tensor([NULL_BLOCK, checkpoint], dtype=torch.int64,
                                                    device=self.pool.device)


class HitSharesState(ReferenceScheduler):
    state_class = HitSharesStateGroup


class HIT_SHARES_STATE(Mutant, slug="scheduler-hit-shares-state", scheduler=HitSharesState):
    """A prefix hit adopts the cached state it ends at as the request's running state
    instead of copying it into a page of its own: the request's rows advance the
    checkpoint in place, so a later hit on it reads a state past its tokens, and two
    requests that hit it together write one page. The scheduler tier's form of the
    two-pool mutant `shared-state-on-hit` (SGLang's copy-on-write at a match, 0.5.23
    `MambaComponent.finalize_match_result_in_cache`)."""

    clause, invariant_class = "SCHED-9", "state"
    exposed_by = Run(4, 7, scheduler=True, state=True)
