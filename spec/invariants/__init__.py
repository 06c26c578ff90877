"""The invariants of chapters 07, 08, 09 and 10, registered by `@invariant` (kvspec.spec.registry).

Importing this package imports every module that registers one, in chapter order:

  allocator.py   [I1-I6]   the allocator tier: an allocator and what its caller holds
  accounting.py  [I1-I6, I16]  the same accounting over a two-pool engine's holders
  cursors.py     [I7]      every request's cursors (any memory model)
  window.py      [I8-I10]  window liveness and bounds
  tree.py        [I11-I14] locks, ledgers, tree structure, eviction (and LIFE-12, a
                 match's own check, which the driver applies after a match)
  atomicity.py   [I15]     a failed step changes nothing (any memory model)
  ../block_pool.py [BLOCK-1..10] one shared block pool (chapter 08)
  ../group_layouts.py [BLOCK-11] its layouts of attention groups (chapter 08)
  ../state.py    [STATE-1..9] recurrent state (chapter 09)
  ../block_pool_state.py [STATE-10..14] recurrent state in a shared block pool (chapter 09)
  ../scheduler.py [SCHED-2..8] the plans of a scheduler (chapter 10)

`INVARIANTS` is the registry, complete; `applicable(snapshot_type)` the invariants that
read such snapshots; `engine_violations` checks one step of any engine against every
invariant of its model.
"""

from .. import block_pool, block_pool_state, group_layouts, scheduler, state  # noqa: F401 - register BLOCK-1..11, STATE-1..14, SCHED-2..8
from ..notation import Violation
from ..registry import REGISTERED, Invariant, violations
from ..snapshot import EngineSnapshot, Step
from . import accounting, allocator, atomicity, cursors, tree, window  # noqa: F401 - each registers its invariants

CHAPTER_PREFIXES = ("I", "BLOCK", "STATE", "SCHED")


def chapter_order(check: Invariant) -> tuple[int, int]:
    """I1 .. I16, then BLOCK-1 .. BLOCK-8, STATE-1 .. STATE-14, SCHED-2 .. SCHED-8 (ties keep the order of registration)."""
    prefix = check.clause.rsplit("-", 1)[0] if "-" in check.clause else "I"
    return CHAPTER_PREFIXES.index(prefix), int(check.clause.rsplit("-", 1)[-1].lstrip("I"))


INVARIANTS: tuple[Invariant, ...] = tuple(sorted(REGISTERED, key=chapter_order))


def applicable(snapshot_type: type) -> tuple[Invariant, ...]:
    """The registered invariants that read snapshots of this type."""
    return tuple(check for check in INVARIANTS if check.applies_to(snapshot_type))


def engine_violations(previous: EngineSnapshot | None, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """Every invariant of `now`'s model, and of the step from `previous` when there is one."""
    return violations(applicable(type(now)), now, previous, step)
