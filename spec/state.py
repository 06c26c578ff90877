"""Recurrent state [STATE-1 .. STATE-9]: the third kind of cache of a hybrid model.

A recurrent layer (Mamba, a gated delta net) keeps no KV per token: each request has
one fixed-size state, the layer's summary of every token it has read. An engine keeps
these states in a pool of slots beside its KV pools: a working slot per running
request, and checkpoints in the prefix cache, each the state after exactly the tokens
of a node's path. A prefix hit can reuse a state only where a checkpoint was taken at
exactly the hit's end, so the hit of a model with several components is the deepest
node that every component accepts; the request then copies the checkpoint into its own
slot (copy-on-write) and goes on from there.

What a state holds does not matter to memory management; which tokens it has read
does. So the spec gives a state a content that says exactly that: `state_digest` of the
tokens read, and how many (`StateValue`). The engine's model (the reference, or an
adapter that plays the model for a real engine) advances a state by `advance_state`
for every token it computes; the checks then see whether every slot holds the state
of the tokens its holder claims, which is what a wrong copy source, a checkpoint
donated at the wrong boundary or a slot freed while in use breaks.

These predicates read a `HybridStateSnapshot`: a two-pool snapshot (chapters 01-07)
with its `state`, a `StatePoolView`.
"""

from collections import Counter
from dataclasses import dataclass, field

from .lifecycle import EngineOperation
from .notation import Violation
from .registry import invariant
from .snapshot import NodeView, Step, TwoPoolSnapshot, two_pool_drained_violations, two_pool_observables

ADMISSIONS = frozenset({EngineOperation.ADMIT, EngineOperation.PD_ADMIT})
RELEASES = frozenset({EngineOperation.FINISH, EngineOperation.FINISH_BATCH, EngineOperation.ABORT,
                      EngineOperation.RETRACT})
FINISHES = frozenset({EngineOperation.FINISH, EngineOperation.FINISH_BATCH})
"""The steps that end a request's row (LIFE-5): its state is released or kept as a checkpoint."""

STATE_DIGEST_MODULUS = 1 << 23
"""[STATE-4] Digests stay below 2**23, so a float32 state tensor holds one exactly."""
PADDING_SLOT = 0
"""[STATE-1] Slot 0 of a state pool is padding: never handed out, never free."""


def advance_state(digest: int, token: int) -> int:
    """[STATE-4] The state after reading one more token: what the spec's stand-in for a
    recurrent layer computes. It depends on every token and on their order.

    pre: 0 <= digest < (1 << 23)
    pre: 0 <= token < (1 << 20)
    post: 0 <= __return__ < (1 << 23)
    """
    return (digest * 31 + token + 1) % STATE_DIGEST_MODULUS


def state_digest(tokens) -> int:
    """[STATE-4] The state after reading `tokens` from the empty state (digest 0)."""
    digest = 0
    for token in tokens:
        digest = advance_state(digest, token)
    return digest


def min_state_slots(max_requests: int) -> int:
    """[STATE-2] The smallest state pool an engine must be given: per running request a
    working slot and a locked checkpoint, and the one slot a new checkpoint takes before
    the request's lock moves to it. With it, no admission or checkpoint is ever short of
    a slot once every unlocked checkpoint is evicted.

    pre: max_requests >= 1
    post: __return__ > 2 * max_requests
    """
    return 2 * max_requests + 1


def validate_state_grid(state_grid: int, page_size: int) -> list[str]:
    """[MODEL-4, STATE-3] What is wrong with a state pool's checkpoint grid, as sentences
    that say how to fix it; empty when it is valid: a whole number of pages (a state that
    has read a partial page cannot be keyed).

    post: (__return__ == []) == (state_grid >= 1 and page_size >= 1 and state_grid % page_size == 0)
    """
    problems = []
    if page_size < 1:
        problems.append(f"page_size must be >= 1 (got {page_size})")
    elif state_grid < 1 or state_grid % page_size:
        problems.append(f"state_grid must be a multiple of the page size {page_size} (STATE-3; got {state_grid}); "
                        f"use {max(1, state_grid // page_size) * page_size}")
    return problems


def is_checkpoint_boundary(position: int, grid: int) -> bool:
    """[STATE-3] Whether a checkpoint may be taken after `position` tokens: at a whole
    number of grid steps (the engine's alignment, a multiple of the page size), never at 0.

    pre: grid >= 1
    """
    return position > 0 and position % grid == 0


@dataclass(frozen=True)
class StateValue:
    """[STATE-1] One held slot, and what its state has read."""

    slot: int
    length: int
    """Tokens the state has read."""
    digest: int
    """state_digest of those tokens."""


@dataclass(frozen=True)
class RequestState:
    """[STATE-2] A running request's slots: its working state first, then any tracking
    slots the engine keeps for checkpoints yet to be taken."""

    rid: str
    tokens: tuple[int, ...]
    """Every token the request knows (prompt and outputs)."""
    values: tuple[StateValue, ...]


@dataclass(frozen=True)
class StatePoolView:
    """[STATE-1] Everything observable of a state pool between two operations."""

    num_slots: int
    """Slots 1..num_slots; slot 0 is padding."""
    grid: int
    """Checkpoints are taken only where is_checkpoint_boundary holds."""
    free_slots: tuple[int, ...]
    requests: tuple[RequestState, ...]
    checkpoints: tuple[tuple[int, StateValue], ...]
    """(node id, checkpoint) of every node of the prefix tree that holds one."""
    locks: tuple[tuple[int, int], ...]
    """(node id, state lock ref) of every node whose state lock ref is not 0."""
    evictable: int | None = None
    """[STATE-6] The tree's count of its unlocked checkpoints (None: not shown)."""
    protected: int | None = None
    """The tree's count of its locked checkpoints."""


@dataclass(frozen=True)
class HybridStateSnapshot(TwoPoolSnapshot):
    """[OBS-1] A two-pool engine with recurrent layers: chapters 01-07's snapshot, and
    its state pool."""

    state: StatePoolView = field(kw_only=True)


def holders(view: StatePoolView) -> list[tuple[str, StateValue]]:
    """(who, value) for every held slot: "request r1" or "node 7"."""
    return ([(f"request {r.rid}", value) for r in view.requests for value in r.values]
            + [(f"node {node_id}", value) for node_id, value in view.checkpoints])


def path_tokens(nodes: dict[int, NodeView], node_id: int) -> tuple[int, ...]:
    """The tokens of the path from the root to a node."""
    keys = []
    while node_id is not None:
        node = nodes[node_id]
        keys.append(node.key)
        node_id = node.parent
    return tuple(token for key in reversed(keys) for token in key)


# -- invariants ------------------------------------------------------------------------

@invariant("STATE-1", "leak")
def state_conservation_violations(now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-1] Every slot 1..num_slots is free or held: free + held = num_slots."""
    view = now.state
    seen = set(view.free_slots) | {value.slot for _, value in holders(view)}
    found = []
    lost = [slot for slot in range(1, view.num_slots + 1) if slot not in seen]
    if lost:
        found.append(Violation("STATE-1", f"state slots {lost} are neither free nor held (leak)"))
    return found


@invariant("STATE-2", "ownership")
def state_ownership_violations(now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-2] No slot is held twice, or both held and free; no slot is out of range,
    and the padding slot is neither."""
    view = now.state
    found = []
    owners: dict[int, list[str]] = {}
    for who, value in holders(view):
        owners.setdefault(value.slot, []).append(who)
    for slot, count in Counter(view.free_slots).items():
        if count > 1:
            found.append(Violation("STATE-2", f"state slot {slot} is free {count} times"))
    free = set(view.free_slots)
    for slot, who in owners.items():
        if len(who) > 1:
            found.append(Violation("STATE-2", f"state slot {slot} is held by {' and '.join(who)}"))
        if slot in free:
            found.append(Violation("STATE-2", f"state slot {slot} is free but held by {who[0]}"))
    for slot in free | set(owners):
        if not 1 <= slot <= view.num_slots:
            found.append(Violation("STATE-2", f"state slot {slot} is outside the pool 1..{view.num_slots}"
                                              + (" (the padding slot)" if slot == PADDING_SLOT else "")))
    return found


@invariant("STATE-2", "ownership", reads={"rows"})
def working_slot_violations(now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-2] Exactly the requests that hold KV hold state, each at least a working slot."""
    found = []
    holding = {r.rid for r in now.requests}
    stateful = {r.rid: r for r in now.state.requests}
    for rid in sorted(holding - set(stateful)):
        found.append(Violation("STATE-2", f"request {rid} holds KV but no working state slot"))
    for rid in sorted(set(stateful) - holding):
        found.append(Violation("STATE-2", f"request {rid} holds state slots "
                                          f"{[v.slot for v in stateful[rid].values]} but no KV (released?)"))
    for rid, r in stateful.items():
        if not r.values:
            found.append(Violation("STATE-2", f"request {rid} holds no working state slot"))
    return found


@invariant("STATE-3", "alignment", reads={"tree"})
def checkpoint_violations(now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-3] A checkpoint is the state after exactly its node's path: it sits on a
    node of the tree that ends on the checkpoint grid, and has read that node's tokens."""
    found, nodes = [], {node.node_id: node for node in now.nodes}
    for node_id, value in now.state.checkpoints:
        if node_id not in nodes:
            found.append(Violation("STATE-3", f"checkpoint in slot {value.slot} is on node {node_id}, "
                                              f"which is not in the tree"))
            continue
        end = nodes[node_id].end
        if not is_checkpoint_boundary(end, now.state.grid):
            found.append(Violation("STATE-3", f"node {node_id} ends at {end}, off the checkpoint grid "
                                              f"{now.state.grid}, yet holds a checkpoint (slot {value.slot})"))
        tokens = path_tokens(nodes, node_id)
        if (value.length, value.digest) != (end, state_digest(tokens)):
            found.append(Violation("STATE-3", f"node {node_id} ends at {end} but its checkpoint (slot "
                                              f"{value.slot}) is the state of {describe_state(value, tokens)}"))
    return found


def describe_state(value: StateValue, tokens) -> str:
    """What a state has read, against the tokens it should have read."""
    if value.length <= len(tokens) and value.digest == state_digest(tokens[:value.length]):
        return f"the first {value.length} tokens"
    return f"{value.length} tokens that are not these"


@invariant("STATE-4", "state", reads={"rows"})
def working_state_violations(now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-4] A request's working state has read exactly its computed tokens
    [0, kv_committed_len); a tracking slot, a prefix of them ending on the grid."""
    found = []
    committed = {r.rid: r.kv_committed_len for r in now.requests}
    for r in now.state.requests:
        if r.rid not in committed or not r.values:
            continue  # STATE-2
        working, *tracking = r.values
        want = committed[r.rid]
        if (working.length, working.digest) != (want, state_digest(r.tokens[:want])):
            found.append(Violation("STATE-4", f"request {r.rid} computed {want} tokens but its working state "
                                              f"(slot {working.slot}) is the state of "
                                              f"{describe_state(working, r.tokens)}"))
        for value in tracking:
            if (value.length > want or not is_checkpoint_boundary(value.length, now.state.grid)
                    or value.digest != state_digest(r.tokens[:value.length])):
                found.append(Violation("STATE-4", f"request {r.rid}: tracking slot {value.slot} is the state of "
                                                  f"{describe_state(value, r.tokens)}, not a grid prefix of its "
                                                  f"{want} computed tokens"))
    return found


@invariant("STATE-5", "state", reads={"rows", "tree"})
def state_prefix_hit_violations(previous: HybridStateSnapshot, step: Step, now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-5] An admission reuses a cached prefix only where a checkpoint ends it: the
    request's last node holds a checkpoint of exactly the hit (the hit of several
    components is the deepest node every one accepts)."""
    if step.operation not in ADMISSIONS or step.outcome != "ok":
        return []
    request = next((r for r in now.requests if r.rid == step.rid), None)
    if request is None or request.cache_protected_len == 0:
        return []
    checkpoints = dict(now.state.checkpoints)
    hit = request.cache_protected_len
    if request.last_node not in checkpoints:
        return [Violation("STATE-5", f"request {request.rid} was admitted with a {hit}-token prefix hit, "
                                     f"but no checkpoint ends it (last node {request.last_node})")]
    if checkpoints[request.last_node].length != hit:
        return [Violation("STATE-5", f"request {request.rid}: a {hit}-token hit, ended by a checkpoint of "
                                     f"{checkpoints[request.last_node].length} tokens")]
    return []


@invariant("STATE-6", "locks", reads={"rows", "tree"})
def state_lock_violations(now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-6] A node's state lock ref is the number of requests whose last node it is
    (a request locks the state of its last node only, not of the path); the ledgers
    count the checkpoints, unlocked as evictable, locked as protected."""
    found = []
    locks = dict(now.state.locks)
    want = Counter(r.last_node for r in now.requests if r.last_node is not None)
    root = next((node.node_id for node in now.nodes if node.parent is None), None)
    for node_id in sorted(set(locks) | set(want) - {root}):
        if node_id != root and locks.get(node_id, 0) != want[node_id]:
            found.append(Violation("STATE-6", f"node {node_id}: state lock ref {locks.get(node_id, 0)}, but "
                                              f"{want[node_id]} requests end at it"))
    if now.state.evictable is not None:
        locked = sum(1 for node_id, _ in now.state.checkpoints if locks.get(node_id, 0) > 0)
        unlocked = len(now.state.checkpoints) - locked
        if (now.state.evictable, now.state.protected) != (unlocked, locked):
            found.append(Violation("STATE-6", f"state ledgers say {now.state.evictable} evictable and "
                                              f"{now.state.protected} protected checkpoints; the tree has "
                                              f"{unlocked} unlocked and {locked} locked"))
    return found


@invariant("STATE-7", "ownership")
def state_in_use_violations(previous: HybridStateSnapshot, step: Step, now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-7] Nothing frees a state still in use: a request running before and after
    a step still holds its working state, or gave it to the tree as a checkpoint (a
    window release, the release hook of every component, frees no state)."""
    found = []
    before = {r.rid: r for r in previous.state.requests}
    free = set(now.state.free_slots)
    for rid in (r.rid for r in now.state.requests):
        if rid not in before or not before[rid].values:
            continue
        slot = before[rid].values[0].slot
        if slot in free:
            found.append(Violation("STATE-7", f"{step.operation} freed request {rid}'s working state "
                                              f"(slot {slot}) while it runs"))
    return found


@invariant("STATE-8", "locks", reads={"rows", "tree"})
def locked_checkpoint_violations(previous: HybridStateSnapshot, step: Step,
                                 now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-8] Eviction takes only unlocked checkpoints: a checkpoint whose node was
    state-locked before a step that released no request keeps its slot. In a prefill
    batch (LIFE-9) a request's checkpoint moves its lock before a later request's
    checkpoint evicts, so a lock that a request of the batch moved off a node, or gave up
    as the batch finished it, does not protect that node's checkpoint in the step."""
    if step.operation in RELEASES:
        return []
    locks = Counter(dict(previous.state.locks))
    if step.batch:
        node_after = {r.rid: r.last_node for r in now.requests if r.rid in step.batch}
        locks.subtract(r.last_node for r in previous.requests
                       if r.rid in step.batch and node_after.get(r.rid) != r.last_node)
    after = dict(now.state.checkpoints)
    return [Violation("STATE-8", f"{step.operation} evicted the checkpoint of node {node_id} (slot "
                                 f"{value.slot}) while {locks[node_id]} requests lock it")
            for node_id, value in previous.state.checkpoints
            if locks.get(node_id, 0) > 0 and after.get(node_id) != value]


@invariant("STATE-9", "leak")
def released_state_violations(previous: HybridStateSnapshot, step: Step, now: HybridStateSnapshot) -> list[Violation]:
    """[STATE-9] A request that finishes, aborts or is retracted gives back every slot:
    each is free after, or (a finish only) a checkpoint of the tree. A finish batch (LIFE-10)
    releases each of its requests so, and a prefill batch (LIFE-9) each request it finishes."""
    if step.operation in RELEASES:
        released, finish = set(step.rids), step.operation in FINISHES
    elif step.operation == EngineOperation.PREFILL_BATCH:
        released, finish = set(step.batch) - {r.rid for r in now.requests}, True
    else:
        return []
    free = set(now.state.free_slots)
    kept = {value.slot for _, value in now.state.checkpoints} if finish else set()
    found = []
    for request in (r for r in previous.state.requests if r.rid in released):
        found += [Violation("STATE-9", f"{step.operation} of request {request.rid} left its state slot {value.slot} "
                                       + ("neither free nor a checkpoint" if finish else "not free"))
                  for value in request.values if value.slot not in free | kept]
    return found


def state_observables(snapshot: HybridStateSnapshot, outcome: str) -> dict:
    """[OBS-3] What the spec fixes after a step of an engine with recurrent state: the
    two-pool observables, the free state slots, and what each working state has read."""
    fixed = two_pool_observables(snapshot, outcome)
    fixed["free_state_slots"] = len(snapshot.state.free_slots)
    fixed["state_lengths"] = {r.rid: r.values[0].length if r.values else None for r in snapshot.state.requests}
    return fixed


def state_drained_violations(snapshot: HybridStateSnapshot) -> list[Violation]:
    """[I2, I3, STATE-9, LIFE-11] With every request released and the whole cache evicted,
    or after a flush, every page of both pools and every state slot is free."""
    found = two_pool_drained_violations(snapshot)
    held = snapshot.state.num_slots - len(snapshot.state.free_slots)
    if held:
        found.append(Violation("STATE-9", f"{held} state slots are not free (leak)"))
    return found
