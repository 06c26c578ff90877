"""The components of the prefix tree [TREE-2 .. TREE-5, WIN-3]: what Full and SWA each
keep per node, and their hooks: match validator, insert overlap and commit, lock and
unlock, eviction, and `free_out_of_window_slots` (a no-op except for SWA).

Each component keeps a ledger of its tokens in the tree, evictable (no lock) or
protected (locked), updated on every change, as SGLang's does (I12 checks it).
"""

from typing import TYPE_CHECKING, Callable

import torch

from kvspec.spec.pages import ceil_page
from kvspec.spec.window import eviction_frontier

if TYPE_CHECKING:
    from .tree import Node, PrefixTree


class FullComponent:
    """Full-attention KV: present on every node; locks whole paths to the root."""

    def __init__(self, tree: "PrefixTree"):
        self.tree = tree
        self.evictable = 0
        self.protected = 0

    def match_validator(self) -> Callable[["Node"], bool]:
        return lambda node: True  # without a host tier every node has its full KV

    def lock(self, node: "Node") -> None:
        for n in node.path_to_root():
            n.full_lock_ref += 1
            if n.full_lock_ref == 1:
                self.evictable -= len(n)
                self.protected += len(n)

    def unlock(self, node: "Node") -> None:
        for n in node.path_to_root():
            assert n.full_lock_ref > 0, f"node {n.node_id}: full unlock without a lock"
            n.full_lock_ref -= 1
            if n.full_lock_ref == 0:
                self.protected -= len(n)
                self.evictable += len(n)

    def evict(self, num_tokens: int) -> int:
        """[TREE-5] Delete least recently used evictable leaves until `num_tokens` are freed."""
        freed = 0
        while freed < num_tokens:
            leaves = [n for n in self.tree.nodes() if self.tree.is_evictable_leaf(n)]
            if not leaves:
                break
            freed += self.tree.delete_leaf(min(leaves, key=lambda n: n.full_access))
        return freed

    def free_out_of_window_slots(self, request, pre_len: int, eviction_interval: int) -> None:
        """Full KV never slides out of a window."""


class SWAComponent:
    """Sliding-window KV: live on the nodes a match may still need, None (a tombstone)
    elsewhere; locks a segment of at least `window` tokens above a request's node."""

    def __init__(self, tree: "PrefixTree"):
        self.tree = tree
        self.evictable = 0
        self.protected = 0
        self.next_receipt = 0

    # -- ledger-keeping setters ---------------------------------------------------------

    def set_live(self, node: "Node") -> None:
        """Give `node` the SWA peers of its full slots (SGLang's SWARebuild)."""
        assert node.swa is None
        node.swa = self.tree.allocator.translate(node.full)
        assert bool((node.swa > 0).all()), f"node {node.node_id}: rebuilt SWA value has unmapped slots"
        if node.swa_lock_ref:
            self.protected += len(node)
        else:
            self.evictable += len(node)

    def tombstone(self, node: "Node") -> int:
        """Free the node's SWA KV and keep the node (its full KV stays). Its state
        checkpoint goes with it (STATE-8): the node can no longer end a match."""
        assert node.swa is not None and node.swa_lock_ref == 0
        self.tree.allocator.free_swa_segment(node.full, node.start)
        node.swa = None
        if self.tree.state is not None:
            self.tree.state.drop_checkpoint(node)
        self.evictable -= len(node)
        return len(node)

    # -- matching -------------------------------------------------------------------------

    def match_validator(self) -> Callable[["Node"], bool]:
        """[WIN-7, TREE-2] Accept a node when no tombstone lies above it, or when at least
        `window` tokens of live SWA follow the last tombstone."""
        live_run = [None]

        def accept(node: "Node") -> bool:
            if node.swa is None:
                live_run[0] = 0
                return False
            if live_run[0] is None:
                return True
            live_run[0] += len(node)
            return live_run[0] >= self.tree.window

        return accept

    # -- inserting ----------------------------------------------------------------------

    def on_insert_overlap(self, node: "Node", value: torch.Tensor, swa_cursor: int) -> "Node":
        """[TREE-3] An existing node above the request's protected prefix duplicates the
        request's slots. If the node is an SWA tombstone where the request's SWA is
        live (at or above its cursor), the request revives it; otherwise the request's
        duplicate slots are freed. Returns the node the walk continues from."""
        tree = self.tree
        if node.swa is None and node.start < swa_cursor < node.end:
            dead_part = tree.split(node, swa_cursor - node.start)  # tombstone below the cursor stays
            tree.free_duplicates(dead_part, value, swa_cursor)
        if node.swa is not None or node.end <= swa_cursor:
            tree.free_duplicates(node, value, swa_cursor)
            return node
        incoming = value[node.start:node.end]
        if node.full_lock_ref == 0:
            # take the request's slots: its full+SWA pair replaces the node's full-only KV
            old_full, node.full = node.full, incoming
            tree.allocator.free_full_segment(old_full, node.start)
        else:
            # the node's full slots are in use: move the request's SWA peers onto them
            tree.allocator.move_swa_peers(incoming, node.full)
            tree.allocator.free_full_segment(incoming, node.start)
        self.set_live(node)
        return node

    def on_insert_commit(self, parent: "Node", key: tuple[int, ...], full: torch.Tensor, swa_cursor: int) -> "Node":
        """[TREE-3] New nodes for the rest of the key: the part below the request's
        cursor as a tombstone; the live part capped so the last node holds the window
        rounded up to a page (the SWA lock then covers exactly it). Returns the last."""
        tree = self.tree
        start = parent.end
        end = start + len(key)
        dead = max(0, min(end, swa_cursor) - start)
        node = parent
        if dead:
            node = tree.add_leaf(node, key[:dead], full[:dead])
        cap = ceil_page(tree.window, tree.page_size)
        live_start = start + dead
        older = max(0, end - live_start - cap)
        for piece in ((live_start, live_start + older), (live_start + older, end)):
            lo, hi = piece[0] - start, piece[1] - start
            if hi > lo:
                node = tree.add_leaf(node, key[lo:hi], full[lo:hi])
                self.set_live(node)
        return node

    # -- locking --------------------------------------------------------------------------

    def lock(self, node: "Node") -> int | None:
        """[TREE-4] Lock upward from `node` over every node, tombstones included, until
        `window` tokens are covered; the topmost node records the receipt (None: the
        segment reached the root)."""
        covered = 0
        for n in node.path_to_root():
            n.swa_lock_ref += 1
            if n.swa_lock_ref == 1 and n.swa is not None:
                self.evictable -= len(n)
                self.protected += len(n)
            covered += len(n)
            if covered >= self.tree.window:
                self.next_receipt += 1
                n.swa_lock_boundaries.add(self.next_receipt)
                return self.next_receipt
        return None

    def unlock(self, node: "Node", receipt: int | None) -> None:
        for n in node.path_to_root():
            assert n.swa_lock_ref > 0, f"node {n.node_id}: SWA unlock without a lock"
            n.swa_lock_ref -= 1
            if n.swa_lock_ref == 0 and n.swa is not None:
                self.protected -= len(n)
                self.evictable += len(n)
            if receipt is not None and receipt in n.swa_lock_boundaries:
                n.swa_lock_boundaries.remove(receipt)
                return
        assert receipt is None, f"SWA lock receipt {receipt} not found on the path"

    # -- eviction -------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """[TREE-5] From the least recently used SWA value on, skipping locked ones:
        delete a node that is an evictable leaf, else tombstone it."""
        freed = 0
        candidates = sorted((n for n in self.tree.nodes() if n.swa is not None and n.parent is not None),
                            key=lambda n: n.swa_access)
        for node in candidates:
            if freed >= num_tokens:
                break
            if node.swa is None or node.swa_lock_ref > 0:
                continue
            if self.tree.is_evictable_leaf(node):
                freed += self.tree.delete_leaf(node)
            else:
                freed += self.tombstone(node)
        return freed

    # -- window eviction ------------------------------------------------------------------

    def free_out_of_window_slots(self, request, pre_len: int, eviction_interval: int) -> None:
        """[WIN-3] Release the request's SWA KV that slid out of its window."""
        free_swa_out_of_window_slots(self.tree.allocator, request, pre_len, self.tree.window,
                                     self.tree.page_size, self.tree.version, eviction_interval)


def free_swa_out_of_window_slots(allocator, request, pre_len: int, window: int, page_size: int,
                                 version: str, eviction_interval: int) -> None:
    """[WIN-3] Move the request's cursor as `eviction_frontier` decides and free the SWA
    KV of the positions it passes. Also used without a prefix tree."""
    if request.row_index is None:
        return
    decision = eviction_frontier(pre_len, request.swa_evicted_seqlen, request.cache_protected_len,
                                 window, page_size, version, eviction_interval)
    if decision is None:
        return
    request.swa_evicted_seqlen = decision.raised_cursor
    if decision.new_cursor > decision.raised_cursor:
        allocator.free_swa_segment(request.slots(decision.raised_cursor, decision.new_cursor), decision.raised_cursor)
        request.swa_evicted_seqlen = decision.new_cursor
