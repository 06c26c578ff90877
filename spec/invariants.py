"""Engine invariants [I1 .. I16]: predicates over an `EngineSnapshot`, and their registry.

Each invariant is one function returning the `Violation`s it finds (empty: it holds).
State invariants read the snapshot `now`; transition invariants (`needs_previous`) read
`(previous, step, now)`. `engine_violations` runs the whole registry after one step.

Notation: W = config.window, P = config.page_size; for a request, e = swa_evicted_seqlen
(the SWA cursor), cpl = cache_protected_len, L = kv_allocated_len, C = kv_committed_len,
and its dead range is [cpl, max(e, cpl)): SWA KV the request released itself.

Who holds what (for the allocator invariants I1-I6 of spec/accounting.py, reused here):
  * a request privately holds positions [cpl, L): `HeldSequence(row[cpl:L], start=cpl,
    swa_live_from=max(e, cpl))`;
  * each non-root node holds its full value at positions [start, end), with live SWA on
    all of them, or on none for an SWA tombstone (swa_value None).
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import wraps
from typing import Any

from . import block_pool
from .accounting import (
    HeldSequence,
    alignment_violations,
    conservation_violations,
    free_list_violations,
    held_full_pages,
    held_swa_pages,
    mapping_violations,
    ownership_violations,
    pending_violations,
)
from .notation import Position, SlotId, Violation
from .pages import ceil_page
from .snapshot import EngineSnapshot, NodeView, RequestView, Step
from .window import (
    decode_window_bound,
    eviction_frontier,
    eviction_span_bound,
    insert_keeps_window,
    retention,
    swa_match_length,
)

INVARIANT_CLASSES = ("alignment", "window-liveness", "window-bound", "leak", "mapping", "ownership", "locks", "atomicity")
EVICTING_OPERATIONS = ("evict", "prefill_chunk", "decode", "admit", "pd_admit")
"""Steps that may evict tree data and release no lock before they do (I14)."""


# -- reading a snapshot --------------------------------------------------------------------

def node_index(snapshot: EngineSnapshot) -> dict[int, NodeView]:
    """The nodes by id (the first of duplicate ids; I13 reports duplicates)."""
    by_id: dict[int, NodeView] = {}
    for node in snapshot.nodes:
        by_id.setdefault(node.node_id, node)
    return by_id


def non_root_nodes(snapshot: EngineSnapshot) -> list[NodeView]:
    return [node for node in snapshot.nodes if node.parent is not None]


def path_to(nodes: dict[int, NodeView], node_id: int | None) -> list[NodeView]:
    """The non-root nodes from the root's child down to `node_id`; empty for the root or
    None. Stops at a missing parent or a cycle (I13 reports both)."""
    path, seen = [], set()
    current = nodes.get(node_id) if node_id is not None else None
    while current is not None and current.parent is not None and current.node_id not in seen:
        seen.add(current.node_id)
        path.append(current)
        current = nodes.get(current.parent)
    path.reverse()
    return path


def find_request(snapshot: EngineSnapshot, rid: str | None) -> RequestView | None:
    return next((request for request in snapshot.requests if request.rid == rid), None)


def mapping_at(snapshot: EngineSnapshot, full_slot: SlotId) -> SlotId | None:
    """mapping[full_slot], or None for a slot outside the mapping."""
    mapping = snapshot.allocator.mapping
    return mapping[full_slot] if 0 <= full_slot < len(mapping) - 1 else None


def slot_pairs(node: NodeView, values: tuple[SlotId, ...]) -> list[tuple[Position, SlotId]]:
    """(position, slot) of each token of a node."""
    return list(zip(range(node.start, node.end), values))


def request_holding(r: RequestView) -> HeldSequence:
    """What a request holds privately: positions [cpl, L), with live SWA from max(e, cpl)."""
    return HeldSequence(tuple(r.row[r.cache_protected_len:r.kv_allocated_len]), r.cache_protected_len, r.swa_live_from)


def node_holding(node: NodeView) -> HeldSequence:
    """What a node holds: its full value, with live SWA on all of it or, for an SWA
    tombstone, on none."""
    return HeldSequence(node.full_value, node.start, node.start if node.swa_value is not None else node.end)


def per_snapshot(function: Callable[[EngineSnapshot], Any]) -> Callable[[EngineSnapshot], Any]:
    """Remember a function of one snapshot for the last snapshot it was given: several
    checks read the same holders after each step. Snapshots are immutable, so this
    changes no result (and holding the last one keeps its identity from being reused)."""
    last: list = [None, None]

    @wraps(function)
    def remembered(snapshot: EngineSnapshot):
        if last[0] is not snapshot:
            last[:] = snapshot, function(snapshot)
        return last[1]

    return remembered


@per_snapshot
def holders(snapshot: EngineSnapshot) -> tuple[tuple[str, HeldSequence], ...]:
    """Who holds what (module docstring), each holder named for messages."""
    return (*((f"request {r.rid}", request_holding(r)) for r in snapshot.requests),
            *((f"node {node.node_id}", node_holding(node)) for node in non_root_nodes(snapshot)))


@per_snapshot
def held_sequences(snapshot: EngineSnapshot) -> tuple[HeldSequence, ...]:
    """[OBS-1] What every holder holds: requests their private positions, nodes theirs."""
    return tuple(sequence for _, sequence in holders(snapshot))


@per_snapshot
def held_pages(snapshot: EngineSnapshot) -> tuple[list, list]:
    """The full and the SWA pages every holder holds, each once per holder (I2-I4)."""
    sequences, page_size = held_sequences(snapshot), snapshot.config.page_size
    return held_full_pages(sequences, page_size), held_swa_pages(sequences, snapshot.allocator.mapping, page_size)


# -- allocator invariants over the engine's holders (spec/accounting.py) -------------------

def engine_free_list_violations(now: EngineSnapshot) -> list[Violation]:
    """[I1] Both free lists: no duplicate, no padding page, only pages of the pool."""
    pools = (now.allocator.full, now.allocator.swa)
    return [v for pool in pools for v in free_list_violations(pool) if v.clause == "I1"]


def full_conservation_violations(now: EngineSnapshot) -> list[Violation]:
    """[I2] free + pending + held full pages == all full pages; requests hold [cpl, L),
    nodes their full values."""
    return conservation_violations(now.allocator.full, held_pages(now)[0], "I2")


def swa_conservation_violations(now: EngineSnapshot) -> list[Violation]:
    """[I3] free + pending + held SWA pages == all SWA pages; requests hold the peers of
    [max(e, cpl), L), non-tombstone nodes the peers of their full values."""
    return conservation_violations(now.allocator.swa, held_pages(now)[1], "I3")


def engine_ownership_violations(now: EngineSnapshot) -> list[Violation]:
    """[I4] Each held page, full or SWA, has one holder (a request or a node) and is not free."""
    full, swa = held_pages(now)
    return [*ownership_violations(now.allocator.full, full), *ownership_violations(now.allocator.swa, swa)]


def engine_mapping_violations(now: EngineSnapshot) -> list[Violation]:
    """[I5] Live-SWA positions of requests and nodes map to allocated SWA slots,
    injectively and page-in-step; every other full slot maps to 0."""
    allocator = now.allocator
    return mapping_violations(allocator.mapping, allocator.size_full, now.config.page_size, held_sequences(now), allocator.swa)


def engine_alignment_violations(now: EngineSnapshot) -> list[Violation]:
    """[I6] Held slots sit at their positions' in-page offsets (accounting); cpl and e are
    multiples of P for every request; every non-root node holds a non-empty key of whole
    pages from a page boundary."""
    found, page_size = [], now.config.page_size
    for name, sequence in holders(now):
        found.extend(Violation("I6", v.message.replace("sequence 0", name, 1)) for v in alignment_violations([sequence], page_size))
    for r in now.requests:
        for field, value in (("cache_protected_len", r.cache_protected_len), ("SWA cursor", r.swa_evicted_seqlen)):
            if value % page_size != 0:
                found.append(Violation("I6", f"request {r.rid}: {field} {value} is not a multiple of page size {page_size}"))
    for node in non_root_nodes(now):
        if len(node.key) == 0 or len(node.key) % page_size != 0 or node.start % page_size != 0:
            found.append(Violation("I6", f"node {node.node_id}: {len(node.key)} tokens at position {node.start}, not whole pages from a page start"))
    return found


def free_group_violations(now: EngineSnapshot) -> list[Violation]:
    """[I16] No page waits twice in an open free group (the rest of I16 is I1-I5, which
    count pending pages)."""
    return [*pending_violations(now.allocator.full), *pending_violations(now.allocator.swa)]


# -- cursors --------------------------------------------------------------------------------

def cursor_bound_violations(now: EngineSnapshot) -> list[Violation]:
    """[I7] For every request: the row has L slots, C <= L and e <= L."""
    found = []
    for r in now.requests:
        if len(r.row) != r.kv_allocated_len:
            found.append(Violation("I7", f"request {r.rid}: row holds {len(r.row)} slots, kv_allocated_len is {r.kv_allocated_len}"))
        for field, value in (("kv_committed_len", r.kv_committed_len), ("SWA cursor", r.swa_evicted_seqlen)):
            if value > r.kv_allocated_len:
                found.append(Violation("I7", f"request {r.rid}: {field} {value} is beyond kv_allocated_len {r.kv_allocated_len}"))
    return found


def cursor_monotonicity_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I7] For every request in both snapshots, neither e nor cpl decreases, and a cursor
    that advanced is at least the previous cpl (it is raised to the protected length
    before anything is freed)."""
    found = []
    for after in now.requests:
        before = find_request(previous, after.rid)
        if before is None:
            continue
        for field in ("swa_evicted_seqlen", "cache_protected_len"):
            if getattr(after, field) < getattr(before, field):
                found.append(Violation("I7", f"request {after.rid}: {field} moved back from {getattr(before, field)} to {getattr(after, field)}"))
        if before.swa_evicted_seqlen < after.swa_evicted_seqlen < before.cache_protected_len:
            found.append(Violation("I7", f"request {after.rid}: SWA cursor advanced to {after.swa_evicted_seqlen}, "
                                         f"below the previous cache_protected_len {before.cache_protected_len}"))
    return found


# -- window liveness and bounds -------------------------------------------------------------

def dead_swa_reason(now: EngineSnapshot, r: RequestView, path: list[NodeView], position: Position) -> str | None:
    """Why a position of request r has no live SWA KV, or None if it has."""
    if position >= r.cache_protected_len:
        if position < r.swa_live_from:
            return f"is in the request's released range [{r.cache_protected_len}, {r.swa_live_from})"
        if position >= len(r.row):
            return "has no slot in the row"
        peer = mapping_at(now, r.row[position])
        if peer is None or peer <= 0:
            return f"sits at full slot {r.row[position]}, which has no SWA peer (mapping {peer})"
        return None
    for node in path:
        if node.start <= position < node.end:
            return None if node.swa_value is not None else f"lies in SWA tombstone node {node.node_id} [{node.start}, {node.end})"
    return f"is below cache_protected_len {r.cache_protected_len}, but no node of the request's path covers it"


def window_liveness_violations(now: EngineSnapshot) -> list[Violation]:
    """[I8] Every position p in the window [max(0, C - W), C) of every request has live
    SWA KV: if p >= cpl, p is outside the dead range and mapping[row[p]] > 0; if p < cpl,
    the node of the request's path (root to last_node) that covers p is not a tombstone.
    The same for position L - 1 when L > 0: the next allocation continues from it."""
    found, nodes = [], node_index(now)
    for r in now.requests:
        path = path_to(nodes, r.last_node)
        window_start = max(0, r.kv_committed_len - now.config.window)
        checks = [(f"inside the window [{window_start}, {r.kv_committed_len})", range(window_start, r.kv_committed_len))]
        if r.kv_allocated_len > 0 and not window_start <= r.kv_allocated_len - 1 < r.kv_committed_len:
            checks.append(("the last allocated position, which the next allocation continues from", [r.kv_allocated_len - 1]))
        for where, positions in checks:
            dead = []
            for position in positions:
                reason = dead_swa_reason(now, r, path, position)
                if reason is not None:
                    dead.append((position, reason))
            if dead:
                more = f" (and {len(dead) - 1} more)" if len(dead) > 1 else ""
                found.append(Violation("I8", f"request {r.rid}: position {dead[0][0]}, {where}, {dead[0][1]}{more}"))
    return found


def decode_read_window_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I8] A decode step reads the window [max(0, C - W), C) of the committed length C it
    started from, after its own window eviction ran: every position of it is still live
    when the step ends. (The window of `now` starts one position later, so a frontier one
    token into the window escapes the check of `now` alone.)"""
    if step is None or step.operation != "decode" or step.outcome != "ok" or step.rid is None:
        return []
    before, after = find_request(previous, step.rid), find_request(now, step.rid)
    if before is None or after is None:
        return []
    path = path_to(node_index(now), after.last_node)
    start = max(0, before.kv_committed_len - now.config.window)
    dead = [(position, reason) for position in range(start, before.kv_committed_len)
            if (reason := dead_swa_reason(now, after, path, position)) is not None]
    if not dead:
        return []
    more = f" (and {len(dead) - 1} more)" if len(dead) > 1 else ""
    return [Violation("I8", f"request {step.rid}: position {dead[0][0]}, inside the window [{start}, "
                            f"{before.kv_committed_len}) this decode step read, {dead[0][1]}{more}")]


def decode_window_bound_violations(now: EngineSnapshot) -> list[Violation]:
    """[I9] A decoding request privately holds at most decode_window_bound(version, W, P, I)
    SWA slots, ceil_page(L) - max(e, cpl); one page more before its third decode step
    (the first never evicts). Without prefix sharing the first decode step is not
    bounded: the last extend evicted before its own chunk was allocated."""
    found, config, policy = [], now.config, now.config.policy
    bound = decode_window_bound(policy.version, config.window, config.page_size, policy.decode_eviction_interval)
    for r in now.requests:
        if r.decode_steps < 1 or (r.decode_steps < 2 and not policy.supports_prefix_sharing):
            continue
        allowed = bound + (config.page_size if r.decode_steps < 3 else 0)
        held = ceil_page(r.kv_allocated_len, config.page_size) - r.swa_live_from
        if held > allowed:
            found.append(Violation("I9", f"request {r.rid}: holds {held} private SWA slots (positions {r.swa_live_from}.."
                                         f"{r.kv_allocated_len - 1}) after {r.decode_steps} decode steps, more than {allowed}"))
    return found


def chunk_step(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> tuple[RequestView, RequestView] | None:
    """The request (before, after) of an ok prefill chunk of a request still in prefill
    before it, checkpointed into a prefix-sharing tree; None for any other step."""
    if step is None or step.operation != "prefill_chunk" or step.outcome != "ok" or not now.config.policy.supports_prefix_sharing:
        return None
    before, after = find_request(previous, step.rid), find_request(now, step.rid)
    if before is None or after is None or before.finished_prefill:
        return None
    return before, after


def insert_cursor(before: RequestView, after: RequestView, now: EngineSnapshot) -> Position | None:
    """The cursor a chunk's checkpoint inserted with. Positions below cpl are the tree's,
    so a cursor at or past the new cpl says nothing of the insert: an implementation may
    raise the cursor to cpl after the insert (WIN-3's bump; SGLang 0.5.23 does after an
    insert it ended early, at a branch point). Then the tree shows it: the start of the
    live SWA run that ends at cpl on the request's path (not before the old cpl). None
    when that cannot be seen (no tree in the snapshot)."""
    end = after.cache_protected_len
    if after.swa_evicted_seqlen < end:
        return after.swa_evicted_seqlen
    path = path_to(node_index(now), after.last_node)
    if not path or path[-1].end != end:
        return None
    start = end
    for node in reversed(path):
        if node.swa_value is None or start <= before.cache_protected_len:
            break
        start = node.start
    return max(start, before.cache_protected_len)


def chunk_window_bound_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I9] After a prefill chunk (chunk_step) with insert end E = cpl, cursor e and the
    previous cpl c0: E - e <= eviction_span_bound(retention, P) if the eviction was not
    clamped, that is, the cursor moved past c0, or the frontier (pre_len = C - 1, the
    previous cursor, c0) was due and not clamped. And the chunk publishes live SWA on
    [max(e, c0), E) only: there every position of the path is live; a live position in
    [c0, e) must have been live before the step, with the same full and SWA slots (a
    node another request inserted). e is the insert's cursor (insert_cursor)."""
    pair = chunk_step(previous, step, now)
    if pair is None:
        return []
    before, after = pair
    config, found = now.config, []
    end, cursor, old_protected = after.cache_protected_len, insert_cursor(before, after, now), before.cache_protected_len
    if cursor is None:
        return []
    span = eviction_span_bound(retention(config.policy.version, config.window, config.page_size), config.page_size)
    pre_len = after.kv_committed_len - 1  # the chunk's key is the first C tokens
    due = eviction_frontier(pre_len, before.swa_evicted_seqlen, old_protected, config.window, config.page_size,
                            config.policy.version) if pre_len >= 0 else None
    if end > 0 and (cursor > old_protected or (due is not None and not due.clamped)) and end - cursor > span:
        found.append(Violation("I9", f"request {after.rid}: the chunk left {end - cursor} live SWA tokens [{cursor}, {end}), more than {span}"))
    live_before = {(position, full_slot, swa_slot) for node in non_root_nodes(previous) if node.swa_value is not None
                   for (position, full_slot), swa_slot in zip(slot_pairs(node, node.full_value), node.swa_value)}
    for node in path_to(node_index(now), after.last_node):
        for index, (position, full_slot) in enumerate(slot_pairs(node, node.full_value)):
            if not old_protected <= position < end:
                continue
            if position >= max(cursor, old_protected) and node.swa_value is None:
                found.append(Violation("I9", f"request {after.rid}: position {position} is in tombstone node {node.node_id}, "
                                             f"inside the chunk's live range [{max(cursor, old_protected)}, {end})"))
                break
            if position < cursor and node.swa_value is not None and (position, full_slot, node.swa_value[index]) not in live_before:
                found.append(Violation("I9", f"request {after.rid}: node {node.node_id} publishes live SWA at position {position} "
                                             f"(full slot {full_slot}), below the cursor {cursor}"))
                break
    return found


def insert_boundary_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I10] After a prefill chunk (chunk_step) with insert end E = cpl > 0:
    insert_keeps_window(E, e, W) when the insert's cursor e (insert_cursor) moved past the
    previous cpl; last_node ends at E; and swa_match_length of its path (root's child to
    last_node) is E: the new leaf is matchable, never all-tombstone."""
    pair = chunk_step(previous, step, now)
    if pair is None or pair[1].cache_protected_len == 0:
        return []
    before, after = pair
    found, nodes, window = [], node_index(now), now.config.window
    end, cursor = after.cache_protected_len, insert_cursor(before, after, now)
    if cursor is not None and cursor > before.cache_protected_len and not insert_keeps_window(end, cursor, window):
        found.append(Violation("I10", f"request {after.rid}: new leaf with live SWA [{cursor}, {end}), fewer than min(W, E) = {min(window, end)}"))
    if after.last_node not in nodes or nodes[after.last_node].end != end:
        depth = nodes[after.last_node].end if after.last_node in nodes else None
        found.append(Violation("I10", f"request {after.rid}: last node {after.last_node} ends at {depth}, not at the insert end {end}"))
    path = path_to(nodes, after.last_node)
    matched = swa_match_length([(len(node.key), node.swa_value is not None) for node in path], window)
    if matched != end:
        found.append(Violation("I10", f"request {after.rid}: a prefix match along its path stops at {matched}, not at the insert end {end}"))
    return found


# -- locks, ledgers, tree -------------------------------------------------------------------

def lock_violations(now: EngineSnapshot) -> list[Violation]:
    """[I11, TREE-4] Lock refs are >= 0; the root has both >= 1; full >= SWA on every
    other node, whose full lock ref is the number of requests whose last_node is it or
    below it; the nodes from each last_node up until min(W, depth) tokens are covered
    have SWA lock >= 1; with no request every non-root lock ref is 0. A request's
    last_node exists and ends at cpl, and row[0:cpl] is the full slots of its path (cpl
    is 0 without a last_node)."""
    found, nodes, window = [], node_index(now), now.config.window
    paths = {r.rid: path_to(nodes, r.last_node) for r in now.requests}
    path_locks = Counter(node.node_id for path in paths.values() for node in path)
    for node in now.nodes:
        locks = f"full lock ref {node.full_lock_ref}, SWA lock ref {node.swa_lock_ref}"
        if node.full_lock_ref < 0 or node.swa_lock_ref < 0:
            found.append(Violation("I11", f"node {node.node_id}: negative lock ref ({locks})"))
        if node.parent is None:
            if node.full_lock_ref < 1 or node.swa_lock_ref < 1:
                found.append(Violation("I11", f"root {node.node_id} is not locked ({locks})"))
            continue
        if node.full_lock_ref < node.swa_lock_ref:
            found.append(Violation("I11", f"node {node.node_id}: full lock ref below the SWA lock ref ({locks})"))
        if node.full_lock_ref != path_locks[node.node_id]:
            found.append(Violation("I11", f"node {node.node_id}: {locks}, but {path_locks[node.node_id]} requests lock a path through it"))
        if not now.requests and node.swa_lock_ref != 0:
            found.append(Violation("I11", f"node {node.node_id}: {locks} with no request running"))
    for r in now.requests:
        if r.last_node is None or r.last_node not in nodes:
            if r.last_node is not None or r.cache_protected_len != 0:
                found.append(Violation("I11", f"request {r.rid}: last node {r.last_node} is not in the tree (cpl {r.cache_protected_len})"))
            continue
        depth = nodes[r.last_node].end
        if depth != r.cache_protected_len:
            found.append(Violation("I11", f"request {r.rid}: last node {r.last_node} ends at {depth}, but cpl is {r.cache_protected_len}"))
        covered = 0
        for node in reversed(paths[r.rid]):
            if covered >= min(window, depth):
                break
            if node.swa_lock_ref < 1:
                found.append(Violation("I11", f"request {r.rid}: node {node.node_id} is in its SWA lock segment (the {min(window, depth)} "
                                              f"tokens above its end), yet has SWA lock ref {node.swa_lock_ref}"))
            covered += len(node.key)
        prefix = [slot for node in paths[r.rid] for slot in node.full_value]
        for position in range(min(len(prefix), r.cache_protected_len)):
            row_slot = r.row[position] if position < len(r.row) else None
            if row_slot != prefix[position]:
                found.append(Violation("I11", f"request {r.rid}: row[{position}] is {row_slot}, but its path holds full slot {prefix[position]}"))
                break
    return found


def ledger_violations(now: EngineSnapshot) -> list[Violation]:
    """[I12] The tree's ledgers equal the sums over non-root nodes: full tokens split by
    full_lock_ref == 0 / > 0, SWA tokens of non-tombstone nodes split by swa_lock_ref."""
    if now.ledgers is None:
        return []
    counted = Counter()
    for node in non_root_nodes(now):
        counted["full_protected" if node.full_lock_ref > 0 else "full_evictable"] += len(node.full_value)
        if node.swa_value is not None:
            counted["swa_protected" if node.swa_lock_ref > 0 else "swa_evictable"] += len(node.swa_value)
    found = []
    for name in ("full_evictable", "full_protected", "swa_evictable", "swa_protected"):
        if getattr(now.ledgers, name) != counted[name]:
            found.append(Violation("I12", f"ledger {name} is {getattr(now.ledgers, name)}, but the nodes hold {counted[name]} such tokens"))
    return found


def tree_structure_violations(now: EngineSnapshot) -> list[Violation]:
    """[I13, TREE-1] Node ids are unique; one root, with an empty key at position 0;
    every node reaches it through existing parents, and child.start == parent.end; a full
    value has one slot per key token; an SWA value is None or equals mapping[full value];
    siblings differ in their first page key[:P]."""
    if not now.nodes:
        return []
    found, nodes, page_size = [], node_index(now), now.config.page_size
    for node_id, count in Counter(node.node_id for node in now.nodes).items():
        if count > 1:
            found.append(Violation("I13", f"node id {node_id} is used by {count} nodes"))
    roots = [node.node_id for node in now.nodes if node.parent is None]
    if len(roots) != 1:
        found.append(Violation("I13", f"the tree has {len(roots)} roots {roots}, not one"))
    for root in (nodes[node_id] for node_id in roots):
        if root.key or root.full_value or root.start != 0:
            found.append(Violation("I13", f"root {root.node_id} must have an empty key and value at position 0"))
    first_pages: dict[tuple, int] = {}
    for node in non_root_nodes(now):
        parent = nodes.get(node.parent)
        if parent is None:
            found.append(Violation("I13", f"node {node.node_id}: parent {node.parent} is not in the tree"))
        elif node.start != parent.end:
            found.append(Violation("I13", f"node {node.node_id} starts at {node.start}, its parent {parent.node_id} ends at {parent.end}"))
        elif path_to(nodes, node.node_id)[0].parent not in roots:
            found.append(Violation("I13", f"node {node.node_id} does not reach the root (a cycle or a missing ancestor)"))
        for kind, value in (("full", node.full_value), ("SWA", node.swa_value)):
            if value is not None and len(value) != len(node.key):
                found.append(Violation("I13", f"node {node.node_id}: {len(value)} {kind} slots for {len(node.key)} key tokens"))
        for (position, full_slot), swa_slot in zip(slot_pairs(node, node.full_value), node.swa_value or ()):
            if mapping_at(now, full_slot) != swa_slot:
                found.append(Violation("I13", f"node {node.node_id}: position {position} has SWA slot {swa_slot}, "
                                              f"but mapping[{full_slot}] is {mapping_at(now, full_slot)}"))
                break
        sibling = first_pages.setdefault((node.parent, node.key[:page_size]), node.node_id)
        if sibling != node.node_id:
            found.append(Violation("I13", f"nodes {sibling} and {node.node_id} under {node.parent} start with the same page {node.key[:page_size]}"))
    return found


def eviction_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I14, TREE-5] After an evict, prefill_chunk, decode, admit or pd_admit step, every
    (position, full slot) of a node full-locked before is still one of some node, and
    every (position, SWA slot) of a live node SWA-locked before is still one of a live
    node: eviction never frees locked KV."""
    if step is None or step.operation not in EVICTING_OPERATIONS:
        return []
    full_now = {pair for node in non_root_nodes(now) for pair in slot_pairs(node, node.full_value)}
    swa_now = {pair for node in non_root_nodes(now) if node.swa_value is not None for pair in slot_pairs(node, node.swa_value)}
    found = []
    for node in non_root_nodes(previous):
        for kind, lock_ref, value, survivors in (("full", node.full_lock_ref, node.full_value, full_now),
                                                  ("SWA", node.swa_lock_ref, node.swa_value, swa_now)):
            lost = [pair for pair in slot_pairs(node, value or ()) if pair not in survivors]
            if lock_ref > 0 and lost:
                found.append(Violation("I14", f"after {step.operation}: {kind}-locked node {node.node_id} lost {len(lost)} of its "
                                              f"(position, {kind} slot) pairs, the first {lost[0]}"))
    return found


def atomicity_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I15] A step that ended in OutOfMemory leaves its request as it was: still absent
    if it was absent, else the same RequestView except the SWA cursor, which the window
    eviction that runs before a decode's allocation may have advanced (I7, I8 check it)."""
    if step is None or step.outcome != "OutOfMemory" or step.rid is None:
        return []
    before, after = find_request(previous, step.rid), find_request(now, step.rid)
    if before is None and after is not None:
        return [Violation("I15", f"request {step.rid} holds KV after a failed {step.operation} step (OutOfMemory)")]
    if before is None:
        return []
    changed = [f.name for f in fields(RequestView)
               if f.name != "swa_evicted_seqlen" and (after is None or getattr(before, f.name) != getattr(after, f.name))]
    if changed:
        return [Violation("I15", f"request {step.rid} changed ({', '.join(changed)}) in a failed {step.operation} step (OutOfMemory)")]
    return []


# -- the registry ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Invariant:
    """One registered check: its clause, its class, and whether it compares two snapshots
    (`function(previous, step, now)`) or reads one (`function(now)`)."""

    clause: str
    invariant_class: str
    function: Callable[..., list[Violation]]
    needs_previous: bool

    def __post_init__(self):
        assert self.invariant_class in INVARIANT_CLASSES, f"unknown invariant class {self.invariant_class!r}; use one of {INVARIANT_CLASSES}"


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("I1", "leak", engine_free_list_violations, False),
    Invariant("I2", "leak", full_conservation_violations, False),
    Invariant("I3", "leak", swa_conservation_violations, False),
    Invariant("I4", "ownership", engine_ownership_violations, False),
    Invariant("I5", "mapping", engine_mapping_violations, False),
    Invariant("I6", "alignment", engine_alignment_violations, False),
    Invariant("I7", "alignment", cursor_bound_violations, False),
    Invariant("I7", "alignment", cursor_monotonicity_violations, True),
    Invariant("I8", "window-liveness", window_liveness_violations, False),
    Invariant("I8", "window-liveness", decode_read_window_violations, True),
    Invariant("I9", "window-bound", decode_window_bound_violations, False),
    Invariant("I9", "window-bound", chunk_window_bound_violations, True),
    Invariant("I10", "window-bound", insert_boundary_violations, True),
    Invariant("I11", "locks", lock_violations, False),
    Invariant("I12", "locks", ledger_violations, False),
    Invariant("I13", "mapping", tree_structure_violations, False),
    Invariant("I14", "locks", eviction_violations, True),
    Invariant("I15", "atomicity", atomicity_violations, True),
    Invariant("I16", "leak", free_group_violations, False),
    # one shared block pool (chapter 08): vacuous for an engine that shows none
    Invariant("BLOCK-1", "leak", block_pool.pool_accounting_violations, False),
    Invariant("BLOCK-2", "ownership", block_pool.reference_count_violations, False),
    Invariant("BLOCK-3", "ownership", block_pool.null_block_violations, False),
    Invariant("BLOCK-4", "alignment", block_pool.table_shape_violations, False),
    Invariant("BLOCK-5", "window-liveness", block_pool.window_coverage_violations, False),
    Invariant("BLOCK-6", "window-bound", block_pool.window_release_violations, False),
    Invariant("BLOCK-7", "mapping", block_pool.cache_map_violations, False),
    Invariant("BLOCK-8", "mapping", block_pool.event_replay_violations, False),
)


def engine_violations(previous: EngineSnapshot | None, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """Every registered invariant of `now`, and of the step from `previous` when there is
    one. A snapshot too malformed for a check (an index out of range) is reported as a
    violation of that check's clause, never as a crash."""
    found = []
    for invariant in INVARIANTS:
        if invariant.needs_previous and previous is None:
            continue
        try:
            found.extend(invariant.function(previous, step, now) if invariant.needs_previous else invariant.function(now))
        except (IndexError, KeyError) as error:
            found.append(Violation(invariant.clause, f"{invariant.function.__name__} cannot read this snapshot: {type(error).__name__}: {error}"))
    return found
