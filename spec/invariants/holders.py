"""Reading a two-pool snapshot: the nodes by id, a request's path, and who holds what.

Who holds what (for the allocator invariants I1-I6 of spec/accounting.py, reused by
kvspec.spec.invariants.accounting):
  * a request privately holds positions [cpl, L): `HeldSequence(row[cpl:L], start=cpl,
    swa_live_from=max(e, cpl))`;
  * each non-root node holds its full value at positions [start, end), with live SWA on
    all of them, or on none for an SWA tombstone (swa_value None).
"""

from collections.abc import Callable
from functools import wraps
from typing import Any

from ..accounting import HeldSequence, held_full_pages, held_swa_pages
from ..notation import Position, SlotId
from ..snapshot import EngineSnapshot, NodeView, RequestView, TwoPoolSnapshot


def node_index(snapshot: TwoPoolSnapshot) -> dict[int, NodeView]:
    """The nodes by id (the first of duplicate ids; I13 reports duplicates)."""
    by_id: dict[int, NodeView] = {}
    for node in snapshot.nodes:
        by_id.setdefault(node.node_id, node)
    return by_id


def non_root_nodes(snapshot: TwoPoolSnapshot) -> list[NodeView]:
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


def mapping_at(snapshot: TwoPoolSnapshot, full_slot: SlotId) -> SlotId | None:
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


def per_snapshot(function: Callable[[TwoPoolSnapshot], Any]) -> Callable[[TwoPoolSnapshot], Any]:
    """Remember a function of one snapshot for the last snapshot it was given: several
    checks read the same holders after each step. Snapshots are immutable, so this
    changes no result (and holding the last one keeps its identity from being reused)."""
    last: list = [None, None]

    @wraps(function)
    def remembered(snapshot: TwoPoolSnapshot):
        if last[0] is not snapshot:
            last[:] = snapshot, function(snapshot)
        return last[1]

    return remembered


@per_snapshot
def holders(snapshot: TwoPoolSnapshot) -> tuple[tuple[str, HeldSequence], ...]:
    """Who holds what (module docstring), each holder named for messages."""
    return (*((f"request {r.rid}", request_holding(r)) for r in snapshot.requests),
            *((f"node {node.node_id}", node_holding(node)) for node in non_root_nodes(snapshot)))


@per_snapshot
def held_sequences(snapshot: TwoPoolSnapshot) -> tuple[HeldSequence, ...]:
    """[OBS-1] What every holder holds: requests their private positions, nodes theirs."""
    return tuple(sequence for _, sequence in holders(snapshot))


@per_snapshot
def held_pages(snapshot: TwoPoolSnapshot) -> tuple[list, list]:
    """The full and the SWA pages every holder holds, each once per holder (I2-I4)."""
    sequences, page_size = held_sequences(snapshot), snapshot.config.page_size
    return held_full_pages(sequences, page_size), held_swa_pages(sequences, snapshot.allocator.mapping, page_size)
