"""[OBS-1] The memory models of the spec, one per chapter that states one, each with its own snapshot type.

An engine has one memory model; its adapter declares it (by name) and its snapshots are
of that model's type. An invariant reads the snapshot type its `now` is annotated with
(kvspec.spec.registry), so a check of another model does not apply to the engine at all:
it is neither run nor counted. A model's `observables` are the parts of its snapshot an
adapter may be unable to fill in; a check that reads one the adapter lacks is skipped.

A third model (a recurrent-state pool, say) is a new entry here with its own snapshot
type, chapter and invariants; the other two stay as they are.
"""

from collections.abc import Callable
from dataclasses import dataclass

from .block_pool import BlockPoolSnapshot, block_pool_observables, drained_violations
from .notation import Violation
from .snapshot import EngineSnapshot, TwoPoolSnapshot, two_pool_drained_violations, two_pool_observables
from .window import TWO_POOL_VERSIONS, VLLM_0_33


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


TWO_POOL = MemoryModel(
    "two-pool", "chapters 01-07", TwoPoolSnapshot, ("free_sets", "mapping", "rows", "tree"), TWO_POOL_VERSIONS,
    two_pool_observables, two_pool_drained_violations)
"""Full and SWA pools with the full->SWA mapping, request rows and cursors, the prefix tree.
free_sets: the free page ids; mapping: the full->SWA mapping; rows: request rows and
cursors; tree: the prefix tree with locks and ledgers."""
BLOCK_POOL = MemoryModel(
    "block-pool", "chapter 08", BlockPoolSnapshot, ("block_pool", "rows"), (VLLM_0_33,), block_pool_observables,
    drained_violations)
"""One block pool shared by every layer group. block_pool: the pool, tables, cache map
and events; rows: the requests' rows and cursors."""

MODELS = {model.name: model for model in (TWO_POOL, BLOCK_POOL)}


def model_of_version(policy_version: str) -> MemoryModel | None:
    """The model whose engines implement a policy version (None for an unknown version)."""
    return next((model for model in MODELS.values() if policy_version in model.policy_versions), None)


def fixed_observables(snapshot: EngineSnapshot, outcome: str) -> dict:
    """[OBS-3] What the spec fixes after a step, for the snapshot's own model."""
    model = next(model for model in MODELS.values() if isinstance(snapshot, model.snapshot_type))
    return model.fixed_observables(snapshot, outcome)
