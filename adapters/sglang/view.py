"""What SGLang shows kvspec: its KV cache read as the two-pool model's snapshot (OBS-1).

* The pools (`allocator_state`; the allocator tier shows the same): each pool's free
  pages, what an open free group will release, and the full->SWA mapping.
* The requests (`request_view`): each one's row in the request-to-token pool, its
  cursors and lengths (`kv`, wherever the release keeps them) and the node it locks.
* The prefix tree (`walk_tree`): tree_view.py walks the unified tree's Python core (the
  Rust core cannot be walked); releases/legacy_tree.py the legacy `SWARadixCache`.
* With recurrent state, the state pool (state.py, `state_view`).

A partial snapshot [OBS-4] reads the free counts, and the mapping at the held slots only.
The methods marked "seam" are those whose SGLang API older releases spell differently:
the `sglang@` adapters override them (adapters/sglang/releases/).
"""

from collections.abc import Sequence
from typing import NamedTuple

from kvspec.spec.accounting import AllocatorState, PartialMapping, PoolState
from kvspec.spec.snapshot import RequestView, TwoPoolSnapshot, held_full_slots
from kvspec.spec.state import HybridStateSnapshot

from .runtime import sglang
from .state import state_view
from .tree_view import tree_view


def pool_state(name: str, pool, pending: list, partial: bool = False) -> PoolState:
    """One pool; `partial` [OBS-4]: the length of its free list (free and released
    pages, as `get_all_free_pages` joins them) without reading the list."""
    if partial:
        released = 0 if pool.release_pages is None else len(pool.release_pages)
        count = 0 if pool.free_pages is None else len(pool.free_pages) + released
        return PoolState(name, pool.page_size, pool.size // pool.page_size, None, tuple(pending), count)
    free = pool.get_all_free_pages()
    return PoolState(name, pool.page_size, pool.size // pool.page_size,
                     tuple(free.tolist()) if free is not None else (), tuple(pending))


def pending_pages(allocator) -> tuple[list[int], list[int]]:
    """What an open free group will release, per pool, one entry per page per call: a
    set-shaped `free` releases each page it touches once, and the group's final merge
    would hide a page queued by two calls (the spec counts it twice, I16)."""
    P = allocator.page_size
    full, swa = [], []
    full_pool = allocator.full_attn_allocator
    for slots in full_pool.free_group or []:
        full += sorted(set((slots // P).tolist())) if P > 1 else slots.tolist()
    for pages in getattr(full_pool, "free_page_ids_group", None) or []:
        full += pages.tolist()
    for pages in getattr(allocator, "swa_page_ids_group", None) or []:
        swa += pages.tolist()
    for slots in getattr(allocator, "swa_free_group", None) or []:
        live = slots[slots > 0] if P > 1 else slots
        swa += sorted(set((live // P).tolist())) if P > 1 else live.tolist()
    return full, swa


def allocator_state(allocator, held_full_slots: Sequence[int] | None = None) -> AllocatorState:
    """The allocator; given the full slots the holders name, a partial state [OBS-4]: free
    counts, and the mapping at those slots only."""
    full_pending, swa_pending = pending_pages(allocator) if allocator.free_group is not None else ([], [])
    partial = held_full_slots is not None
    mapping = allocator.full_to_swa_index_mapping
    if partial:
        slots = sorted(set(held_full_slots))
        peers = mapping[sglang().torch.tensor(slots, dtype=sglang().torch.int64)].tolist() if slots else []
        mapping = PartialMapping(len(mapping), dict(zip(slots, peers)))
    else:
        mapping = tuple(mapping.tolist())
    return AllocatorState(allocator.page_size, allocator.size_full,
                          pool_state("full", allocator.full_attn_allocator, full_pending, partial),
                          pool_state("swa", allocator.swa_attn_allocator, swa_pending, partial), mapping)


class KvFields(NamedTuple):
    """A request's KV bookkeeping (SGLang keeps it on the `Req`, in `req.kv`, or both)."""

    holds_kv: bool
    row: int | None
    protected: int
    cursor: int
    allocated: int
    committed: int


class SglangCacheView:
    """The snapshot of an SglangEngine (engine.py), read off its allocator, request-to-token
    pool, requests and cache."""

    # -- seams: where releases differ -----------------------------------------------------

    def kv(self, req) -> KvFields:
        """What a request holds, wherever the release keeps it."""
        kv = req.kv
        return KvFields(kv.holds_kv, kv.req_pool_idx, kv.cache_protected_len,
                        kv.get_evicted_seqlen(self.s.ComponentType.SWA), kv.kv_allocated_len, kv.kv_committed_len)

    def lock_node(self, req) -> int | None:
        return None if req.lock is None else int(req.lock.node)

    def matched_prefix(self, req):
        """The full slots of an admitted request's matched prefix (before its first extend)."""
        return self.cache.prefix_device_indices(req)

    def walk_tree(self):
        return tree_view(self.cache, self.s.ComponentType)

    # -- the snapshot -----------------------------------------------------------------

    def committed(self, req, kv: KvFields) -> int:
        """The KV a request has committed: before its first extend, the prefix it matched
        (it holds no row yet; engine.py's docstring)."""
        return kv.committed if kv.holds_kv else len(self.matched_prefix(req))

    def request_view(self, rid: str, req) -> RequestView:
        kv = self.kv(req)
        if kv.holds_kv:
            row = tuple(self.req_to_token_pool.req_to_token[kv.row, :kv.allocated].tolist())
        else:  # admitted, no extend yet: its row is the prefix it matched
            row = tuple(self.matched_prefix(req).tolist())
        committed = self.committed(req, kv)
        allocated = kv.allocated if kv.holds_kv else committed
        return RequestView(rid, row, kv.protected, kv.cursor, allocated, committed, req.seqlen,
                           req.decode_batch_idx, rid in self.finished_prefill, self.lock_node(req))

    def snapshot(self) -> TwoPoolSnapshot:
        nodes, ledgers = self.walk_tree()
        requests = tuple(self.request_view(rid, req) for rid, req in self.requests.items())
        if self.state:
            return HybridStateSnapshot(self.config, allocator_state(self.allocator), requests, nodes, ledgers,
                                       state=state_view(self))
        return TwoPoolSnapshot(self.config, allocator_state(self.allocator), requests, nodes, ledgers)

    def partial_snapshot(self) -> TwoPoolSnapshot:
        """[OBS-4] Free counts and the mapping at the held slots only, for large pools."""
        nodes, ledgers = self.walk_tree()
        requests = tuple(self.request_view(rid, req) for rid, req in self.requests.items())
        allocator = allocator_state(self.allocator, held_full_slots(requests, nodes))
        if self.state:
            return HybridStateSnapshot(self.config, allocator, requests, nodes, ledgers, state=state_view(self))
        return TwoPoolSnapshot(self.config, allocator, requests, nodes, ledgers)
