"""One pool of blocks shared by every layer group [BLOCK-1 .. BLOCK-3, BLOCK-7, BLOCK-8,
BLOCK-10], as vLLM 0.33's `BlockPool` keeps it: reference counts, the free queue, the
prefix-cache map of keys to blocks and the KV events that publish its changes.

Block 0 is the null block: never free, never cached, never counted. A real block is free
exactly when no table holds it (its count is 0); a free block may still carry a key and
serve prefix hits: eviction is lazy, a key is dropped only when its block is taken for
new KV (or by an explicit eviction).

The free queue is kept as a rank per block, on a tensor: the free block of lowest rank is
reused first. A block freed without a key is ranked before every free block (the head),
one freed with a key after every one (the tail), so a cached free block waits its turn,
least recently released first (BLOCK-10); a prefix hit takes a free block out where it
stands; dropping a key leaves it there.
"""

from collections import Counter
from dataclasses import dataclass

import torch

from kvspec.spec.block_pool import NULL_BLOCK, Block

Key = tuple[int, int]
"""(chained block hash, group id): one prefix-cache key."""


@dataclass(frozen=True)
class KvEvent:
    """[BLOCK-8] One published change of the prefix-cache map."""

    stored: bool
    """True: the key was stored for one more block; False: removed from one."""
    key: Key


class BlockPool:
    def __init__(self, num_blocks: int, device: str | torch.device = "cpu"):
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        self.ref_cnt = torch.zeros(num_blocks, dtype=torch.int64, device=self.device)
        self.key_hash = torch.zeros(num_blocks, dtype=torch.int64, device=self.device)
        self.key_group = torch.full((num_blocks,), -1, dtype=torch.int64, device=self.device)
        """A block's key, group -1 while it has none."""
        self.rank = torch.arange(num_blocks, dtype=torch.int64, device=self.device)
        """The free queue: a free block's place in it, the lowest reused first."""
        self.is_free = torch.ones(num_blocks, dtype=torch.bool, device=self.device)
        self.is_free[NULL_BLOCK] = False
        self.free_count = num_blocks - 1
        self.head, self.tail = 0, num_blocks
        """The rank below every free block's, and the one above."""
        self.cache: dict[Key, list[int]] = {}
        """[BLOCK-7] The prefix-cache map: a key to the blocks that carry it, first cached
        first (keys are not unique: two requests may compute the same block)."""
        self.events: list[KvEvent] = []
        self.replayed: Counter = Counter()
        """[BLOCK-8] What replaying every event so far gives: each key's stores less removals."""

    # -- the free queue ---------------------------------------------------------------------

    def queue(self) -> list[int]:
        """[BLOCK-10] The free blocks, in the order they are reused."""
        free = torch.nonzero(self.is_free).reshape(-1)
        return free[torch.argsort(self.rank[free])].tolist()

    def take(self, count: int) -> list[int]:
        """[BLOCK-10] `count` blocks from the head of the free queue for new KV, each with
        its key dropped and one reference (the caller checked there are that many)."""
        if count <= 0:
            return []
        assert count <= self.free_count, f"take({count}) with {self.free_count} free blocks"
        blocks = self.queue()[:count]
        for block in blocks:
            self.drop_key(block)
        taken = torch.tensor(blocks, dtype=torch.int64, device=self.device)
        self.is_free[taken] = False
        self.ref_cnt[taken] = 1
        self.free_count -= count
        return blocks

    def claim(self, blocks: list[int]) -> None:
        """[BLOCK-2, BLOCK-10] A prefix hit's blocks: one reference more each; a free one
        leaves the queue where it stands."""
        if not blocks:
            return
        held = torch.tensor(blocks, dtype=torch.int64, device=self.device)
        self.free_count -= int(self.is_free[held].sum())
        self.is_free[held] = False
        self.ref_cnt[held] += 1

    def free_among(self, blocks: list[int]) -> int:
        """How many of `blocks` are free (a hit on them takes them out of the queue)."""
        return int(self.is_free[blocks].sum()) if blocks else 0

    def release(self, ordered: list[int], uncached_first: bool = True) -> None:
        """[BLOCK-2, BLOCK-10] One reference less on each block, in release order; a block
        that no table holds any more is free: at the head of the queue without a key, at
        the tail with one (every one at the tail, where the policy does not put the uncached first)."""
        uncached, cached = [], []
        for block in ordered:
            self.ref_cnt[block] -= 1
            if int(self.ref_cnt[block]) == 0:
                keyed = int(self.key_group[block]) >= 0 or not uncached_first
                (cached if keyed else uncached).append(block)
        if uncached:
            self.head -= len(uncached)
            self.place(uncached, self.head)
        if cached:
            self.place(cached, self.tail)
            self.tail += len(cached)

    def place(self, blocks: list[int], first_rank: int) -> None:
        freed = torch.tensor(blocks, dtype=torch.int64, device=self.device)
        self.rank[freed] = torch.arange(first_rank, first_rank + len(blocks), dtype=torch.int64, device=self.device)
        self.is_free[freed] = True
        self.free_count += len(blocks)

    # -- the prefix-cache map ---------------------------------------------------------------

    def key_of(self, block: int) -> Key | None:
        group = int(self.key_group[block])
        return None if group < 0 else (int(self.key_hash[block]), group)

    def cached_block(self, key: Key) -> int | None:
        """[BLOCK-9] The block a hit on `key` takes: the first cached under it."""
        blocks = self.cache.get(key)
        return blocks[0] if blocks else None

    def store(self, block: int, key: Key) -> None:
        """[BLOCK-7, BLOCK-8] `block` now holds the KV `key` names: map it, publish it."""
        assert block != NULL_BLOCK and self.key_of(block) is None, f"block {block} is the null block or has a key"
        self.key_hash[block], self.key_group[block] = key
        self.cache.setdefault(key, []).append(block)
        self.publish(KvEvent(True, key))

    def drop_key(self, block: int) -> None:
        """[BLOCK-7, BLOCK-8] Evict `block` from the prefix cache, if it is cached."""
        key = self.key_of(block)
        if key is None:
            return
        self.cache[key].remove(block)
        if not self.cache[key]:
            del self.cache[key]
        self.key_group[block] = -1
        self.publish(KvEvent(False, key))

    def cached_free_blocks(self) -> list[int]:
        """[BLOCK-10] The free blocks that carry a key, least recently released first."""
        return [block for block in self.queue() if int(self.key_group[block]) >= 0]

    def publish(self, event: KvEvent) -> None:
        self.events.append(event)
        self.replayed[event.key] += 1 if event.stored else -1
        if not self.replayed[event.key]:
            del self.replayed[event.key]

    def take_events(self) -> list[KvEvent]:
        """[BLOCK-8] The events published since the last call, as a consumer reads them."""
        events, self.events = self.events, []
        return events

    # -- observation ------------------------------------------------------------------------

    def blocks(self) -> tuple[Block, ...]:
        """[BLOCK-1] Every block: its reference count and key."""
        refs, hashes, groups = self.ref_cnt.tolist(), self.key_hash.tolist(), self.key_group.tolist()
        return tuple(Block(i, refs[i], None if groups[i] < 0 else (hashes[i], groups[i])) for i in range(len(refs)))

    def cache_map(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((key[0], key[1], block) for key, blocks in self.cache.items() for block in blocks)

    def replayed_map(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((key[0], key[1], count) for key, count in self.replayed.items())
