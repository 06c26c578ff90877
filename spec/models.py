"""[OBS-1] The memory models of the spec, one per chapter that states one, each with its own snapshot type.

An engine has one memory model; its adapter declares it (by name) and its snapshots are
of that model's type. An invariant reads the snapshot type its `now` is annotated with
(kvspec.spec.registry), so a check of another model does not apply to the engine at all:
it is neither run nor counted. A model's `observables` are the parts of its snapshot an
adapter may be unable to fill in; a check that reads one the adapter lacks is skipped.

An engine whose model has recurrent layers keeps a state pool beside its KV (chapter
09): its snapshot type extends its model's, so every check of that model still applies,
and the state's checks apply besides. `with_state(model)` is that model.
"""

from collections.abc import Callable
from dataclasses import dataclass

from .block_pool import BlockPoolSnapshot, block_pool_observables, drained_violations
from .block_pool_state import BlockPoolStateSnapshot, block_pool_state_drained_violations, block_pool_state_observables
from .notation import Violation
from .snapshot import EngineSnapshot, TwoPoolSnapshot, two_pool_drained_violations, two_pool_observables
from .state import HybridStateSnapshot, state_drained_violations, state_observables
from .window import BLOCK_POOL_VERSIONS, TWO_POOL_VERSIONS


@dataclass(frozen=True)
class MemoryModel:
    name: str
    chapters: str
    snapshot_type: type[EngineSnapshot]
    observables: tuple[str, ...]
    """What an adapter of this model may show; all of it unless it declares less."""
    policy_versions: tuple[str, ...]
    """The policy versions (spec/window.py) of engines of this model."""
    fixed_observables: Callable[[EngineSnapshot, str], dict]
    """[OBS-3] What the spec fixes after a step, as plain data, for replay and differential runs."""
    drained_violations: Callable[[EngineSnapshot], list[Violation]]
    """What is still held once every request is released and the whole cache evicted (a leak)."""
    fixed: tuple[str, ...]
    """[OBS-3] The observables `fixed_observables` names: all a trace's `expect` may name
    for an engine of this model (a trace that expects another model's is at fault)."""


TWO_POOL = MemoryModel(
    "two-pool", "chapters 01-07", TwoPoolSnapshot, ("free_sets", "mapping", "rows", "tree"), TWO_POOL_VERSIONS,
    two_pool_observables, two_pool_drained_violations, ("outcome", "free_full_pages", "free_swa_pages", "requests"))
"""Full and SWA pools with the full->SWA mapping, request rows and cursors, the prefix tree.
free_sets: the free page ids; mapping: the full->SWA mapping; rows: request rows and
cursors; tree: the prefix tree with locks and ledgers."""
BLOCK_POOL = MemoryModel(
    "block-pool", "chapter 08", BlockPoolSnapshot, ("block_pool", "rows", "kv_events"), BLOCK_POOL_VERSIONS,
    block_pool_observables, drained_violations, ("outcome", "free_blocks", "requests"))
"""One block pool shared by every layer group. block_pool: the pool, tables and cache map;
rows: the requests' rows and cursors; kv_events: the map that replaying the engine's KV
events gives, key by key and group by group (BLOCK-8)."""

TWO_POOL_STATE = MemoryModel(
    "two-pool-state", "chapters 01-07 and 09", HybridStateSnapshot, TWO_POOL.observables,
    TWO_POOL_VERSIONS, state_observables, state_drained_violations,
    (*TWO_POOL.fixed, "free_state_slots", "state_lengths"))
"""The two pools and the prefix tree, and a pool of recurrent states with checkpoints in
the tree (full + SWA + state). Its snapshot always shows the state pool (what each slot
has read, the checkpoints' locks and ledgers), so its observables are the two-pool ones."""

BLOCK_POOL_STATE = MemoryModel(
    "block-pool-state", "chapters 08 and 09", BlockPoolStateSnapshot, BLOCK_POOL.observables, BLOCK_POOL_VERSIONS,
    block_pool_state_observables, block_pool_state_drained_violations, BLOCK_POOL.fixed)
"""One block pool shared by the attention groups and a recurrent-state group (STATE-10..14).
Its snapshot always shows the state group, so its observables are the block-pool ones."""

MODELS = {model.name: model for model in (TWO_POOL, BLOCK_POOL, TWO_POOL_STATE, BLOCK_POOL_STATE)}
STATE_MODELS = {TWO_POOL.name: TWO_POOL_STATE, BLOCK_POOL.name: BLOCK_POOL_STATE}
"""[OBS-1] The model of an engine of each model that also has recurrent layers."""


def with_state(model: MemoryModel) -> MemoryModel | None:
    """The model an engine of `model` has once it keeps recurrent state; None where the
    spec states none."""
    return model if model in STATE_MODELS.values() else STATE_MODELS.get(model.name)


def model_for(model: MemoryModel, config) -> MemoryModel:
    """[OBS-1] The model of an engine of `model` built with `config` (an EngineConfig):
    with recurrent state where the configuration has a state pool."""
    return (with_state(model) or model) if config.state_slots else model


def model_of_version(policy_version: str, state: bool = False) -> MemoryModel | None:
    """The model whose engines implement a policy version (None for an unknown version),
    with recurrent state where `state`."""
    model = next((model for model in MODELS.values() if policy_version in model.policy_versions), None)
    return with_state(model) if state and model is not None else model


def model_of_snapshot(snapshot: EngineSnapshot) -> MemoryModel | None:
    """[OBS-1] The model a snapshot is of: the most specific whose snapshot type it is
    (None for a snapshot of no model)."""
    models = [model for model in MODELS.values() if isinstance(snapshot, model.snapshot_type)]
    return max(models, key=lambda model: len(model.snapshot_type.__mro__)) if models else None


def fixed_observables(snapshot: EngineSnapshot, outcome: str) -> dict:
    """[OBS-3] What the spec fixes after a step, for the snapshot's own model."""
    return model_of_snapshot(snapshot).fixed_observables(snapshot, outcome)
