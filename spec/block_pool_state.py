"""Recurrent state in a shared block pool [STATE-10 .. STATE-14]: chapter 09 in vLLM's form.

vLLM keeps a recurrent (Mamba) layer group in the same block pool as its attention
groups: a state is one block, a request has a positional table in the state group as
in every group (entry `i` stands for tokens `[i * G, (i + 1) * G)`, `G` the state
group's block size), and in its "align" mode (the only one with prefix caching) the
table holds real blocks only where a state is kept: the running state, the state it was
copied from at the last step, and states cached at block boundaries; every other entry
is the null block. A prefix hit of the state group is a cached state block whose key
ends exactly at the hit.

The checks of chapter 08 read the attention part of the pool: a `BlockPoolStateSnapshot`
shows, as its `block_pool`, a partial view (OBS-4) of every block less those the state
group holds or caches, with the attention groups' tables and cache entries only, so
BLOCK-1 .. BLOCK-8 read exactly what they read of an engine without state. The state
group's blocks are in its `state` (`BlockStateView`), and these predicates check them.

A state's content is the stand-in of chapter 09 (`state_digest`): the adapter plays the
model, writing into a block at each forward the state it computes from the block vLLM's
worker reads (the entry the request last wrote) and following the copies vLLM asks for.
"""

from collections import Counter
from dataclasses import dataclass, field

from .block_pool import FULL, NULL_BLOCK, BlockPoolSnapshot, block_pool_observables, drained_violations
from .lifecycle import EngineOperation
from .notation import Violation
from .pages import pages_for
from .registry import invariant
from .snapshot import Step
from .state import StateValue, describe_state, state_digest


@dataclass(frozen=True)
class StateBlock:
    """[STATE-11, STATE-13] One block of the state group: how many tables hold it, its key, and its state."""

    block_id: int
    ref_cnt: int
    key: tuple[int, int] | None
    """(hash, group id) while it is cached, else None."""
    key_length: int | None
    """The tokens its key stands for (a whole block's, or fewer for a sub-block key)."""
    value: StateValue | None
    """[STATE-11] What its state has read, as the model wrote it; None: never written."""
    promised: StateValue | None
    """[STATE-11] What its key says it has read: the state of its key's tokens (None: not cached)."""


@dataclass(frozen=True)
class StateTable:
    """[STATE-10] A request's table in the state group, and the tokens it knows."""

    rid: str
    table: tuple[int, ...]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class BlockStateView:
    """[STATE-10] Everything observable of the state group of a shared block pool."""

    group: int
    """The state group's id."""
    block_size: int
    """G: tokens per entry of a state table."""
    hit_alignment: int
    """Tokens a prefix hit is a multiple of (G, or the hash block in vLLM's sub-block mode)."""
    blocks: tuple[StateBlock, ...]
    """Every block the state group holds or caches."""
    free_blocks: tuple[int, ...]
    """Those of them in the pool's free queue."""
    tables: tuple[StateTable, ...]
    cache_map: tuple[tuple[int, int], ...]
    """(hash, block id) of the prefix cache's entries for the state group."""
    replayed_map: tuple[tuple[int, int], ...] | None
    """(hash, count) for the state group from replaying the KV events; None: no events."""
    blocks_per_request: int
    """[STATE-14] The engine's own sizing: the real state blocks one request holds at most."""


@dataclass(frozen=True)
class BlockPoolStateSnapshot(BlockPoolSnapshot):
    """[OBS-1, STATE-13] A shared-block-pool engine with a recurrent-state group: chapter 08's
    snapshot of its attention groups (a partial view less the state group's blocks) and
    the state group."""

    state: BlockStateView = field(kw_only=True)


def running_entry(computed: int, block_size: int) -> int:
    """[STATE-10] The entry of a state table that holds the running state after
    `computed` tokens: the one whose tokens the last computed token is in.

    pre: computed >= 1 and block_size >= 1
    post: 0 <= __return__ < computed
    post: __return__ * block_size < computed <= (__return__ + 1) * block_size
    """
    return pages_for(computed, block_size) - 1


def key_fits_entry(key_length: int, entry: int, block_size: int, alignment: int) -> bool:
    """[STATE-10] Whether a state cached under a key of `key_length` tokens may stand at
    `entry`: the key ends within the entry's tokens, on the hit alignment.

    pre: block_size >= 1 and alignment >= 1
    """
    return entry * block_size < key_length <= (entry + 1) * block_size and key_length % alignment == 0


def state_blocks(view: BlockStateView) -> dict[int, StateBlock]:
    return {block.block_id: block for block in view.blocks}


# -- invariants ------------------------------------------------------------------------

@invariant("STATE-10", "alignment", reads={"rows"})
def state_table_violations(now: BlockPoolStateSnapshot) -> list[Violation]:
    """[STATE-10] Exactly the requests that hold KV have a state table, of
    `cdiv(kv_allocated_len, G)` entries; after `c` computed tokens its entry
    `running_entry(c)` is a real block (the running state), and every other real entry
    is either the one block the running state was copied from or a cached state whose
    key ends within that entry, on the hit alignment. The rest is the null block."""
    view, found = now.state, []
    rows = {r.rid: r for r in now.requests}
    blocks = state_blocks(view)
    tabled = {t.rid for t in view.tables}
    for rid in sorted(set(rows) - tabled):
        if rows[rid].kv_allocated_len:
            found.append(Violation("STATE-10", f"request {rid} holds KV but no state table"))
    for t in view.tables:
        row = rows.get(t.rid)
        if row is None:
            if any(block != NULL_BLOCK for block in t.table):
                found.append(Violation("STATE-10", f"request {t.rid} holds no KV but state blocks {list(t.table)}"))
            continue
        want = pages_for(row.kv_allocated_len, view.block_size)
        if len(t.table) != want:
            found.append(Violation("STATE-10", f"request {t.rid}: its state table has {len(t.table)} entries for "
                                               f"{row.kv_allocated_len} slots (expected {want}): {list(t.table)}"))
        computed = row.kv_committed_len
        running = running_entry(computed, view.block_size) if computed else None
        if running is not None and (running >= len(t.table) or t.table[running] == NULL_BLOCK):
            found.append(Violation("STATE-10", f"request {t.rid}: after {computed} tokens its running state "
                                               f"(entry {running}) is not a real block: {list(t.table)}"))
        uncached = []
        for entry, block_id in enumerate(t.table):
            if block_id == NULL_BLOCK or entry == running:
                continue
            block = blocks.get(block_id)
            if block is None or block.key is None:
                uncached.append(entry)
            elif not key_fits_entry(block.key_length, entry, view.block_size, view.hit_alignment):
                found.append(Violation("STATE-10", f"request {t.rid}: entry {entry} holds block {block_id}, cached "
                                                   f"for {block.key_length} tokens, not a state of that entry"))
        if len(uncached) > 1:
            found.append(Violation("STATE-10", f"request {t.rid}: entries {uncached} hold uncached states besides "
                                               f"the running one (at most its copy source): {list(t.table)}"))
    return found


@invariant("STATE-11", "state", reads={"rows"})
def block_state_violations(now: BlockPoolStateSnapshot) -> list[Violation]:
    """[STATE-11] A request's running state has read exactly its computed tokens, and a
    cached state block has read exactly the tokens of its key."""
    view, found = now.state, []
    rows = {r.rid: r for r in now.requests}
    blocks = state_blocks(view)
    for t in view.tables:
        row = rows.get(t.rid)
        if row is None or not row.kv_committed_len:
            continue
        entry = running_entry(row.kv_committed_len, view.block_size)
        if entry >= len(t.table) or t.table[entry] == NULL_BLOCK or t.table[entry] not in blocks:
            continue  # STATE-10
        value, want = blocks[t.table[entry]].value, row.kv_committed_len
        if value is None or (value.length, value.digest) != (want, state_digest(t.tokens[:want])):
            found.append(Violation("STATE-11", f"request {t.rid} computed {want} tokens but its running state "
                                               f"(block {t.table[entry]}) is the state of "
                                               f"{'nothing written' if value is None else describe_state(value, t.tokens)}"))
    for block in view.blocks:
        if block.promised is None:
            continue
        value = block.value
        if value is None or (value.length, value.digest) != (block.promised.length, block.promised.digest):
            found.append(Violation("STATE-11", f"block {block.block_id} is cached as the state of "
                                               f"{block.promised.length} tokens but has read "
                                               f"{'nothing' if value is None else f'{value.length} tokens'}"
                                               + ("" if value is None or value.length != block.promised.length
                                                  else " that are not those")))
    return found


@invariant("STATE-12", "state", reads={"rows"})
def state_hit_violations(previous: BlockPoolStateSnapshot, step: Step,
                         now: BlockPoolStateSnapshot) -> list[Violation]:
    """[STATE-12] A prefix hit of `h` tokens is on the hit alignment, ends at a cached
    state block whose key stands for exactly `h` tokens (the last entry of the request's
    state table holds it; for a sub-block hit, `h` not a multiple of G, a private copy
    of it, copy-on-write), and is no longer than the full-attention group's cached
    prefix: the hit of several groups is their minimum."""
    if step.operation != EngineOperation.ADMIT or step.outcome != "ok":
        return []
    row = next((r for r in now.requests if r.rid == step.rid), None)
    if row is None or not row.kv_committed_len:
        return []
    view, hit, found = now.state, row.kv_committed_len, []
    if hit % view.hit_alignment:
        found.append(Violation("STATE-12", f"request {row.rid}: a {hit}-token hit, off the hit alignment "
                                           f"{view.hit_alignment}"))
    entry = next((t for t in view.tables if t.rid == row.rid), None)
    table = entry.table if entry is not None else ()
    blocks = state_blocks(view)
    block = blocks.get(table[-1]) if table else None
    want = state_digest(entry.tokens[:hit]) if entry is not None else None
    copied = hit % view.block_size and block is not None and block.key is None and any(
        b.key_length == hit and b.promised is not None and b.promised.digest == want for b in view.blocks)
    if not copied and (block is None or block.key is None or block.key_length != hit):
        found.append(Violation("STATE-12", f"request {row.rid}: a {hit}-token hit, but its state table {list(table)} "
                                           f"does not end at a state cached for {hit} tokens"
                                           + ("" if block is None or block.key is None
                                              else f" (block {block.block_id} is cached for {block.key_length})")))
    pool = now.block_pool
    tables = next((r.tables for r in pool.requests if r.rid == row.rid), None)
    if tables is not None and FULL in pool.groups:
        full = tables[pool.groups.index(FULL)]
        whole = hit // pool.block_size
        uncached = [i for i, b in enumerate(full[:whole]) if b == NULL_BLOCK or pool.blocks[b].block_hash is None]
        if len(full) < whole or uncached:
            found.append(Violation("STATE-12", f"request {row.rid}: a {hit}-token hit, longer than the full "
                                               f"group's cached prefix (entries {uncached} of {list(full)} uncached)"))
    return found


@invariant("STATE-13", "ownership")
def state_reference_violations(now: BlockPoolStateSnapshot) -> list[Violation]:
    """[STATE-13] A state block's reference count is the number of state-table entries
    that hold it, it is free exactly when that is 0, no attention table holds it, it is
    cached only for the state group, the state group's cache map and its blocks agree,
    and replaying the KV events gives that map."""
    view, found = now.state, []
    blocks = state_blocks(view)
    references = Counter(b for t in view.tables for b in t.table if b != NULL_BLOCK)
    free = Counter(view.free_blocks)
    attention = {b for r in now.block_pool.requests for table in r.tables for b in table if b != NULL_BLOCK}
    for block_id in sorted(set(references) - set(blocks)):
        found.append(Violation("STATE-13", f"state tables hold block {block_id}, which the state group does not show"))
    for block in view.blocks:
        if block.ref_cnt != references[block.block_id]:
            found.append(Violation("STATE-13", f"state block {block.block_id} has ref count {block.ref_cnt} but "
                                               f"{references[block.block_id]} state-table entries hold it"))
        if (free[block.block_id] > 0) != (block.ref_cnt == 0) or free[block.block_id] > 1:
            found.append(Violation("STATE-13", f"state block {block.block_id} has ref count {block.ref_cnt} and is "
                                               f"{free[block.block_id]} times in the free queue"))
        if block.block_id in attention:
            found.append(Violation("STATE-13", f"state block {block.block_id} is also held by an attention table"))
        if block.key is not None and block.key[1] != view.group:
            found.append(Violation("STATE-13", f"state block {block.block_id} is cached for group {block.key[1]}"))
    entries = set(view.cache_map)
    for key_hash, block_id in sorted(entries):
        block = blocks.get(block_id)
        if block is None or block.key != (key_hash, view.group):
            found.append(Violation("STATE-13", f"state cache entry {key_hash:#x} names block {block_id}, whose key "
                                               f"is {None if block is None else block.key}"))
    for block in view.blocks:
        if block.key is not None and (block.key[0], block.block_id) not in entries:
            found.append(Violation("STATE-13", f"state block {block.block_id} is cached as {block.key} but the map "
                                               f"has no such entry"))
    if view.replayed_map is not None:
        replayed = {h: count for h, count in view.replayed_map if count}
        mapped = dict(Counter(h for h, _ in view.cache_map))
        if replayed != mapped:
            differ = sorted(k for k in replayed.keys() | mapped.keys() if replayed.get(k, 0) != mapped.get(k, 0))
            found.append(Violation("STATE-13", f"replaying the state group's KV events does not give its map: "
                                               f"{len(differ)} keys differ"))
    return found


@invariant("STATE-14", "leak")
def state_sizing_violations(now: BlockPoolStateSnapshot) -> list[Violation]:
    """[STATE-14] The engine's own sizing holds: a request's state table holds at most
    `blocks_per_request` real blocks (vLLM's align mode budgets the running state and
    the state it is copied from)."""
    view = now.state
    return [Violation("STATE-14", f"request {t.rid} holds {held} state blocks, more than the engine budgets "
                                  f"({view.blocks_per_request}): {list(t.table)}")
            for t in view.tables if (held := sum(b != NULL_BLOCK for b in t.table)) > view.blocks_per_request]


def block_pool_state_observables(snapshot: BlockPoolStateSnapshot, outcome: str) -> dict:
    """[OBS-3] What the spec fixes after a step of a shared-block-pool engine with state:
    chapter 08's observables (its free blocks count the free state blocks too)."""
    return block_pool_observables(snapshot, outcome)


def block_pool_state_drained_violations(snapshot: BlockPoolStateSnapshot) -> list[Violation]:
    """[BLOCK-1, STATE-13] With every request released, every real block is free, the
    state group's too."""
    found = drained_violations(snapshot)
    held = [block.block_id for block in snapshot.state.blocks if block.ref_cnt]
    if held:
        found.append(Violation("STATE-13", f"state blocks {held} are still held (leak)"))
    return found
