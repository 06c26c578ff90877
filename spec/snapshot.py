"""What an engine shows of itself [OBS-1]: plain data, no torch, no live objects.

The conformance suite checks invariants over these snapshots only, so any engine that
can describe itself this way can be checked. Positions, slots and node ids are ints;
node ids are opaque (only equality matters), the root is the node whose parent is None.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .accounting import AllocatorState
from .notation import Position, SlotId, Violation
from .outcomes import Outcome
from .window import EVERY_GROUP, Policy

if TYPE_CHECKING:  # annotations only: both modules read this one
    from .lifecycle import EngineOperation
    from .scheduler import SchedulerOperation


@dataclass(frozen=True)
class EngineConfig:
    """[MODEL-4] The configuration an engine is built with."""

    page_size: int
    window: int
    size_full: int
    size_swa: int
    max_requests: int = 8
    policy: Policy = Policy()
    state_slots: int = 0
    """[STATE-1] Slots of the recurrent-state pool; 0: the model has no recurrent layers."""
    state_grid: int = 1
    """[STATE-3] Checkpoints of the state are taken only at multiples of this many tokens."""
    layout: tuple[str, ...] = EVERY_GROUP
    """[BLOCK-11] A shared block pool's attention layer groups by group id, each "full" or
    "swa"; the two-pool model has exactly its two pools, this default."""

    def __post_init__(self):
        if isinstance(self.layout, list):  # as a trace writes it
            object.__setattr__(self, "layout", tuple(self.layout))


@dataclass(frozen=True)
class RequestView:
    """[LIFE-2] One request that holds KV (admitted, not yet released)."""

    rid: str
    row: tuple[SlotId, ...]
    """Full slot of each position in [0, kv_allocated_len)."""
    cache_protected_len: Position
    """The prefix cache owns positions [0, here); the request owns the rest."""
    swa_evicted_seqlen: Position
    """The SWA cursor e: SWA KV of [cache_protected_len, e) is released."""
    kv_allocated_len: Position
    kv_committed_len: Position
    """KV is written for positions [0, here); the window ends here."""
    seq_len: Position
    """Tokens known: prompt and outputs (the last output's KV is not yet written)."""
    decode_steps: int
    """Decode steps done; 0 during prefill."""
    finished_prefill: bool
    last_node: int | None
    """The node the request's lock is on (None: no prefix cache)."""

    @property
    def swa_dead_lo(self) -> Position:
        """[WIN-3] Where the request's own released SWA range starts."""
        return self.cache_protected_len

    @property
    def swa_live_from(self) -> Position:
        """First private position whose SWA KV is still live."""
        return max(self.swa_evicted_seqlen, self.cache_protected_len)


@dataclass(frozen=True)
class NodeView:
    """[TREE-1] One node of the prefix tree."""

    node_id: int
    parent: int | None
    start: Position
    """Position of the node's first token (its depth in tokens)."""
    key: tuple[int, ...]
    """Token ids, a whole number of pages (empty for the root)."""
    full_value: tuple[SlotId, ...]
    """Full slots of the node's tokens."""
    swa_value: tuple[SlotId, ...] | None
    """SWA slots of the node's tokens, None for an SWA tombstone."""
    full_lock_ref: int
    swa_lock_ref: int

    @property
    def end(self) -> Position:
        return self.start + len(self.key)


@dataclass(frozen=True)
class Ledgers:
    """[I12] The tree's own count of its tokens, evictable or protected, per component."""

    full_evictable: int
    full_protected: int
    swa_evictable: int
    swa_protected: int


class EngineSnapshot:
    """[OBS-1] What every engine snapshot has, whatever its memory model: the
    configuration and the requests that hold KV. An invariant whose `now` is annotated
    with this class applies to every model; one annotated with a subclass only to it."""

    config: EngineConfig
    requests: tuple[RequestView, ...]


@dataclass(frozen=True)
class TwoPoolSnapshot(EngineSnapshot):
    """[OBS-1] Everything observable of a two-pool engine (chapters 01-07) between two
    operations: both pools with the full->SWA mapping, the requests, the prefix tree."""

    config: EngineConfig
    allocator: AllocatorState
    requests: tuple[RequestView, ...]
    nodes: tuple[NodeView, ...]
    """Every node, the root included; empty when the engine has no prefix cache."""
    ledgers: Ledgers | None = None


def held_full_slots(requests: tuple[RequestView, ...], nodes: tuple[NodeView, ...]) -> list[SlotId]:
    """[OBS-4] The full slots a snapshot's holders name: the rows and the nodes' values,
    where a partial snapshot shows the mapping."""
    return [slot for r in requests for slot in r.row] + [slot for node in nodes for slot in node.full_value]


@dataclass(frozen=True)
class Step:
    """[OBS-2] The operation that led from one snapshot to the next."""

    operation: "EngineOperation | SchedulerOperation"
    """What the step was: an EngineOperation (admit, pd_admit, prefill_chunk, prefill_batch,
    decode, finish, finish_batch, abort, retract, evict) or, at the scheduler tier, a SchedulerOperation."""
    rid: str | None = None
    outcome: Outcome = Outcome.OK
    batch: tuple[str, ...] = ()
    """The requests of a prefill_batch (LIFE-9) or finish_batch (LIFE-10) step, in its order; rid
    is None there."""

    @property
    def rids(self) -> tuple[str, ...]:
        """The requests the step names: its batch's, or its one request."""
        return self.batch or (() if self.rid is None else (self.rid,))


def request_lengths(snapshot: EngineSnapshot) -> dict[str, list[int]]:
    """[OBS-3] Per request [seq_len, kv_committed_len, kv_allocated_len,
    cache_protected_len, swa_evicted_seqlen]."""
    return {r.rid: [r.seq_len, r.kv_committed_len, r.kv_allocated_len, r.cache_protected_len, r.swa_evicted_seqlen]
            for r in snapshot.requests}


def two_pool_observables(snapshot: TwoPoolSnapshot, outcome: Outcome) -> dict:
    """[OBS-3] What the spec fixes after a step of a two-pool engine, as plain data: the
    outcome, the free pages per pool, and the lengths of each request (request_lengths)."""
    return {"outcome": outcome,
            "free_full_pages": snapshot.allocator.full.free_count,
            "free_swa_pages": snapshot.allocator.swa.free_count,
            "requests": request_lengths(snapshot)}


def two_pool_drained_violations(snapshot: TwoPoolSnapshot) -> list[Violation]:
    """[I2, I3, LIFE-11] With every request released and the whole cache evicted, or after
    a flush, every page of both pools is free: a page that is not is a leak."""
    found = []
    for clause, pool in (("I2", snapshot.allocator.full), ("I3", snapshot.allocator.swa)):
        if pool.num_pages != pool.free_count:
            found.append(Violation(clause, f"{pool.num_pages - pool.free_count} {pool.name} pages are not free (leak)"))
    return found


POOL_CHECK_SLOTS = 4096
"""[OBS-4] Pool slots per step of checking budget: a whole snapshot every
pool_check_period steps costs about as much per step as one of this many slots."""


def pool_check_period(config: EngineConfig) -> int:
    """[OBS-4] The most steps between two whole snapshots: 1 (every step) up to
    POOL_CHECK_SLOTS slots in both pools, then one step more per POOL_CHECK_SLOTS, so the
    pool-wide checks cost the same per step at any pool size.

    pre: config.size_full >= 0 and config.size_swa >= 0
    post: __return__ >= 1
    """
    return max(1, (config.size_full + config.size_swa) // POOL_CHECK_SLOTS)
