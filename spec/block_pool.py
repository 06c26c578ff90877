"""One shared block pool [BLOCK-1 .. BLOCK-10]: the KV-cache model of vLLM's v1 manager
(which groups it has, BLOCK-11, is group_layouts.py).

Where SGLang keeps a full and an SWA pool joined by a mapping, and a radix tree of
prefixes, vLLM keeps one pool of blocks for every layer group, a positional block table
per request and group, reference counts, and a map from chained block hashes to cached
blocks. A sliding-window table releases its leading blocks by replacing them with the
null block. These predicates read a `BlockPoolView` of such an engine (plain data, no
vLLM) beside the engine snapshot's request rows, and return the `Violation`s they find.

The window follows the spec's convention (chapter 05): a token reads the `window`
tokens before it. vLLM's `sliding_window` counts the token itself, so an engine built
with `sliding_window = window + 1` is the spec's `window`.

Besides the predicates, the decisions an engine of this model makes and the spec fixes,
as plain functions (the reference calls them): which prompt blocks a prefix hit
covers, which sliding-window blocks are cached (the prefix-cache retention of each
policy version), and the order in which a release gives blocks back to the free queue.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .lifecycle import EngineOperation
from .notation import Violation
from .pages import pages_for
from .registry import invariant
from .snapshot import EngineConfig, EngineSnapshot, RequestView, Step, request_lengths
from .window import FULL, SWA, VLLM_0_33, VLLM_0_33_DENSE

NULL_BLOCK = 0
"""[BLOCK-3] The id of the null block: it stands in a table for a block the request does not hold."""


@dataclass(frozen=True)
class Block:
    """[BLOCK-1] One block of the pool: how many tables hold it, and its prefix-cache key."""

    block_id: int
    ref_cnt: int
    block_hash: tuple[int, int] | None = None
    """(hash, group id) while the block is cached, else None."""


@dataclass(frozen=True)
class RequestBlocks:
    """[BLOCK-4] One request's block tables, one per group, and its last allocation."""

    rid: str
    tables: tuple[tuple[int, ...], ...]
    """Per group, the block of each `block_size` tokens; NULL_BLOCK where released."""
    processed: int
    """p: the tokens already computed when its last allocation ran (its window's end)."""
    slots: int
    """N: the tokens it has slots for after that allocation."""


class PartialBlocks(dict):
    """[OBS-4] The pool's blocks as a partial view shows them: the pool's length, and the
    blocks it shows by id (reading another is a KeyError, which a check reports as a view
    it cannot read)."""

    def __init__(self, length: int, blocks: dict[int, Block]):
        super().__init__(blocks)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __eq__(self, other) -> bool:
        return isinstance(other, PartialBlocks) and self.length == other.length and dict.__eq__(self, other)

    __hash__ = None


@dataclass(frozen=True)
class BlockPoolView:
    """[BLOCK-1] Everything observable of a block pool between two operations."""

    block_size: int
    window: int
    """Tokens before the current one that a sliding-window layer reads (spec convention)."""
    groups: tuple[str, ...]
    """The kind of each layer group, by group id: FULL or SWA."""
    blocks: tuple[Block, ...] | PartialBlocks
    """Every block, by id; blocks[NULL_BLOCK] is the null block. A partial view [OBS-4]
    shows some of them (PartialBlocks)."""
    free_queue: tuple[int, ...]
    """The free blocks, in the order they are reused; in a partial view, the shown blocks
    that are free, by id."""
    requests: tuple[RequestBlocks, ...]
    """Every request that has a block table."""
    cache_map: tuple[tuple[int, int, int], ...]
    """The prefix cache: (hash, group id, block id) entries."""
    replayed_map: tuple[tuple[int, int, int], ...] | None = None
    """(hash, group id, count): the keys that replaying the engine's KV events from the
    start leaves, each with how many more times it was stored than removed (below 0 for
    a key removed more often than stored); None for an engine that publishes none. A
    partial view shows the keys its cache map shows, each with all its entries."""
    free_count: int = -1
    """The length of the free queue (set from `free_queue` in a whole view)."""

    def __post_init__(self):
        if not isinstance(self.blocks, PartialBlocks):
            object.__setattr__(self, "free_count", len(self.free_queue))


def shown_blocks(view: BlockPoolView) -> list[tuple[int, Block]]:
    """(id, block) of every block the view shows: all of them, or a partial view's."""
    return list(view.blocks.items()) if isinstance(view.blocks, PartialBlocks) else list(enumerate(view.blocks))


def real_blocks(view: BlockPoolView) -> list[Block]:
    """The blocks the view shows, less the null block."""
    return [block for index, block in shown_blocks(view) if index != NULL_BLOCK]


@dataclass(frozen=True)
class BlockPoolSnapshot(EngineSnapshot):
    """[OBS-1] Everything observable of a shared-block-pool engine between two operations:
    its requests (rows and cursors as a two-pool engine shows them: row[i] names the slot
    of position i in its first full-attention table, or its first table where the layout
    has none; the SWA cursor is where the first block of its first sliding-window table
    that is not the null block starts, 0 without one: BLOCK-11) and the block pool."""

    config: EngineConfig
    requests: tuple[RequestView, ...]
    block_pool: BlockPoolView


def block_pool_observables(snapshot: BlockPoolSnapshot, outcome: str) -> dict:
    """[OBS-3] What the spec fixes after a step of a shared-block-pool engine: the outcome,
    the free blocks (cached or not), and the lengths of each request."""
    return {"outcome": outcome, "free_blocks": snapshot.block_pool.free_count,
            "requests": request_lengths(snapshot)}


def drained_violations(snapshot: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-1] With every request released, every real block is free (cached or not)."""
    view = snapshot.block_pool
    held = len(view.blocks) - 1 - view.free_count
    return [Violation("BLOCK-1", f"{held} real blocks are not free (leak)")] if held else []


def released_swa_blocks(processed: int, window: int, block_size: int) -> int:
    """[BLOCK-5, BLOCK-6] How many leading blocks of a sliding-window table are released
    (the null block) after an allocation that ran with `processed` tokens computed: the
    whole blocks before position `processed - window`, the first one the next token reads.

    pre: processed >= 0 and window >= 1 and block_size >= 1
    post: __return__ >= 0
    post: __return__ * block_size <= max(0, processed - window)
    post: (__return__ + 1) * block_size > processed - window
    """
    return max(0, processed - window) // block_size


def swa_block_bound(window: int, new_tokens: int, block_size: int) -> int:
    """[BLOCK-6] The most real blocks a sliding-window table holds right after an
    allocation of `new_tokens` slots: one block of rounding plus the window and the new
    tokens, `1 + cdiv(window - 1 + new_tokens, block_size)`. It is tight: some
    `processed` reaches it (vLLM's own sizing, `max_admission_blocks_per_request`, is
    one block more when `(window - 1 + new_tokens) % block_size == 0`).

    pre: window >= 1 and new_tokens >= 0 and block_size >= 1
    post: __return__ >= 1
    """
    return 1 + pages_for(window - 1 + new_tokens, block_size)


def held_swa_blocks(processed: int, slots: int, window: int, block_size: int) -> int:
    """[BLOCK-6] The real blocks of a sliding-window table after an allocation: its
    `cdiv(slots, block_size)` entries less the released ones. Never above the bound.

    pre: 0 <= processed <= slots and window >= 1 and block_size >= 1
    post: __return__ >= 0
    post: __return__ <= swa_block_bound(window, slots - processed, block_size)
    """
    return pages_for(slots, block_size) - released_swa_blocks(processed, window, block_size)


def null_prefix_length(table: tuple[int, ...]) -> int:
    """[BLOCK-3] How many entries at the head of a table are the null block."""
    length = 0
    while length < len(table) and table[length] == NULL_BLOCK:
        length += 1
    return length


def table_references(view: BlockPoolView) -> Counter:
    """[BLOCK-2] How many table entries hold each real block, over every request and group."""
    return Counter(block for request in view.requests for table in request.tables for block in table
                   if block != NULL_BLOCK)


PREFIX_CACHE_RETENTION = {VLLM_0_33: 0, VLLM_0_33_DENSE: None}
"""[BLOCK-9] Which whole sliding-window blocks each policy version caches (vLLM's
`prefix_cache_retention_interval`): 0, only those a later hit at a prompt's end can
use (vLLM's engine default); None, every one. The full-attention group caches every
whole block under both."""


def swa_hit_run(window: int, block_size: int) -> int:
    """[BLOCK-9] How many cached sliding-window blocks a prefix hit must end with: those
    that hold the `window` tokens before the hit's end, `cdiv(window, block_size)` (vLLM:
    `cdiv(sliding_window - 1, block_size)`).

    pre: window >= 1 and block_size >= 1
    post: __return__ * block_size >= window
    post: (__return__ - 1) * block_size < window
    """
    return pages_for(window, block_size)


def prefix_hit_blocks(full_cached: Sequence[bool], swa_cached: Sequence[bool], run: int, limit: int) -> int:
    """[BLOCK-9] How many whole blocks of a prompt a prefix hit covers, given whether the
    full-attention and the sliding-window group cache each of its blocks (a key for the
    prompt's chained hash and the group): the full group's leading run of cached blocks, at
    most `limit`; within it, the last end before which the sliding-window group caches
    `run` blocks (`swa_hit_run`: what the window reads; the blocks before them are not
    needed), or, where no end has that many, the sliding-window group's own leading run
    (a hit shorter than the window).

    pre: run >= 1 and limit >= 0 and len(full_cached) == len(swa_cached)
    post: 0 <= __return__ <= min(limit, len(full_cached))
    post: all(full_cached[:__return__])
    post: all(swa_cached[max(0, __return__ - run):__return__])
    """
    full = 0
    while full < min(limit, len(full_cached)) and full_cached[full]:
        full += 1
    for end in range(full, run - 1, -1):
        if all(swa_cached[end - run:end]):
            return end
    leading = 0
    while leading < full and swa_cached[leading]:
        leading += 1
    return leading


def swa_block_cached(index: int, window: int, block_size: int, retention: int | None,
                     boundaries: Sequence[int]) -> bool:
    """[BLOCK-9] Whether the sliding-window group caches the block at table entry `index`
    once it is whole: under dense retention (None) every block; under retention 0 only the
    `swa_hit_run` blocks that end at one of the request's `boundaries` floored to a block:
    where a request that resends its prompt resumes (the hit stops one token short of the
    prompt: `prompt length - 1`), and where its own hit stopped short of the full group's
    (vLLM's `shared_prefix_boundary`: the full group caches a longer shared prefix there).

    pre: index >= 0 and window >= 1 and block_size >= 1 and retention in (None, 0)
    """
    if retention is None:
        return True
    run = swa_hit_run(window, block_size)
    return any(boundary // block_size - run <= index < boundary // block_size for boundary in boundaries)


def release_order(before: Sequence[Sequence[int]], after: Sequence[Sequence[int]]) -> list[int]:
    """[BLOCK-10] The real blocks a request's tables give up from `before` to `after` (`()`
    for a request released), in the order the pool takes them back: group by group, each
    table's from its last entry back, so the block of the longest prefix comes first and is
    evicted first (a chained key is useless once a block before it is gone).

    post: len(__return__) <= sum(len(table) for table in before)
    """
    released = []
    for group, table in enumerate(before):
        kept = after[group] if group < len(after) else ()
        for index in range(len(table) - 1, -1, -1):
            if table[index] != NULL_BLOCK and (index >= len(kept) or kept[index] != table[index]):
                released.append(table[index])
    return released


# -- the predicates -------------------------------------------------------------------------

@invariant("BLOCK-1", "leak")
def pool_accounting_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-1] The free queue holds each real block at most once and never the null
    block; a real block is free exactly when no table holds it (ref count 0), so
    free + used + 1 (the null block) == the pool."""
    view = now.block_pool
    found = []
    queued = Counter(view.free_queue)
    for block, count in sorted(queued.items()):
        if not 0 < block < len(view.blocks):
            found.append(Violation("BLOCK-1", f"block {block} in the free queue is not a real block of the pool "
                                              f"(1..{len(view.blocks) - 1})"))
        elif count > 1:
            found.append(Violation("BLOCK-1", f"block {block} is {count} times in the free queue"))
    for index, block in shown_blocks(view):
        if block.block_id != index:
            found.append(Violation("BLOCK-1", f"the pool's block {index} shows id {block.block_id}"))
    for block in real_blocks(view):
        free = block.block_id in queued
        if free != (block.ref_cnt == 0):
            found.append(Violation("BLOCK-1", f"block {block.block_id} has ref count {block.ref_cnt} and is "
                                              f"{'' if free else 'not '}in the free queue"))
    return found


@invariant("BLOCK-2", "ownership")
def reference_count_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-2] Each block's reference count is the number of table entries that hold
    it, and every table that holds it is of one group."""
    view = now.block_pool
    found = []
    references = table_references(view)
    for block in real_blocks(view):
        if block.ref_cnt != references[block.block_id]:
            found.append(Violation("BLOCK-2", f"block {block.block_id} has ref count {block.ref_cnt} but "
                                              f"{references[block.block_id]} table entries hold it"))
    groups_of: dict[int, set[int]] = {}
    for request in view.requests:
        for group, table in enumerate(request.tables):
            for block in table:
                if block != NULL_BLOCK:
                    groups_of.setdefault(block, set()).add(group)
    for block, groups in sorted(groups_of.items()):
        if len(groups) > 1:
            found.append(Violation("BLOCK-2", f"block {block} is held by tables of groups {sorted(groups)}"))
    return found


@invariant("BLOCK-3", "ownership")
def null_block_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-3] The null block is never free, never cached and never counted (where the
    policy keeps its count: null_block_counted); it stands
    only in sliding-window tables, and only as a prefix of one."""
    view = now.block_pool
    found = []
    null = view.blocks[NULL_BLOCK]
    if NULL_BLOCK in view.free_queue:
        found.append(Violation("BLOCK-3", "the null block is in the free queue"))
    if null.block_hash is not None or any(entry[2] == NULL_BLOCK for entry in view.cache_map):
        found.append(Violation("BLOCK-3", "the null block is in the prefix cache"))
    if null.ref_cnt != 0 and now.config.policy.null_block_counted:
        found.append(Violation("BLOCK-3", f"the null block has ref count {null.ref_cnt}"))
    for request in view.requests:
        for group, table in enumerate(request.tables):
            nulls = table.count(NULL_BLOCK)
            if nulls and view.groups[group] != SWA:
                found.append(Violation("BLOCK-3", f"request {request.rid}: its {view.groups[group]} table holds the "
                                                  f"null block ({nulls} of its entries)"))
            elif nulls != null_prefix_length(table):
                found.append(Violation("BLOCK-3", f"request {request.rid}: null blocks in its SWA table are not a "
                                                  f"prefix: {list(table)}"))
    return found


@invariant("BLOCK-4", "alignment", reads={"rows"})
def table_shape_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-4] A request has a table in every group exactly while it holds KV, each of
    `cdiv(kv_allocated_len, block_size)` entries naming blocks of the pool, and the
    allocation it records is the one its row shows: it ran with at most the tokens
    computed since (`processed <= kv_committed_len`) and left `kv_allocated_len` slots."""
    view = now.block_pool
    found = []
    rows = {r.rid: r for r in now.requests}
    for request in view.requests:
        row = rows.get(request.rid)
        if row is None:
            found.append(Violation("BLOCK-4", f"request {request.rid} holds no KV but has block tables "
                                              f"{[list(t) for t in request.tables]}"))
            continue
        if request.slots != row.kv_allocated_len or request.processed > row.kv_committed_len:
            found.append(Violation("BLOCK-4", f"request {request.rid}: its last allocation ({request.processed} "
                                              f"computed, {request.slots} slots) is not its row (kv_committed_len "
                                              f"{row.kv_committed_len}, kv_allocated_len {row.kv_allocated_len})"))
        if len(request.tables) != len(view.groups):
            found.append(Violation("BLOCK-4", f"request {request.rid} has {len(request.tables)} tables for "
                                              f"{len(view.groups)} groups"))
        expected = pages_for(row.kv_allocated_len, view.block_size)
        for group, table in enumerate(request.tables):
            if len(table) != expected:
                found.append(Violation("BLOCK-4", f"request {request.rid}: its group {group} table has {len(table)} "
                                                  f"entries for {row.kv_allocated_len} slots (expected {expected})"))
            if outside := sorted({block for block in table if not 0 <= block < len(view.blocks)}):
                found.append(Violation("BLOCK-4", f"request {request.rid}: its group {group} table names blocks "
                                                  f"{outside}, not blocks of the pool (0..{len(view.blocks) - 1})"))
    tabled = {request.rid for request in view.requests}
    for rid in sorted(set(rows) - tabled):
        if rows[rid].kv_allocated_len:
            found.append(Violation("BLOCK-4", f"request {rid} holds {rows[rid].kv_allocated_len} slots but no table"))
    return found


def swa_tables(view: BlockPoolView):
    """(request, its SWA table) for every request and sliding-window group."""
    return [(request, table) for request in view.requests
            for group, table in enumerate(request.tables) if view.groups[group] == SWA]


@invariant("BLOCK-5", "window-liveness")
def window_coverage_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-5] Nothing the next token reads is released: a sliding-window table's null
    prefix is at most `released_swa_blocks(processed)` long."""
    view = now.block_pool
    found = []
    for request, table in swa_tables(view):
        released = null_prefix_length(table)
        allowed = released_swa_blocks(request.processed, view.window, view.block_size)
        if released > allowed:
            found.append(Violation("BLOCK-5", f"request {request.rid}: {released} leading SWA blocks released, but "
                                              f"after {request.processed} tokens the window (W={view.window}) "
                                              f"reads from block {allowed}: {list(table)}"))
    return found


@invariant("BLOCK-6", "window-bound")
def window_release_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-6] Everything the next token does not read is released at each allocation:
    the null prefix is exactly `released_swa_blocks(processed)` long, so the table holds
    `held_swa_blocks` real blocks, at most `swa_block_bound(window, slots - processed)`."""
    view = now.block_pool
    found = []
    for request, table in swa_tables(view):
        released = null_prefix_length(table)
        due = released_swa_blocks(request.processed, view.window, view.block_size)
        held = len(table) - released
        bound = swa_block_bound(view.window, max(0, request.slots - request.processed), view.block_size)
        if released < due or held > bound:
            found.append(Violation("BLOCK-6", f"request {request.rid}: holds {held} SWA blocks ({released} released, "
                                              f"{due} due after {request.processed} tokens; at most {bound} for "
                                              f"{request.slots - request.processed} new tokens): {list(table)}"))
    return found


@invariant("BLOCK-7", "mapping")
def cache_map_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-7] The prefix-cache map and the blocks agree: each entry's block carries its
    key, each cached block has its entry, and a cached block held by a table is held by a
    table of its key's group."""
    view = now.block_pool
    found = []
    entries = set(view.cache_map)
    for key_hash, group, block in sorted(entries):
        if not 0 <= block < len(view.blocks):
            found.append(Violation("BLOCK-7", f"cache entry ({key_hash:#x}, group {group}) names block {block}, "
                                              f"not a block of the pool"))
        elif view.blocks[block].block_hash != (key_hash, group):
            found.append(Violation("BLOCK-7", f"cache entry ({key_hash:#x}, group {group}) names block {block}, "
                                              f"whose key is {view.blocks[block].block_hash}"))
    for _, block in shown_blocks(view):
        if block.block_hash is not None and (*block.block_hash, block.block_id) not in entries:
            found.append(Violation("BLOCK-7", f"block {block.block_id} is cached as {block.block_hash} but the map "
                                              f"has no such entry"))
    for request in view.requests:
        for group, table in enumerate(request.tables):
            for block in table:
                key = view.blocks[block].block_hash if 0 <= block < len(view.blocks) else None
                if block != NULL_BLOCK and key is not None and key[1] != group:
                    found.append(Violation("BLOCK-7", f"request {request.rid}: block {block} of its group {group} "
                                                      f"table is cached for group {key[1]}"))
    return found


@invariant("BLOCK-8", "mapping", reads={"kv_events"})
def event_replay_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-8] Replaying the engine's KV events (stored, removed, all cleared) gives the
    prefix-cache map's keys, each as many times as the map holds it: a consumer of the
    events alone knows what is cached."""
    view = now.block_pool
    if view is None or view.replayed_map is None:
        return []
    replayed = {(h, g): count for h, g, count in view.replayed_map}
    mapped = dict(Counter((h, g) for h, g, _ in view.cache_map))
    differ = sorted(key for key in replayed.keys() | mapped.keys() if replayed.get(key, 0) != mapped.get(key, 0))
    if not differ:
        return []
    shown = ", ".join(f"({h:#x}, group {g}): events {replayed.get((h, g), 0)}, map {mapped.get((h, g), 0)}"
                      for h, g in differ[:4])
    return [Violation("BLOCK-8", f"replaying the KV events does not give the map: {len(differ)} keys differ; {shown}")]


@invariant("BLOCK-9", "mapping")
def uncached_full_block_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-9] The full-attention group caches every whole block a request has slots
    for: the first `floor(slots / block_size)` entries of a full table carry a key, so a
    later request with the same prefix can hit them."""
    view = now.block_pool
    found = []
    for request in view.requests:
        for group, table in enumerate(request.tables):
            if view.groups[group] != FULL:
                continue
            whole = min(len(table), request.slots // view.block_size)
            if uncached := [block for block in table[:whole] if view.blocks[block].block_hash is None]:
                found.append(Violation("BLOCK-9", f"request {request.rid}: whole blocks {uncached} of its {FULL} "
                                                  f"table ({request.slots} slots) are not cached: {list(table)}"))
    return found


@invariant("BLOCK-9", "mapping", reads={"rows"})
def block_prefix_hit_violations(previous: BlockPoolSnapshot, step: Step | None,
                                now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-9] An admission adopts a prefix hit of whole blocks, shorter than the
    request's tokens (the last one is always computed, for its logits: LIFE-3), and only
    blocks cached for their group: each real entry of the hit carries a key."""
    if step is None or step.operation != EngineOperation.ADMIT or step.outcome != "ok":
        return []
    view = now.block_pool
    row = next((r for r in now.requests if r.rid == step.rid), None)
    if row is None:
        return []
    found = []
    hit = row.kv_committed_len
    if hit % view.block_size or hit >= row.seq_len:
        found.append(Violation("BLOCK-9", f"request {row.rid} is admitted with a hit of {hit} tokens: not whole "
                                          f"blocks of {view.block_size}, or not short of its {row.seq_len} tokens"))
    for request in view.requests:
        if request.rid != row.rid:
            continue
        for group, table in enumerate(request.tables):
            adopted = [block for block in table[:hit // view.block_size] if block != NULL_BLOCK]
            if uncached := [block for block in adopted if view.blocks[block].block_hash is None]:
                found.append(Violation("BLOCK-9", f"request {row.rid}: its hit adopts blocks {uncached} of group "
                                                  f"{group} that are not cached: {list(table)}"))
    return found


def tables_of(view: BlockPoolView) -> dict[str, tuple[tuple[int, ...], ...]]:
    return {request.rid: request.tables for request in view.requests}


@invariant("BLOCK-10", "mapping")
def eviction_order_violations(previous: BlockPoolSnapshot, step: Step | None,
                              now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-10] From one view of the free queue to the next: the blocks free in both keep
    their order; an allocation took its new blocks from the head; a release put the blocks
    it freed without a key before every block that was free, and those with a key after
    every one, in `release_order` (in a group the policy's `uncached_first` does not name,
    every block it freed after every one, in `release_order`); an eviction dropped the keys of each group's least
    recently used cached free blocks. Which uncached blocks stand at the head, and in what
    order, is open. (A partial view shows free blocks by id, not in queue order: not read.)"""
    before, after = previous.block_pool, now.block_pool
    if isinstance(before.blocks, PartialBlocks) or isinstance(after.blocks, PartialBlocks):
        return []
    found = []
    # a block freed in a group the policy does not name in `uncached_first` goes to the tail, as a cached one
    tail_anyway = {block for tables in tables_of(before).values() for group, table in enumerate(tables)
                   if before.groups[group] not in now.config.policy.uncached_first for block in table}
    position = {block: index for index, block in enumerate(before.free_queue)}
    still = [block for block in after.free_queue if block in position]
    if still != sorted(still, key=position.__getitem__):
        found.append(Violation("BLOCK-10", f"blocks free before and after the step changed their order in the free "
                                           f"queue: {[b for b in before.free_queue if b in set(still)]} became {still}"))
    old_at = [index for index, block in enumerate(after.free_queue) if block in position]
    for index, block in enumerate(after.free_queue):
        if block in position:
            continue
        cached = after.blocks[block].block_hash is not None or block in tail_anyway
        if cached and old_at and index < old_at[-1]:
            what = "with a key" if block not in tail_anyway else "(its group queues every freed block at the tail)"
            found.append(Violation("BLOCK-10", f"block {block} was freed {what} but stands before block "
                                               f"{after.free_queue[old_at[-1]]}, which was free already: a cached "
                                               f"block goes to the tail, after every free block"))
        elif not cached and old_at and index > old_at[0]:
            found.append(Violation("BLOCK-10", f"block {block} was freed without a key but stands after block "
                                               f"{after.free_queue[old_at[0]]}, which was free already: an uncached "
                                               f"block goes to the head, before every free block"))
    current = tables_of(after)
    released = [block for rid, tables in sorted(tables_of(before).items())
                for block in release_order(tables, current.get(rid, ()))]
    rank = {block: index for index, block in enumerate(released)}
    freed = [block for block in after.free_queue if block not in position and block in rank
             and (after.blocks[block].block_hash is not None or block in tail_anyway)]
    if freed != sorted(freed, key=rank.__getitem__):
        found.append(Violation("BLOCK-10", f"the cached blocks a release freed are queued as {freed}, not in release "
                                           f"order {[b for b in released if b in set(freed)]} (each table from its "
                                           f"last entry back)"))
    free_now = set(after.free_queue)
    first_kept = next((index for index, block in enumerate(before.free_queue) if block in free_now), len(position))
    for index, block in enumerate(before.free_queue):
        key = before.blocks[block].block_hash
        hit = key is not None and after.blocks[block].block_hash == key
        if block not in free_now and not hit and index > first_kept:
            found.append(Violation("BLOCK-10", f"block {block} was taken for new KV from position {index} of the free "
                                               f"queue, behind block {before.free_queue[first_kept]}, which is still "
                                               f"free: an allocation takes the queue's head"))
    for group in range(len(after.groups)):
        cached = [block for block in before.free_queue if block in free_now
                  and (before.blocks[block].block_hash or (None, None))[1] == group]
        dropped = [after.blocks[block].block_hash is None for block in cached]
        if dropped != sorted(dropped, reverse=True):
            found.append(Violation("BLOCK-10", f"an eviction dropped the keys of group {group}'s cached free blocks "
                                               f"{[b for b, d in zip(cached, dropped) if d]} but kept those of "
                                               f"{[b for b, d in zip(cached, dropped) if not d]}, some of them less "
                                               f"recently used: {cached}"))
    return found

