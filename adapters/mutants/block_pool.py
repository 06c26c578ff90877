"""Bugs of the reference's shared block pool (chapter 08, BLOCK-1 .. BLOCK-11), one or more
per clause, the same bug classes vLLM's patched mutants model (adapters/vllm/mutants.py),
seeded into kvspec.reference.block_pool and kvspec.reference.block_pool_engine.

Each is an adapter of the block pool alone: its policy version is a shared-pool one, so
its check makes the block-pool runs, labelled as the vLLM adapters' are (`engine P=4 W=6
I=4`).
"""

import torch

from kvspec.adapters.reference import BLOCK_POOL_CAPABILITIES
from kvspec.conformance.harness.declarations import Run
from kvspec.reference.block_pool import BlockPool, KvEvent
from kvspec.reference.block_pool_engine import BlockPoolEngine
from kvspec.spec.block_pool import NULL_BLOCK, null_prefix_length, release_order, released_swa_blocks
from kvspec.spec.window import EVERY_GROUP, SWA, VLLM_0_33, VLLM_0_33_DENSE

from .seeding import Mutant, with_names


class SharedPoolMutant:
    """What every mutant of the shared block pool declares besides Mutant's (it comes first
    in a mutant's bases): the block-pool model, at `policy_version`."""

    policy_version = VLLM_0_33
    policy_versions = (VLLM_0_33,)
    memory_model = "block-pool"
    capabilities = BLOCK_POOL_CAPABILITIES


class DenseMutant(SharedPoolMutant):
    """At the dense retention version: every whole sliding-window block is cached, so
    prefix hits of every length occur."""

    policy_version = VLLM_0_33_DENSE
    policy_versions = (VLLM_0_33_DENSE,)


def engine_on(pool_class: type[BlockPool]) -> type[BlockPoolEngine]:
    """The reference block-pool engine on a seeded pool."""

    class SeededEngine(BlockPoolEngine):
        __init__ = with_names(BlockPoolEngine.__init__, BlockPool=pool_class)

    return SeededEngine


# -- the pool, its free queue and reference counts ---------------------------------------------


class HitLeftInFreeQueuePool(BlockPool):
    def claim(self, blocks):
        if blocks:
            # BUG: a hit takes a reference but leaves a free block in the queue
            self.ref_cnt[torch.tensor(blocks, dtype=torch.int64, device=self.device)] += 1


class HIT_LEFT_IN_FREE_QUEUE(SharedPoolMutant, Mutant, slug="hit-left-in-free-queue",
                             engine=engine_on(HitLeftInFreeQueuePool)):
    """A prefix hit on a cached block no request holds takes a reference but leaves the
    block in the free queue, so the pool can hand it out again while the request reads it
    (a use-after-free of a cached block; vLLM's `BlockPool.touch` unlinks it). Caught at the
    admission that hits a free block: a held block in the free queue (BLOCK-1)."""

    clause, invariant_class = "BLOCK-1", "leak"
    exposed_by = Run(page_size=2, window=5, interval=1)


class HitWithoutReferencePool(BlockPool):
    def claim(self, blocks):
        if blocks:
            held = torch.tensor(blocks, dtype=torch.int64, device=self.device)
            self.free_count -= int(self.is_free[held].sum())
            self.is_free[held] = False  # BUG: no reference taken


class HIT_WITHOUT_REFERENCE(SharedPoolMutant, Mutant, slug="hit-without-reference",
                            engine=engine_on(HitWithoutReferencePool)):
    """A prefix hit adopts cached blocks (and takes free ones out of the queue) without a
    reference: a shared block's count is one short per request that hit it, and its first
    holder's release frees it under the others (a missing increment on sharing). Caught at
    the admission that hits: more table entries hold a block than its count (BLOCK-2)."""

    clause, invariant_class = "BLOCK-2", "ownership"
    exposed_by = Run(page_size=2, window=5, interval=1)


class WindowReleaseWithoutFreeEngine(BlockPoolEngine):
    release_window = with_names(BlockPoolEngine.release_window,
                                # BUG: the entries become the null block, the blocks never go back to the pool
                                release_order=lambda before, after: [])


class WINDOW_RELEASE_WITHOUT_FREE(SharedPoolMutant, Mutant, slug="window-release-without-free",
                                  engine=WindowReleaseWithoutFreeEngine):
    """The sliding-window release puts the null block in the entries that left the window
    and never gives their blocks back: each keeps a count no table explains (a leak of
    out-of-window SWA KV). Caught at the first allocation that releases (BLOCK-2)."""

    clause, invariant_class = "BLOCK-2", "ownership"
    exposed_by = Run(page_size=2, window=5, interval=1)


# -- the null block ------------------------------------------------------------------------------


class NullBlockFreePool(BlockPool):
    def __init__(self, num_blocks, device="cpu"):
        super().__init__(num_blocks, device)
        self.is_free[NULL_BLOCK] = True  # BUG: the null block stays in the free queue
        self.free_count += 1


class NULL_BLOCK_IN_FREE_QUEUE(SharedPoolMutant, Mutant, slug="null-block-in-free-queue",
                               engine=engine_on(NullBlockFreePool)):
    """The pool names block 0 its null block but leaves it in the free queue: the
    placeholder every released sliding-window entry points at is the first block handed
    out (the padding page in the free list, SGLang's bug class 4). Caught at the engine's
    build: the null block in the free queue (BLOCK-3)."""

    clause, invariant_class = "BLOCK-3", "ownership"
    exposed_by = Run(page_size=4, window=6, interval=4)


# -- block tables ------------------------------------------------------------------------------


class TableOneBlockShortEngine(BlockPoolEngine):
    # BUG: tables sized with floor division, not a ceiling
    allocate = with_names(BlockPoolEngine.allocate, pages_for=lambda tokens, block_size: tokens // block_size)


class TABLE_ONE_BLOCK_SHORT(SharedPoolMutant, Mutant, slug="table-one-block-short", engine=TableOneBlockShortEngine):
    """An allocation sizes the tables with floor division: the tokens of a last, partly
    filled block have no block (a page count floored where a ceiling is due, SGLang's bug
    class 7). Caught at the first allocation of a slot count that is not a multiple of
    the block size (BLOCK-4: a table an entry short). Invisible at block size 1."""

    clause, invariant_class = "BLOCK-4", "alignment"
    exposed_by = Run(page_size=4, window=6, interval=4)


# -- the window ----------------------------------------------------------------------------------


class WindowOneTokenEarlyEngine(BlockPoolEngine):
    release_window = with_names(BlockPoolEngine.release_window, released_swa_blocks=lambda processed, window, size:
                                released_swa_blocks(processed + 1, window, size))  # BUG: the window one token short


class WINDOW_ONE_TOKEN_EARLY(SharedPoolMutant, Mutant, slug="window-one-token-early", engine=WindowOneTokenEarlyEngine):
    """The release counts the window one token short, `p - W + 1` skipped tokens, so where
    that is a multiple of the block size the block holding position `p - W`, which the
    next token still reads, is released (an off-by-one between window conventions: vLLM's
    `sliding_window` counts the current token). Caught at such an allocation (BLOCK-5)."""

    clause, invariant_class = "BLOCK-5", "window-liveness"
    exposed_by = Run(page_size=2, window=5, interval=1)


class NoWindowReleaseEngine(BlockPoolEngine):
    def release_window(self, request, processed):
        pass  # BUG: nothing leaves the window


class NO_WINDOW_RELEASE(SharedPoolMutant, Mutant, slug="no-window-release", engine=NoWindowReleaseEngine):
    """No allocation releases the sliding-window blocks that left the window: a long
    prompt or decode holds a whole sequence of SWA KV (SGLang's bug class 1). Caught at
    the first allocation past the window (BLOCK-6: fewer null entries than due). A prefix
    hit still pads its skipped blocks with the null block."""

    clause, invariant_class = "BLOCK-6", "window-bound"
    exposed_by = Run(page_size=2, window=5, interval=1)


# -- the prefix-cache map and its events -----------------------------------------------------------


class StaleEntryPool(BlockPool):
    def drop_key(self, block):
        key = self.key_of(block)
        if key is not None:
            self.key_group[block] = -1  # BUG: the map keeps its entry
            self.publish(KvEvent(False, key))


class EVICTED_KEY_STAYS_MAPPED(SharedPoolMutant, Mutant, slug="evicted-key-stays-mapped",
                               engine=engine_on(StaleEntryPool)):
    """Evicting a block from the prefix cache (reused for new KV, or an explicit eviction)
    clears its key and publishes the removal but leaves the map's entry: a later hit on
    the key gets whatever the block holds now (a stale entry, silently wrong output).
    Caught at the first eviction (BLOCK-7: an entry whose block has no key)."""

    clause, invariant_class = "BLOCK-7", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


class SilentEvictionPool(BlockPool):
    def drop_key(self, block):
        key = self.key_of(block)
        if key is not None:
            self.cache[key].remove(block)
            if not self.cache[key]:
                del self.cache[key]
            self.key_group[block] = -1  # BUG: no removal published


class NO_REMOVED_EVENT(SharedPoolMutant, Mutant, slug="no-removed-event", engine=engine_on(SilentEvictionPool)):
    """Evicting a block from the prefix cache publishes no removal event: the map drops the
    key, a router or remote index fed by the events keeps it (a lost KV event). Caught at
    the first eviction (BLOCK-8: replaying the events gives a key the map lacks)."""

    clause, invariant_class = "BLOCK-8", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


# -- prefix hits and the eviction order --------------------------------------------------------------


class HitCoversTheLastTokenEngine(BlockPoolEngine):
    # BUG: the hit may cover every token, the last one too
    admit = with_names(BlockPoolEngine.admit, admission_match_limit=lambda num_tokens: num_tokens)


class HIT_COVERS_THE_LAST_TOKEN(DenseMutant, Mutant, slug="hit-covers-the-last-token",
                                engine=HitCoversTheLastTokenEngine):
    """A prefix hit may cover a whole prompt that is cached to its last token, which is
    then never computed again: the request has no logits to sample its first output from
    (vLLM caps the lookup at `num_tokens - 1`, LIFE-3; a block-aligned prompt then hits
    one block less). Caught at the admission of a block-aligned prompt cached whole:
    a hit as long as the request (BLOCK-9)."""

    clause, invariant_class = "BLOCK-9", "mapping"
    exposed_by = Run(page_size=1, window=3, interval=4)


def release_order_head_first(before, after):
    order = release_order(before, after)
    return order[::-1]  # BUG: the shortest prefix's block first


class ReleaseHeadFirstEngine(BlockPoolEngine):
    release = with_names(BlockPoolEngine.release, release_order=release_order_head_first)


class RELEASE_HEAD_FIRST(SharedPoolMutant, Mutant, slug="release-head-first", engine=ReleaseHeadFirstEngine):
    """A release queues a request's cached blocks head first, so the block of its shortest
    prefix is evicted first and every longer cached prefix of the request becomes
    unreachable with it (a chained key is useless without the blocks before it): vLLM frees
    a table reversed for exactly this. Caught at the release of two or more cached blocks
    (BLOCK-10: not in release order)."""

    clause, invariant_class = "BLOCK-10", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


# -- group layouts (BLOCK-11) --------------------------------------------------------------------


class DefaultLayoutEngine(BlockPoolEngine):
    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.groups = EVERY_GROUP  # BUG: one full and one sliding-window group, whatever the layout


class LAYOUT_IGNORED(SharedPoolMutant, Mutant, slug="layout-ignored", engine=DefaultLayoutEngine):
    """The engine builds one full-attention and one sliding-window group whatever layout
    it is given, as an engine that knows only the hybrid models it was first written for:
    a full-attention-only model then keeps and releases a window it does not have. Caught
    at the first step of an engine of another layout (BLOCK-11)."""

    clause, invariant_class = "BLOCK-11", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


class FirstWindowGroupOnlyEngine(BlockPoolEngine):
    def release_window(self, request, processed):
        if not request.holds_tables() or SWA not in self.groups:
            return
        g = self.groups.index(SWA)  # BUG: only the first sliding-window group releases its window
        table = request.table(g)
        due = min(released_swa_blocks(processed, self.window, self.bs), len(table))
        if due > null_prefix_length(table):
            request.tables[g, :due] = NULL_BLOCK
            self.pool.release(release_order((table,), (request.table(g),)), SWA in self.uncached_first)


class FIRST_WINDOW_GROUP_ONLY(SharedPoolMutant, Mutant, slug="first-window-group-only",
                              engine=FirstWindowGroupOnlyEngine):
    """Only the first sliding-window group releases what left the window: a model whose
    sliding-window layers fall into several groups (vLLM makes groups of equal size, so
    five sliding-window layers to one full make five groups) holds every other group's
    blocks for the whole sequence. Caught at the first allocation past the window in a
    layout of two sliding-window groups (BLOCK-6: more held than the bound)."""

    clause, invariant_class = "BLOCK-6", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
