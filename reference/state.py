"""Recurrent state [STATE-1 .. STATE-9]: the state pool, and the state component of the
prefix tree, as SGLang's MambaPool and MambaComponent keep them.

A state is a row of the pool's `contents` tensor: (tokens read, state_digest of them),
the spec's stand-in for what a recurrent layer keeps (STATE-4). The pool hands out
slots 1..num_slots from a free list (slot 0 is padding). The component keeps at most
one checkpoint per node (its slot), locks the last node of a request only, keeps
ledgers of its checkpoints, and evicts unlocked ones least recently used first.
"""

from typing import TYPE_CHECKING, Callable

import torch

from kvspec.spec.state import RequestState, StatePoolView, StateValue, advance_state

if TYPE_CHECKING:
    from .tree import Node, PrefixTree


class StatePool:
    """[STATE-1] `num_slots` state slots on torch tensors."""

    def __init__(self, num_slots: int, grid: int, device: str | torch.device = "cpu"):
        self.num_slots = num_slots
        self.grid = grid
        self.contents = torch.zeros(num_slots + 1, 2, dtype=torch.int64, device=device)
        # handed out from the front, freed to the back, as SGLang's MambaPool does: a slot
        # just freed is the last one reused
        self.free_slots = torch.arange(1, num_slots + 1, dtype=torch.int64, device=device)

    def available(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        """A free slot, its state empty; None when there is none."""
        if not len(self.free_slots):
            return None
        slot = int(self.free_slots[0])
        self.free_slots = self.free_slots[1:]
        self.contents[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        assert 1 <= slot <= self.num_slots and not bool((self.free_slots == slot).any()), \
            f"state slot {slot} is not held"
        self.free_slots = torch.cat([self.free_slots, self.free_slots.new_tensor([slot])])

    def copy(self, source: int, destination: int) -> None:
        """Copy-on-write: `destination` gets the state `source` holds."""
        self.contents[destination] = self.contents[source]

    def advance(self, slot: int, tokens) -> None:
        """[STATE-4] The recurrent layer reads `tokens`: the spec's stand-in, one token at a time."""
        length, digest = self.contents[slot].tolist()
        for token in tokens:
            digest = advance_state(digest, token)
        self.contents[slot] = self.contents.new_tensor([length + len(tokens), digest])

    def value(self, slot: int) -> StateValue:
        length, digest = self.contents[slot].tolist()
        return StateValue(slot, length, digest)

    def view(self, requests, checkpoints, locks, ledgers: tuple[int, int] | None) -> StatePoolView:
        """requests: (rid, tokens, working slot) of every running request."""
        return StatePoolView(
            self.num_slots, self.grid, tuple(self.free_slots.tolist()),
            tuple(RequestState(rid, tuple(tokens), (self.value(slot),)) for rid, tokens, slot in requests),
            tuple((node_id, self.value(slot)) for node_id, slot in checkpoints), tuple(locks),
            *(ledgers or (None, None)))


class StateComponent:
    """[STATE-3, STATE-5, STATE-6, STATE-8] A checkpoint on some nodes (`Node.state`, a
    slot, or None); locks on the last node only."""

    def __init__(self, tree: "PrefixTree", pool: StatePool):
        self.tree = tree
        self.pool = pool
        self.evictable = 0
        self.protected = 0

    def match_validator(self) -> Callable[["Node"], bool]:
        """[STATE-5] A match may end only where a checkpoint ends it."""
        return lambda node: node.state is not None

    def set_checkpoint(self, node: "Node", slot: int) -> None:
        assert node.state is None and node.parent is not None
        node.state = slot
        node.state_access = next(self.tree.clock)
        if node.state_lock_ref:
            self.protected += 1
        else:
            self.evictable += 1

    def drop_checkpoint(self, node: "Node") -> None:
        """Free a node's checkpoint (evicted, or the node deleted)."""
        if node.state is None:
            return
        self.pool.free(node.state)
        node.state = None
        if node.state_lock_ref:
            self.protected -= 1
        else:
            self.evictable -= 1

    def lock(self, node: "Node") -> None:
        """[STATE-6] Lock the state of `node` only."""
        if node.parent is None:
            return
        node.state_lock_ref += 1
        if node.state_lock_ref == 1 and node.state is not None:
            self.evictable -= 1
            self.protected += 1

    def unlock(self, node: "Node") -> None:
        if node.parent is None:
            return
        assert node.state_lock_ref > 0, f"node {node.node_id}: state unlock without a lock"
        node.state_lock_ref -= 1
        if node.state_lock_ref == 0 and node.state is not None:
            self.protected -= 1
            self.evictable += 1

    def evict(self, num_slots: int) -> int:
        """[STATE-8] Free up to `num_slots` unlocked checkpoints, least recently used first."""
        candidates = sorted((n for n in self.tree.nodes() if n.state is not None and n.state_lock_ref == 0),
                            key=lambda n: n.state_access)
        for node in candidates[:num_slots]:
            self.drop_checkpoint(node)
        return min(num_slots, len(candidates))

    def alloc(self) -> int | None:
        """[STATE-2, STATE-8] A free slot, evicting one unlocked checkpoint if there is none."""
        if self.pool.available() == 0:
            self.evict(1)
        return self.pool.alloc()

    def free_out_of_window_slots(self, request, pre_len: int, eviction_interval: int) -> None:
        """[STATE-7] A state never slides out of a window: nothing to free."""

    def views(self):
        """(checkpoints, locks, ledgers) as StatePool.view takes them."""
        nodes = list(self.tree.nodes())
        return ([(n.node_id, n.state) for n in nodes if n.state is not None],
                [(n.node_id, n.state_lock_ref) for n in nodes if n.state_lock_ref],
                (self.evictable, self.protected))
