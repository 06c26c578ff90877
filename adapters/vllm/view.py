"""What vLLM 0.33.0's KV cache manager shows kvspec: its one shared block pool, read as
chapter 08's `BlockPoolSnapshot` (OBS-1).

* The pool (`block_pool`): every block with its ref count and key, the free queue, the
  prefix-cache map, and the map a consumer of the KV events rebuilds by replaying them
  (BLOCK-8: each event is replayed into a multiset of keys as it comes).
* The tables (`tables`): each request's block table per group; its row and cursors
  (`request_view`) follow from them and from its last `allocate_slots`.
* With a recurrent group (chapter 09, `state_snapshot`): the attention groups' view, and
  the state group's own, with what each state block holds and what its key promises.
* A partial snapshot [OBS-4] (`partial_snapshot`): what changed, at a cost that does not
  grow with the pool.

Reading a pool of many blocks at every step is most of a check's time, so the view
remembers what it last showed and reads again only what changed.
"""

from collections import Counter
from dataclasses import replace
from functools import lru_cache
from itertools import compress
from operator import attrgetter, is_not, ne, or_

from kvspec.spec.block_pool import (
    FULL,
    NULL_BLOCK,
    SWA,
    Block,
    BlockPoolSnapshot,
    BlockPoolView,
    PartialBlocks,
    RequestBlocks,
)
from kvspec.spec.block_pool_state import BlockPoolStateSnapshot, BlockStateView, StateBlock, StateTable
from kvspec.spec.snapshot import RequestView
from kvspec.spec.state import StateValue, state_digest

from .runtime import vllm

REF_COUNT, BLOCK_HASH, BLOCK_ID = attrgetter("ref_cnt"), attrgetter("block_hash"), attrgetter("block_id")


def cached_keys(cache_map):
    """The keys of vLLM's prefix-cache map: a `BlockHashToBlockMap` from 0.11.0, before it a
    plain dict of each key's blocks by id (0.10.2 `v1/core/block_pool.py`)."""
    return cache_map if isinstance(cache_map, dict) else cache_map._cache


def cached_blocks(cache_map, key) -> tuple:
    """The blocks vLLM's prefix-cache map holds under one of its keys, () for a key it does
    not hold. Up to 0.33.0 an entry is a block, or a dict of the blocks of a key several share
    (before 0.11.0 always a dict); from 0.34.0 an entry is a block id, and the ids of a key
    several blocks share are kept apart (`_dup_ids`, 0.34.0 `v1/core/block_pool.py:56-64`)."""
    if hasattr(cache_map, "_dup_ids"):
        ids = cache_map._dup_ids.get(key) or ((cache_map._cache[key],) if key in cache_map._cache else ())
        return tuple(cache_map._blocks[i] for i in ids)
    value = cached_keys(cache_map).get(key)
    return () if value is None else tuple(value.values()) if isinstance(value, dict) else (value,)


def table_blocks(tables: dict[str, list[tuple[int, ...]]]) -> set[int]:
    """Every block the block tables name."""
    return {block for per_group in tables.values() for table in per_group for block in table}


class KVCacheManagerView:
    """vLLM's `KVCacheManager`, shown as chapter 08's snapshot: the engine adapter's
    (engine.py) and the scheduler tier's (scheduler.py). A subclass sets `v`, `config`,
    `bs`, `state_bs`, `num_blocks` and the per-request facts the rows need (`requests`,
    `allocation`, `decode_steps`, `finished_prefill`; with a recurrent group `contents` and
    `state_blocks_per_request` too), then calls `watch`."""

    def watch(self, manager) -> None:
        """Read `manager` from now on: its pool, its groups (by kind, a Mamba group apart),
        and what the views remember between two of them. The scheduler tier reads its
        scheduler's own manager through this (scheduler.py)."""
        v = self.v
        self.manager, self.pool = manager, manager.block_pool
        managers = manager.coordinator.single_type_managers
        self.state_manager = next((m for m in managers if isinstance(m, v.MambaManager)), None)
        self.state_group = None if self.state_manager is None else managers.index(self.state_manager)
        managers = tuple(m for m in managers if m is not self.state_manager)
        self.groups = tuple(SWA if isinstance(m, v.SlidingWindowManager) else FULL for m in managers)
        self.managers = managers
        self.replayed: Counter = Counter()
        """(hash, group) -> times stored less times removed, from the KV events."""
        self.block_views: dict[int, tuple] = {}
        """Block id -> (ref count, key, Block): block_view."""
        self.touched: set[tuple[int, int]] | None = set()
        """The keys the events since the last view stored or removed; None after a clear."""
        self.raw_keys: dict[tuple[int, int], object] = {}
        """(hash, group) -> vLLM's own key of the cache map, for every key seen on a block."""
        self.last_shown: frozenset[int] = frozenset()
        """The blocks the last view showed (a partial view shows them again)."""
        self.evicted: set[int] = set()
        """The blocks `evict` dropped the keys of since the last view."""
        self.shown_blocks: tuple[list, list, list] | None = None
        """The ref counts, keys and Blocks the last whole view showed: every_block."""
        self.promises: dict[int, tuple[object, StateValue | None]] = {}
        """Block id -> (vLLM's key, the state that key stands for) of every cached state block."""
        self.key_promises: dict[tuple[object, int], StateValue] = {}
        """(vLLM's key, its tokens) -> the state it stands for, as first met on a block a table held."""

    @staticmethod
    @lru_cache(maxsize=1 << 16)
    def key(block_hash) -> tuple[int, int]:
        """(hash, group) of a block's key. Cached: vLLM's conversion reads an environment
        variable per call, which made it most of a snapshot's time."""
        v = vllm()
        return v.maybe_convert_block_hash(v.get_block_hash(block_hash)), v.get_group_id(block_hash)

    def new_events(self) -> list:
        """The KV events the manager emitted since the last call: here, the adapter is
        their only consumer, so it takes them."""
        return self.manager.take_events()

    def replay_events(self) -> None:
        v = self.v
        for event in self.new_events():
            if isinstance(event, v.AllBlocksCleared):
                self.replayed.clear()
                self.touched = None
            elif isinstance(event, (v.BlockStored, v.BlockRemoved)):
                sign = 1 if isinstance(event, v.BlockStored) else -1
                for block_hash in event.block_hashes:
                    self.replayed[(block_hash, event.group_idx)] += sign
                    if not self.replayed[(block_hash, event.group_idx)]:
                        del self.replayed[(block_hash, event.group_idx)]  # keep it as small as the cache
                    if self.touched is not None:
                        self.touched.add((block_hash, event.group_idx))

    def block_view(self, block) -> Block:
        """A block as the spec shows it. While its ref count and key are the ones it last
        showed, its last Block is shown again: reading the pool is then one comparison per
        block, not a new object."""
        key, last = block.block_hash, self.block_views.get(block.block_id)
        if last is None or last[0] != block.ref_cnt or last[1] is not key:
            shown = None if key is None else self.key(key)
            if shown is not None:
                self.raw_keys[shown] = key
            if last is not None and last[2].block_hash not in (None, shown) and self.touched is not None:
                self.touched.add(last[2].block_hash)  # the block lost its key: the map must have lost it too
            last = self.block_views[block.block_id] = (block.ref_cnt, key, Block(block.block_id, block.ref_cnt, shown))
        return last[2]

    def every_block(self) -> tuple[Block, ...]:
        """Every block as block_view shows it, with the blocks that changed since the last
        view found in C: their ref counts and keys read with attrgetter (`_block_hash`, the
        slot behind vLLM's `block_hash` property) and compared with the last ones shown."""
        pool, last = self.pool.blocks, self.shown_blocks
        refs, keys = list(map(REF_COUNT, pool)), list(map(BLOCK_HASH, pool))
        if last is None or len(last[0]) != len(pool):
            changed = range(len(pool))
            self.shown_blocks = last = (refs, keys, [None] * len(pool))
        else:
            changed = compress(range(len(pool)), map(or_, map(ne, refs, last[0]), map(is_not, keys, last[1])))
        views = last[2]
        for index in changed:
            views[index] = self.block_view(pool[index])
        self.shown_blocks = refs, keys, views
        return tuple(views)

    def block_pool(self) -> BlockPoolView:
        self.replay_events()
        key, cache_map, tables = self.key, [], self.tables()
        cached = self.pool.cached_block_hash_to_block
        for block_hash in cached_keys(cached):
            self.raw_keys[key(block_hash)] = block_hash
            for block in cached_blocks(cached, block_hash):
                cache_map.append((*key(block_hash), block.block_id))
        blocks = self.every_block()
        self.touched, self.evicted = set(), set()
        self.last_shown = frozenset(table_blocks(tables) | {b for *_, b in cache_map})
        requests = self.request_blocks(tables)
        return BlockPoolView(
            block_size=self.bs, window=self.config.window, groups=self.groups, blocks=blocks,
            free_queue=tuple(map(BLOCK_ID, self.pool.free_block_queue.get_all_free_blocks())),
            requests=requests, cache_map=tuple(cache_map),  # in the map's order: the checks read them as sets
            replayed_map=tuple((h, g, count) for (h, g), count in self.replayed.items() if count))

    def tables(self) -> dict[str, list[tuple[int, ...]]]:
        """Per request, its block table of each group."""
        tables = {}
        for group, manager in enumerate(self.managers):
            for rid, table in manager.req_to_blocks.items():
                # vLLM's null block is its block 0, NULL_BLOCK
                tables.setdefault(rid, [()] * len(self.managers))[group] = tuple(map(BLOCK_ID, table))
        return tables

    def request_blocks(self, tables: dict[str, list[tuple[int, ...]]]) -> tuple[RequestBlocks, ...]:
        return tuple(RequestBlocks(rid, tuple(tables[rid]), *self.allocation.get(rid, (0, 0))) for rid in sorted(tables))

    def request_view(self, rid: str, req, view: BlockPoolView) -> RequestView:
        bs = self.bs
        tables = next((r.tables for r in view.requests if r.rid == rid), ((),) * len(self.groups))
        # BLOCK-11: the first full table (the first table without one), the first sliding-window table
        full = tables[self.groups.index(FULL) if FULL in self.groups else 0]
        swa = tables[self.groups.index(SWA)] if SWA in self.groups else ()
        slots = self.allocation[rid][1]
        row = tuple(full[i // bs] * bs + i % bs for i in range(min(slots, len(full) * bs)))
        released = next((i for i, block in enumerate(swa) if block != NULL_BLOCK), len(swa))
        return RequestView(rid=rid, row=row, cache_protected_len=0, swa_evicted_seqlen=released * bs,
                           kv_allocated_len=slots, kv_committed_len=req.num_computed_tokens, seq_len=req.num_tokens,
                           decode_steps=self.decode_steps[rid], finished_prefill=rid in self.finished_prefill,
                           last_node=None)

    def snapshot(self) -> BlockPoolSnapshot:
        if self.state_manager is not None:
            return self.state_snapshot()
        return self.with_requests(self.block_pool())

    def state_snapshot(self) -> BlockPoolStateSnapshot:
        """[STATE-10..14] Chapter 08's view of the attention groups, a partial view (OBS-4)
        of every block less the state group's, and the state group's own view."""
        whole = self.block_pool()
        group, pool = self.state_group, self.pool.blocks
        state_tables = {rid: table for rid, table in self.state_manager.req_to_blocks.items()}
        state_ids = {b.block_id for table in state_tables.values() for b in table if not b.is_null}
        state_map = []
        cached = self.pool.cached_block_hash_to_block
        for block_hash in cached_keys(cached):
            if self.v.get_group_id(block_hash) == group:
                for block in cached_blocks(cached, block_hash):
                    state_map.append((self.key(block_hash)[0], block.block_id))
                    state_ids.add(block.block_id)
        blocks = []
        for block_id in sorted(state_ids):
            block = pool[block_id]
            key = None if block.block_hash is None else self.key(block.block_hash)
            blocks.append(StateBlock(block_id, block.ref_cnt, key, block.block_hash_num_tokens,
                                     self.contents.get(block_id), self.promise(block, state_tables)))
        shown = {i: b for i, b in enumerate(whole.blocks) if i not in state_ids}
        free = tuple(map(BLOCK_ID, self.pool.free_block_queue.get_all_free_blocks()))
        attention = BlockPoolView(
            block_size=self.bs, window=self.config.window, groups=self.groups,
            blocks=PartialBlocks(self.num_blocks, shown), free_queue=tuple(b for b in free if b not in state_ids),
            free_count=len(free), requests=whole.requests,
            cache_map=tuple(e for e in whole.cache_map if e[1] != group),
            replayed_map=tuple(e for e in whole.replayed_map if e[1] != group))
        tokens = {rid: tuple(req.all_token_ids) for rid, req in self.requests.items()}
        view = BlockStateView(
            group=group, block_size=self.state_bs, hit_alignment=self.manager.coordinator._cache_hit_alignment_tokens,
            blocks=tuple(blocks), free_blocks=tuple(b for b in free if b in state_ids),
            tables=tuple(StateTable(rid, tuple(map(BLOCK_ID, table)), tokens.get(rid, ()))
                         for rid, table in sorted(state_tables.items())),
            cache_map=tuple(state_map),
            replayed_map=tuple((h, count) for (h, g), count in self.replayed.items() if g == group and count),
            blocks_per_request=self.state_blocks_per_request)
        requests = tuple(self.request_view(rid, req, attention) for rid, req in sorted(self.requests.items()))
        return BlockPoolStateSnapshot(self.config, requests, attention, state=view)

    def promise(self, block, state_tables) -> StateValue | None:
        """[STATE-11] The state a cached state block's key stands for: the first
        `block_hash_num_tokens` tokens of the request whose table held it when it was
        keyed (met at the snapshot after that step), or, for a key vLLM moved to another
        block (`move_block_hashes`, a copy-on-write), what it stood for there. None while
        it is not cached."""
        if block.block_hash is None:
            self.promises.pop(block.block_id, None)
            return None
        known = self.promises.get(block.block_id)
        if known is not None and known[0] is block.block_hash:
            return known[1]
        promised, n = None, block.block_hash_num_tokens
        for rid, table in state_tables.items():
            if any(b is block for b in table) and rid in self.requests and n is not None:
                tokens = self.requests[rid].all_token_ids[:n]
                promised = StateValue(block.block_id, n, state_digest(tokens))
                self.key_promises[(block.block_hash, n)] = promised
                break
        else:  # a key moved to a block no table holds (copy-on-write of a running request's tail)
            known = self.key_promises.get((block.block_hash, n))
            promised = None if known is None else replace(known, slot=block.block_id)
        self.promises[block.block_id] = (block.block_hash, promised)
        return promised

    def with_requests(self, view: BlockPoolView) -> BlockPoolSnapshot:
        requests = tuple(self.request_view(rid, req, view) for rid, req in sorted(self.requests.items()))
        return BlockPoolSnapshot(self.config, requests, view)

    def partial_snapshot(self) -> BlockPoolSnapshot:
        """[OBS-4] What changed, as chapter 08 reads it, at a cost that does not grow with the
        pool: the blocks the tables name and those the last view showed, the cache entries
        of the keys the events touched and of the shown cached blocks (with their replayed
        counts), which shown blocks are free (vLLM links exactly the free blocks into its
        queue, between a fake head and tail) and the queue's length. After a clear of the
        whole cache, the whole view."""
        self.replay_events()
        if self.touched is None or self.state_manager is not None:
            return self.snapshot()
        tables, cached = self.tables(), self.pool.cached_block_hash_to_block
        current = {NULL_BLOCK, *self.evicted, *table_blocks(tables)}
        blocks = {i: self.block_view(self.pool.blocks[i]) for i in current | self.last_shown}
        keys = self.touched | {block.block_hash for block in blocks.values() if block.block_hash is not None}
        if not keys <= self.raw_keys.keys():  # learn vLLM's own keys from its map (what it holds, not the pool)
            self.raw_keys.update((self.key(raw), raw) for raw in cached_keys(cached))
        cache_map = []
        for key in keys:
            for block in cached_blocks(cached, self.raw_keys.get(key)):  # a key it never held is in no entry
                cache_map.append((*key, block.block_id))
                current.add(block.block_id)
                if block.block_id not in blocks:
                    blocks[block.block_id] = self.block_view(block)
        self.touched, self.evicted, self.last_shown = set(), set(), frozenset(current)
        free = tuple(sorted(i for i in blocks if self.pool.blocks[i].prev_free_block is not None))
        view = BlockPoolView(
            block_size=self.bs, window=self.config.window, groups=self.groups,
            blocks=PartialBlocks(self.num_blocks, dict(sorted(blocks.items()))), free_queue=free,
            free_count=self.pool.get_num_free_blocks(), requests=self.request_blocks(tables),
            cache_map=tuple(cache_map), replayed_map=tuple((*key, self.replayed.get(key, 0)) for key in keys))
        return self.with_requests(view)
