"""[I8-I10] Window liveness and bounds: what a request reads is live, what it holds is
bounded, what a checkpoint publishes is matchable.

Notation: W = config.window, P = config.page_size; for a request, e = swa_evicted_seqlen
(the SWA cursor), cpl = cache_protected_len, L = kv_allocated_len, C = kv_committed_len,
and its dead range is [cpl, max(e, cpl)): SWA KV the request released itself.
"""

from ..notation import Position, SlotId, Violation
from ..pages import ceil_page
from ..registry import invariant
from ..snapshot import NodeView, RequestView, Step, TwoPoolSnapshot
from ..window import (
    decode_window_bound,
    eviction_frontier,
    eviction_span_bound,
    insert_keeps_window,
    retention,
    swa_match_length,
)
from .holders import find_request, mapping_at, node_index, non_root_nodes, path_to, slot_pairs


def dead_swa_reason(now: TwoPoolSnapshot, r: RequestView, path: list[NodeView], position: Position) -> str | None:
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


@invariant("I8", "window-liveness", reads={"mapping", "rows", "tree"})
def window_liveness_violations(now: TwoPoolSnapshot) -> list[Violation]:
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


@invariant("I8", "window-liveness", reads={"mapping", "rows", "tree"})
def decode_read_window_violations(previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> list[Violation]:
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


@invariant("I9", "window-bound", reads={"mapping", "rows"})
def decode_window_bound_violations(now: TwoPoolSnapshot) -> list[Violation]:
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


def chunk_steps(previous: TwoPoolSnapshot, step: Step | None,
                now: TwoPoolSnapshot) -> list[tuple[RequestView, RequestView]]:
    """The requests (before, after) of an ok prefill chunk, or of each chunk of an ok prefill
    batch (LIFE-9), of a request still in prefill before it, checkpointed into a
    prefix-sharing tree; empty for any other step."""
    if (step is None or step.operation not in ("prefill_chunk", "prefill_batch") or step.outcome != "ok"
            or not now.config.policy.supports_prefix_sharing):
        return []
    pairs = [(find_request(previous, rid), find_request(now, rid)) for rid in step.rids]
    return [(before, after) for before, after in pairs
            if before is not None and after is not None and not before.finished_prefill]


def chunk_step(previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> tuple[RequestView, RequestView] | None:
    """The request (before, after) of an ok single prefill chunk (chunk_steps); None for any
    other step, a batch among them: I9's chunk form reads one chunk against the snapshot
    before it (spec 06, LIFE-9)."""
    pairs = chunk_steps(previous, step, now) if step is not None and step.operation == "prefill_chunk" else []
    return pairs[0] if pairs else None


def checkpoint_steps(previous: TwoPoolSnapshot, step: Step | None,
                     now: TwoPoolSnapshot) -> list[tuple[Position, RequestView]]:
    """[I10, LIFE-9] The cpl before, and the request after, of each request a step may have
    checkpointed into a prefix-sharing tree: a prefill chunk or each chunk of a prefill batch
    (chunk_steps), or an ok PD-decode admission (a new request, cpl 0 before), whose received
    prompt an implementation may checkpoint at once (SGLang does: SGL-9); the reference only
    matches there. Empty for any other step."""
    if pairs := chunk_steps(previous, step, now):
        return [(before.cache_protected_len, after) for before, after in pairs]
    if (step is None or step.operation != "pd_admit" or step.outcome != "ok"
            or not now.config.policy.supports_prefix_sharing):
        return []
    after = find_request(now, step.rid)
    return [] if after is None else [(0, after)]


def insert_cursor(old_protected: Position, after: RequestView, now: TwoPoolSnapshot) -> Position | None:
    """The cursor a chunk's checkpoint inserted with. Positions below cpl are the tree's,
    so a cursor at or past the new cpl says nothing of the insert: an implementation may
    raise the cursor to cpl after the insert (WIN-3's bump; SGLang 0.5.23 does after an
    insert it ended early, at a branch point). Then the tree shows it: the start of the
    live SWA run that ends at cpl on the request's path (not before `old_protected`, the cpl
    before the step). None when that cannot be seen (no tree in the snapshot)."""
    end = after.cache_protected_len
    if after.swa_evicted_seqlen < end:
        return after.swa_evicted_seqlen
    path = path_to(node_index(now), after.last_node)
    if not path or path[-1].end != end:
        return None
    start = end
    for node in reversed(path):
        if node.swa_value is None or start <= old_protected:
            break
        start = node.start
    return max(start, old_protected)


def live_swa(snapshot: TwoPoolSnapshot) -> set[tuple[Position, SlotId, SlotId]]:
    """(position, full slot, SWA slot) of every token of the tree with live SWA."""
    return {(position, full_slot, swa_slot) for node in non_root_nodes(snapshot) if node.swa_value is not None
            for (position, full_slot), swa_slot in zip(slot_pairs(node, node.full_value), node.swa_value)}


def published_from(live_before: set, path: list[NodeView], end: Position, cursor: Position) -> Position:
    """[I9] Where the live SWA a chunk published starts, when its cursor was raised to cpl after
    the insert and read from the tree (insert_cursor): the lowest position in [cursor,
    end) on the request's `path` that the step made live. A position live before the
    step with the same full and SWA slots is another holder's (an insert over a live node
    keeps it), not the chunk's: SGLang 0.5.23's branch insert recovers tombstones above
    such a node, which the live run then reaches below. `end` when the step made none live."""
    start = end
    for node in path:
        if node.swa_value is not None:
            for (position, full_slot), swa_slot in zip(slot_pairs(node, node.full_value), node.swa_value):
                if cursor <= position < start and (position, full_slot, swa_slot) not in live_before:
                    start = position
    return start


@invariant("I9", "window-bound", reads={"mapping", "rows", "tree"})
def chunk_window_bound_violations(previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> list[Violation]:
    """[I9] After a prefill chunk (chunk_step) with insert end E = cpl, cursor e and the
    previous cpl c0, under a policy with chunk release (WIN-4):
    E - e <= eviction_span_bound(retention, P) if the eviction was not
    clamped, that is, the cursor moved past c0, or the frontier (pre_len = C - 1, the
    previous cursor, c0) was due and not clamped. Under every policy, the chunk publishes live SWA on
    [max(e, c0), E) only: there every position of the path is live; a live position in
    [c0, e) must have been live before the step, with the same full and SWA slots (a
    node another request inserted). e is the insert's cursor (insert_cursor); when it
    was read from the tree, the span counts from where the live SWA the chunk published
    starts (published_from)."""
    pair = chunk_step(previous, step, now)
    if pair is None:
        return []
    before, after = pair
    config, found = now.config, []
    old_protected = before.cache_protected_len
    end, cursor = after.cache_protected_len, insert_cursor(old_protected, after, now)
    if cursor is None:
        return []
    live_before, path = live_swa(previous), path_to(node_index(now), after.last_node)
    published = cursor if after.swa_evicted_seqlen < end else published_from(live_before, path, end, cursor)
    span = eviction_span_bound(retention(config.policy.version, config.window, config.page_size), config.page_size)
    pre_len = after.kv_committed_len - 1  # the chunk's key is the first C tokens
    due = eviction_frontier(pre_len, before.swa_evicted_seqlen, old_protected, config.window, config.page_size,
                            config.policy.version) if pre_len >= 0 else None
    released = config.policy.chunk_release  # without chunk release a chunk keeps its SWA: no span to bound
    if released and end > 0 and (published > old_protected or (due is not None and not due.clamped)) \
            and end - published > span:
        found.append(Violation("I9", f"request {after.rid}: the chunk left {end - published} live SWA tokens "
                                     f"[{published}, {end}), more than {span}"))
    for node in path:
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


@invariant("I9", "window-bound", reads={"rows"})
def extend_window_bound_violations(previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> list[Violation]:
    """[I9, WIN-4] Without prefix sharing, under a policy with chunk release: each request of
    an ok prefill chunk or prefill batch, still in prefill before it, released the SWA that
    slid out of its window before its chunk was allocated (pre_len = C before the step,
    interval 1). Where that eviction was due and not clamped, of the positions it held
    before the step it still holds at most eviction_span_bound(retention, P) SWA slots:
    ceil_page(pre_len) - max(e, cpl) after the step. (The chunk's own new positions are
    not counted: they were allocated after the eviction.)"""
    policy = now.config.policy
    if (step is None or step.operation not in ("prefill_chunk", "prefill_batch") or step.outcome != "ok"
            or policy.supports_prefix_sharing or not policy.chunk_release):
        return []
    config, found = now.config, []
    span = eviction_span_bound(retention(policy.version, config.window, config.page_size), config.page_size)
    for rid in step.rids:
        before, after = find_request(previous, rid), find_request(now, rid)
        if before is None or after is None or before.finished_prefill:
            continue
        pre_len = before.kv_committed_len
        due = eviction_frontier(pre_len, before.swa_evicted_seqlen, before.cache_protected_len, config.window,
                                config.page_size, policy.version)
        held = ceil_page(pre_len, config.page_size) - after.swa_live_from
        if due is not None and not due.clamped and held > span:
            found.append(Violation("I9", f"request {rid}: after the chunk its SWA is live from position "
                                         f"{after.swa_live_from}, {held} slots up to ceil_page({pre_len}) of what it "
                                         f"computed before the chunk, more than {span}: the release before the chunk "
                                         f"was due"))
    return found


@invariant("I10", "window-bound", reads={"rows", "tree"})
def insert_boundary_violations(previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> list[Violation]:
    """[I10] After each checkpoint of a step (checkpoint_steps: a prefill chunk, each chunk of
    a prefill batch, a PD-decode admission) with insert end E = cpl > 0:
    insert_keeps_window(E, e, W) when the insert's cursor e (insert_cursor) moved past the
    previous cpl; last_node ends at E; and swa_match_length of its path (root's child to
    last_node) is E: the new leaf is matchable, never all-tombstone."""
    found, nodes, window = [], node_index(now), now.config.window
    for old_protected, after in checkpoint_steps(previous, step, now):
        end = after.cache_protected_len
        if end == 0:
            continue
        cursor = insert_cursor(old_protected, after, now)
        if cursor is not None and cursor > old_protected and not insert_keeps_window(end, cursor, window):
            found.append(Violation("I10", f"request {after.rid}: new leaf with live SWA [{cursor}, {end}), fewer than min(W, E) = {min(window, end)}"))
        if after.last_node not in nodes or nodes[after.last_node].end != end:
            depth = nodes[after.last_node].end if after.last_node in nodes else None
            found.append(Violation("I10", f"request {after.rid}: last node {after.last_node} ends at {depth}, not at the insert end {end}"))
        path = path_to(nodes, after.last_node)
        matched = swa_match_length([(len(node.key), node.swa_value is not None) for node in path], window)
        if matched != end:
            found.append(Violation("I10", f"request {after.rid}: a prefix match along its path stops at {matched}, not at the insert end {end}"))
    return found
