"""[I11-I14, LIFE-12] The prefix tree: locks, ledgers, structure, eviction of locked KV, and
what a match outside an admission may change."""

from collections import Counter

from ..lifecycle import EngineOperation
from ..notation import Violation
from ..registry import invariant
from ..snapshot import Step, TwoPoolSnapshot
from .holders import mapping_at, node_index, non_root_nodes, path_to, slot_pairs

EVICTING_OPERATIONS = frozenset({EngineOperation.EVICT, EngineOperation.PREFILL_CHUNK, EngineOperation.PREFILL_BATCH,
                                 EngineOperation.DECODE, EngineOperation.ADMIT, EngineOperation.PD_ADMIT})
"""Steps that may evict tree data and release no lock before they do (I14)."""


@invariant("I11", "locks", reads={"rows", "tree"})
def lock_violations(now: TwoPoolSnapshot) -> list[Violation]:
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
        for node in swa_lock_segment(paths[r.rid], window):
            if node.swa_lock_ref < 1:
                found.append(Violation("I11", f"request {r.rid}: node {node.node_id} is in its SWA lock segment (the {min(window, depth)} "
                                              f"tokens above its end), yet has SWA lock ref {node.swa_lock_ref}"))
        prefix = [slot for node in paths[r.rid] for slot in node.full_value]
        for position in range(min(len(prefix), r.cache_protected_len)):
            row_slot = r.row[position] if position < len(r.row) else None
            if row_slot != prefix[position]:
                found.append(Violation("I11", f"request {r.rid}: row[{position}] is {row_slot}, but its path holds full slot {prefix[position]}"))
                break
    return found


@invariant("I12", "locks", reads={"tree"})
def ledger_violations(now: TwoPoolSnapshot) -> list[Violation]:
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


@invariant("I13", "mapping", reads={"mapping", "tree"})
def tree_structure_violations(now: TwoPoolSnapshot) -> list[Violation]:
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


def request_locks(snapshot: TwoPoolSnapshot, requests) -> dict[str, Counter]:
    """[TREE-4] The lock refs these requests hold, per node id: full on every node of a
    request's path, SWA on the nodes from its last node up until min(W, depth) tokens are
    covered (I11's rule)."""
    nodes, window = node_index(snapshot), snapshot.config.window
    held = {"full": Counter(), "SWA": Counter()}
    for r in requests:
        path = path_to(nodes, r.last_node)
        held["full"].update(node.node_id for node in path)
        held["SWA"].update(node.node_id for node in swa_lock_segment(path, window))
    return held


def swa_lock_segment(path, window: int) -> list:
    """[TREE-4] The nodes of a request's path that hold its SWA lock: from its last node up
    until min(W, depth) tokens are covered."""
    depth = path[-1].end if path else 0
    segment, covered = [], 0
    for node in reversed(path):
        if covered >= min(window, depth):
            break
        segment.append(node)
        covered += len(node.key)
    return segment


@invariant("I14", "locks", reads={"tree"})
def eviction_violations(previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> list[Violation]:
    """[I14, TREE-5] After an evict, prefill_chunk, prefill_batch, decode, admit or pd_admit step, every
    (position, full slot) of a node full-locked before is still one of some node, and
    every (position, SWA slot) of a live node SWA-locked before is still one of a live
    node: eviction never frees locked KV. A request that a prefill batch finishes (LIFE-9)
    gives its locks back inside the step, before the batch's later checkpoints, which may
    then revive a node it alone locked (TREE-3): its locks protect nothing in that step."""
    if step is None or step.operation not in EVICTING_OPERATIONS:
        return []
    full_now = {pair for node in non_root_nodes(now) for pair in slot_pairs(node, node.full_value)}
    swa_now = {pair for node in non_root_nodes(now) if node.swa_value is not None for pair in slot_pairs(node, node.swa_value)}
    finished = {r.rid for r in now.requests}
    given_back = request_locks(previous, [r for r in previous.requests if r.rid in step.batch and r.rid not in finished])
    found = []
    for node in non_root_nodes(previous):
        for kind, lock_ref, value, survivors in (("full", node.full_lock_ref, node.full_value, full_now),
                                                  ("SWA", node.swa_lock_ref, node.swa_value, swa_now)):
            lost = [pair for pair in slot_pairs(node, value or ()) if pair not in survivors]
            if lock_ref - given_back[kind][node.node_id] > 0 and lost:
                found.append(Violation("I14", f"after {step.operation}: {kind}-locked node {node.node_id} lost {len(lost)} of its "
                                              f"(position, {kind} slot) pairs, the first {lost[0]}"))
    return found



def tree_tokens(snapshot: TwoPoolSnapshot) -> dict[int, tuple]:
    """Each token the tree holds, by its full slot: (position, SWA slot or None, full lock
    ref, SWA lock ref). A split keeps every token's entry: it moves tokens between nodes."""
    return {full_slot: (position, None if node.swa_value is None else node.swa_value[position - node.start],
                        node.full_lock_ref, node.swa_lock_ref)
            for node in non_root_nodes(snapshot) for position, full_slot in slot_pairs(node, node.full_value)}


def match_violations(previous: TwoPoolSnapshot, now: TwoPoolSnapshot) -> list[Violation]:
    """[LIFE-12, TREE-1] What a waiting request's match changed beyond what it may: it
    allocates and frees nothing (every pool's free count is what it was), and it may split
    the node it ends in, nothing else: every token the tree held it still holds, at its
    position, with its SWA slot and lock refs, and it holds no other. (Not a registered
    invariant: it binds after a match step only, and the driver applies it there.)"""
    found = [Violation("LIFE-12", f"a match changed the {kind} pool's free pages from {before.free_count} to "
                                  f"{after.free_count}")
             for kind, before, after in (("full", previous.allocator.full, now.allocator.full),
                                         ("SWA", previous.allocator.swa, now.allocator.swa))
             if before.free_count != after.free_count]
    before, after = tree_tokens(previous), tree_tokens(now)
    for full_slot in sorted(before.keys() | after.keys()):
        if before.get(full_slot) != after.get(full_slot):
            was, became = (f"(position, SWA slot, full lock ref, SWA lock ref) {entry}" if entry else "not in the tree"
                           for entry in (before.get(full_slot), after.get(full_slot)))
            found.append(Violation("LIFE-12", f"a match changed the tree's full slot {full_slot}: {was} before, "
                                              f"{became} after"))
    return found
