"""Certificates of chapter 08's invariants (kvspec.spec.block_pool), for incremental.py.

The same contract as the two-pool ones: True only when the spec's predicate finds
nothing; anything else, or a view it cannot read, leaves the view to the predicate. A
block pool view lists every block of the pool and every cache entry, so what costs is a
Python walk over them: here each predicate becomes a comparison of sets and counts built
in C (`map` with `attrgetter`/`itemgetter`, `compress`, `Counter`, `zip`).
"""

from collections import Counter
from functools import wraps
from itertools import chain, compress, repeat
from operator import attrgetter, is_not, itemgetter, not_

from kvspec.spec import block_pool
from kvspec.spec.block_pool import NULL_BLOCK, SWA, BlockPoolSnapshot, BlockPoolView, PartialBlocks
from kvspec.spec.pages import pages_for

block_ids, ref_counts, block_hashes = attrgetter("block_id"), attrgetter("ref_cnt"), attrgetter("block_hash")


class Pool:
    """What one view implies for several certificates, built once."""

    def __init__(self, view: BlockPoolView):
        self.view = view
        self.refs = list(map(ref_counts, view.blocks))
        self.ids_are_indices = list(map(block_ids, view.blocks)) == list(range(len(view.blocks)))
        tables = [(group, table) for request in view.requests for group, table in enumerate(request.tables)]
        entries = list(chain.from_iterable(table for _, table in tables))
        groups = chain.from_iterable(map(repeat, (group for group, _ in tables), map(len, (t for _, t in tables))))
        real = list(map(bool, entries))  # NULL_BLOCK is 0
        self.held_blocks = list(compress(entries, real))
        """Every table entry that is not the null block, and its table's group:"""
        self.held = list(zip(self.held_blocks, compress(groups, real)))
        hashed = list(compress(view.blocks, map(is_not, map(block_hashes, view.blocks), repeat(None))))
        keys = list(map(block_hashes, hashed))
        self.hashed_ids = list(map(block_ids, hashed))
        self.keys = keys
        self.keys_are_pairs = set(map(len, keys)) <= {2}
        self.key_groups = dict(zip(self.hashed_ids, map(itemgetter(1), keys)))


def whole_views_only(certificate):
    @wraps(certificate)
    def certify(now: BlockPoolSnapshot) -> bool:
        return not isinstance(now.block_pool.blocks, PartialBlocks) and certificate(now)
    return certify


class BlockPoolCertificates:
    def __init__(self):
        self.pool: Pool | None = None
        certificates = {
            block_pool.pool_accounting_violations: self.accounting,
            block_pool.reference_count_violations: self.reference_counts,
            block_pool.null_block_violations: self.null_block,
            block_pool.table_shape_violations: self.table_shapes,
            block_pool.cache_map_violations: self.cache_map,
            block_pool.event_replay_violations: self.event_replay,
        }
        # a partial view [OBS-4] already shows only what a step could change: the spec reads it
        self.by_function = {function: whole_views_only(certificate) for function, certificate in certificates.items()}

    def of(self, now: BlockPoolSnapshot) -> Pool:
        if self.pool is None or self.pool.view is not now.block_pool:
            self.pool = Pool(now.block_pool)
        return self.pool

    def accounting(self, now: BlockPoolSnapshot) -> bool:
        """[BLOCK-1] The queue: distinct real blocks; block i shows id i; the free real
        blocks are exactly those with ref count 0."""
        view, pool = now.block_pool, self.of(now)
        queue = view.free_queue
        queued = set(queue)
        if len(queued) != len(queue) or queue and not 0 < min(queue) <= max(queue) < len(view.blocks):
            return False
        if not pool.ids_are_indices:
            return False
        return set(compress(range(1, len(view.blocks)), map(not_, pool.refs[1:]))) == queued

    def reference_counts(self, now: BlockPoolSnapshot) -> bool:
        """[BLOCK-2] Each real block's ref count is its table entries; each in one group."""
        pool = self.of(now)
        if not pool.ids_are_indices:
            return False  # the spec's predicate reads blocks by their ids
        counted = Counter(pool.held_blocks)
        shown = dict(compress(enumerate(pool.refs), pool.refs))
        shown.pop(NULL_BLOCK, None)
        if shown != counted:
            return False
        return len(set(pool.held)) == len(counted)

    def null_block(self, now: BlockPoolSnapshot) -> bool:
        """[BLOCK-3] The null block: not free, not cached, not counted; only as the head
        of sliding-window tables."""
        view = now.block_pool
        null = view.blocks[NULL_BLOCK]
        if NULL_BLOCK in view.free_queue or null.block_hash is not None or null.ref_cnt != 0:
            return False
        if NULL_BLOCK in set(map(itemgetter(2), view.cache_map)):
            return False
        for request in view.requests:
            for group, table in enumerate(request.tables):
                nulls = table.count(NULL_BLOCK)
                if nulls and (view.groups[group] != SWA or table[:nulls].count(NULL_BLOCK) != nulls):
                    return False
        return True

    def table_shapes(self, now: BlockPoolSnapshot) -> bool:
        """[BLOCK-4] A table per group exactly while the request holds KV, each of
        cdiv(L, block size) blocks of the pool, its last allocation the row's."""
        view, rows = now.block_pool, {r.rid: r for r in now.requests}
        tabled = set()
        for request in view.requests:
            row = rows.get(request.rid)
            if row is None or request.slots != row.kv_allocated_len or request.processed > row.kv_committed_len:
                return False
            if len(request.tables) != len(view.groups):
                return False
            expected = pages_for(row.kv_allocated_len, view.block_size)
            for table in request.tables:
                if len(table) != expected or table and not 0 <= min(table) <= max(table) < len(view.blocks):
                    return False
            tabled.add(request.rid)
        return not any(rows[rid].kv_allocated_len for rid in rows.keys() - tabled)

    def cache_map(self, now: BlockPoolSnapshot) -> bool:
        """[BLOCK-7] The entries are exactly the cached blocks with their keys, and a cached
        block in a table is in a table of its key's group."""
        view, pool = now.block_pool, self.of(now)
        if not pool.ids_are_indices or not pool.keys_are_pairs:
            return False
        shown = set(zip(map(itemgetter(0), pool.keys), map(itemgetter(1), pool.keys), pool.hashed_ids))
        if shown != set(view.cache_map):
            return False
        if pool.held_blocks and not 0 <= min(pool.held_blocks) <= max(pool.held_blocks) < len(view.blocks):
            return False  # the spec's predicate reads such a table entry as uncached
        mismatched = set(pool.held) - set(pool.key_groups.items())
        return set(map(itemgetter(0), mismatched)).isdisjoint(pool.key_groups)

    def event_replay(self, now: BlockPoolSnapshot) -> bool:
        """[BLOCK-8] The replayed events give the map's keys, each as often."""
        view = now.block_pool
        if view.replayed_map is None:
            return True
        mapped = Counter(map(itemgetter(0, 1), view.cache_map))
        replayed = dict(zip(map(itemgetter(0, 1), view.replayed_map), map(itemgetter(2), view.replayed_map)))
        return replayed == mapped
