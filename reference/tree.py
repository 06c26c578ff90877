"""The prefix tree core [TREE-1 .. TREE-5]: page-aligned keys, node splits, matching,
inserting, locking and deleting, with the per-component behaviour delegated to
components (reference/components.py), in the shape SGLang's unified radix cache uses.

A node holds a whole number of pages of one token sequence: its key (token ids), the
full slots of those tokens, and per component what that component keeps (the SWA
component: the SWA slots, or None for a tombstone). The root holds nothing and is
always locked. Without a host tier every node keeps its full value, so a node leaves
the tree only by being deleted as a leaf.
"""

from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING

import torch

from kvspec.spec.snapshot import Ledgers, NodeView

if TYPE_CHECKING:
    from .hybrid import HybridAllocator
    from .state import StatePool


@dataclass(eq=False)
class Node:
    node_id: int
    parent: "Node | None"
    start: int
    key: tuple[int, ...]
    full: torch.Tensor
    swa: torch.Tensor | None
    children: dict[tuple[int, ...], "Node"] = field(default_factory=dict)
    full_lock_ref: int = 0
    swa_lock_ref: int = 0
    swa_lock_boundaries: set[int] = field(default_factory=set)
    """Receipts of SWA segment locks whose topmost node this is."""
    full_access: int = 0
    swa_access: int = 0
    state: int | None = None
    """The slot of the node's state checkpoint (reference/state.py), if it holds one."""
    state_lock_ref: int = 0
    state_access: int = 0
    last_view: tuple | None = None
    """(the state it showed, its NodeView, the objects the state names): PrefixTree.view."""

    @property
    def end(self) -> int:
        return self.start + len(self.key)

    def __len__(self) -> int:
        return len(self.key)

    def path_to_root(self):
        """This node and its ancestors, root excluded, deepest first."""
        node = self
        while node.parent is not None:
            yield node
            node = node.parent


@dataclass(frozen=True)
class TreeLock:
    """[TREE-4] The receipt of `lock(node)`: release it with `unlock` exactly once."""

    node: Node
    swa_boundary: int | None


class PrefixTree:
    def __init__(self, allocator: "HybridAllocator", page_size: int, window: int, version: str,
                 state_pool: "StatePool | None" = None):
        from .components import FullComponent, SWAComponent  # they import this module
        from .state import StateComponent

        self.allocator = allocator
        self.page_size = page_size
        self.window = window
        self.version = version
        self.ids = count()
        self.clock = count(1)
        empty = torch.empty(0, dtype=torch.int64, device=allocator.device)
        self.root = Node(next(self.ids), None, 0, (), empty, empty, full_lock_ref=1, swa_lock_ref=1)
        self.full: FullComponent = FullComponent(self)
        self.swa: SWAComponent = SWAComponent(self)
        self.state: StateComponent | None = None if state_pool is None else StateComponent(self, state_pool)
        self.components = (self.full, self.swa) + ((self.state,) if self.state else ())

    # -- structure --------------------------------------------------------------------

    def nodes(self):
        """Every node, root first, parents before children."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def page_key(self, key, offset: int) -> tuple[int, ...]:
        return tuple(key[offset:offset + self.page_size])

    def matched_pages(self, node: Node, key, offset: int) -> int:
        """Tokens of `node.key` that equal `key[offset:]`, counted in whole pages."""
        matched = 0
        while (matched < len(node.key) and offset + matched + self.page_size <= len(key)
               and node.key[matched:matched + self.page_size] == tuple(key[offset + matched:offset + matched + self.page_size])):
            matched += self.page_size
        return matched

    def step_down(self, node: Node, key) -> Node | None:
        """The child of `node` that continues `key`, split where `key` leaves it; None
        when no child starts with the next page of `key`."""
        child = node.children.get(self.page_key(key, node.end))
        if child is None:
            return None
        matched = self.matched_pages(child, key, node.end)
        return self.split(child, matched) if matched < len(child) else child

    def split(self, node: Node, at: int) -> Node:
        """[TREE-1] Cut `node` after `at` tokens: a new parent takes the first `at`
        tokens, `node` keeps the rest. Lock counts are copied to the new parent (every
        lock through the node goes through it) and segment-lock boundaries move up."""
        assert 0 < at < len(node) and at % self.page_size == 0, "splits fall on page boundaries inside a node"
        parent = Node(next(self.ids), node.parent, node.start, node.key[:at], node.full[:at],
                      None if node.swa is None else node.swa[:at],
                      full_lock_ref=node.full_lock_ref, swa_lock_ref=node.swa_lock_ref,
                      swa_lock_boundaries=node.swa_lock_boundaries,
                      full_access=node.full_access, swa_access=node.swa_access)
        node.parent.children[self.page_key(node.key, 0)] = parent
        parent.children[self.page_key(node.key, at)] = node
        node.parent, node.start, node.key = parent, node.start + at, node.key[at:]
        node.full = node.full[at:]
        node.swa = None if node.swa is None else node.swa[at:]
        node.swa_lock_boundaries = set()
        return parent

    def add_leaf(self, parent: Node, key: tuple[int, ...], full: torch.Tensor) -> Node:
        """A new, unlocked leaf with full KV only; the SWA component decides the rest."""
        leaf = Node(next(self.ids), parent, parent.end, key, full, None,
                    full_access=next(self.clock), swa_access=next(self.clock))
        parent.children[self.page_key(key, 0)] = leaf
        self.full.evictable += len(leaf)
        return leaf

    def is_evictable_leaf(self, node: Node) -> bool:
        """[TREE-5] Not the root, no children, no lock of any component."""
        return (node is not self.root and not node.children and node.full_lock_ref == 0 and node.swa_lock_ref == 0
                and node.state_lock_ref == 0)

    def delete_leaf(self, node: Node) -> int:
        """[TREE-5] Free every component's KV of an evictable leaf and remove it."""
        assert self.is_evictable_leaf(node), "only unlocked leaves are deleted"
        if self.state is not None:
            self.state.drop_checkpoint(node)
        if node.swa is not None:
            self.swa.evictable -= len(node)
            self.allocator.free_segment(node.full, node.start)
        else:
            self.allocator.free_full_segment(node.full, node.start)
        self.full.evictable -= len(node)
        del node.parent.children[self.page_key(node.key, 0)]
        return len(node)

    def path_values(self, node: Node) -> torch.Tensor:
        """The full slots of positions [0, node.end), from the root down to `node`."""
        values = [n.full for n in node.path_to_root()][::-1]
        return torch.cat(values) if values else self.root.full

    # -- matching ---------------------------------------------------------------------

    def match(self, key) -> tuple[Node, int]:
        """[TREE-2] The deepest node along `key` (page-aligned) that every component
        accepts as a match end, and its depth. A mismatch inside a node splits it."""
        key = tuple(key[:len(key) // self.page_size * self.page_size])
        accepts = [component.match_validator() for component in self.components]
        node, best = self.root, self.root
        while node.end < len(key) and (child := self.step_down(node, key)) is not None:
            node = child
            if all([accept(node) for accept in accepts]):  # every validator sees every node
                best = node
        self.touch(best)
        return best, best.end

    def touch(self, node: Node) -> None:
        """LRU: the path to `node` becomes most recent for Full, deeper nodes more recent;
        for SWA only the nodes within `window + page_size` tokens above it."""
        path = list(node.path_to_root())
        node.state_access = next(self.clock)  # a match uses the state of its end only
        for n in reversed(path):
            n.full_access = next(self.clock)
        covered = 0
        for n in path:
            if covered >= self.window + self.page_size:
                break
            n.swa_access = next(self.clock)
            covered += len(n)

    # -- inserting --------------------------------------------------------------------

    def insert(self, key, value: torch.Tensor, prev_prefix_len: int, swa_cursor: int) -> Node:
        """[TREE-3] Insert the page-aligned `key` with the request's full slots `value`.
        Existing nodes below `prev_prefix_len` are the request's own matched prefix;
        existing nodes above it duplicate the request's slots, which are freed (or, for
        an SWA tombstone the request can revive, taken over). The rest becomes new nodes.
        Returns the node that ends at `len(key)`."""
        assert len(key) % self.page_size == 0 and len(value) == len(key)
        node = self.root
        while node.end < len(key) and (child := self.step_down(node, key)) is not None:
            child.full_access = next(self.clock)
            if child.end > prev_prefix_len:
                child = self.swa.on_insert_overlap(child, value, swa_cursor)
            node = child
        if node.end < len(key):
            node = self.swa.on_insert_commit(node, tuple(key[node.end:]), value[node.end:], swa_cursor)
        return node

    def free_duplicates(self, node: Node, value: torch.Tensor, swa_cursor: int) -> None:
        """The request's own slots for positions an existing node already holds: below
        the request's SWA cursor only the full side is still live."""
        incoming = value[node.start:node.end]
        dead = max(0, min(len(node), swa_cursor - node.start))
        if dead:
            self.allocator.free_full_segment(incoming[:dead], node.start)
        if dead < len(node):
            self.allocator.free_segment(incoming[dead:], node.start + dead)

    # -- locking ----------------------------------------------------------------------

    def lock(self, node: Node) -> TreeLock:
        """[TREE-4] Full locks the path to the root; SWA locks a segment covering the window."""
        self.full.lock(node)
        if self.state is not None:
            self.state.lock(node)
        return TreeLock(node, self.swa.lock(node))

    def unlock(self, receipt: TreeLock) -> None:
        self.full.unlock(receipt.node)
        self.swa.unlock(receipt.node, receipt.swa_boundary)
        if self.state is not None:
            self.state.unlock(receipt.node)

    # -- eviction ---------------------------------------------------------------------

    def evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        """[TREE-5] Evict at least the given tokens per component where possible;
        returns the tokens freed by each."""
        return self.full.evict(full_tokens), self.swa.evict(swa_tokens)

    # -- observation ------------------------------------------------------------------

    def ledgers(self) -> Ledgers:
        return Ledgers(self.full.evictable, self.full.protected, self.swa.evictable, self.swa.protected)

    def views(self) -> tuple[NodeView, ...]:
        return tuple(map(self.view, self.nodes()))

    @staticmethod
    def view(n: Node) -> NodeView:
        """A node as a snapshot shows it. A node's value tensors are replaced, never written
        in place, so while they and the rest are the same its last view is still true and is
        shown again: a snapshot after every step does not read every node back from torch."""
        # the tensors by identity (last_view keeps them alive, so their ids stay theirs)
        state = (id(n.parent), n.start, n.key, id(n.full), id(n.swa), n.full_lock_ref, n.swa_lock_ref)
        if n.last_view is None or n.last_view[0] != state:
            n.last_view = state, NodeView(
                n.node_id, None if n.parent is None else n.parent.node_id, n.start, n.key,
                tuple(n.full.tolist()), None if n.swa is None else tuple(n.swa.tolist()), n.full_lock_ref,
                n.swa_lock_ref), (n.parent, n.full, n.swa)
        return n.last_view[1]
