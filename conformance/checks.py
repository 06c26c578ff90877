"""What the harness checks after every step, at each tier, and what it needs to see.

Every check is a spec predicate with its clause id and invariant class. An adapter may
declare which optional observables it offers (`observables`, a subset of OBSERVABLES;
all by default): a check that reads one it lacks is counted as skipped, never run on an
empty view and never counted as passed. Pool sizes and free counts are always required.

A step ends in one of three failures, each carrying its clauses for the report:
InvariantViolation (the implementation broke the spec), ImplementationCrash (it raised
something the spec does not allow) and StepNotApplicable (a replayed step names a
sequence or request the implementation does not have: it diverged earlier).
"""

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvspec.spec import accounting
from kvspec.spec.accounting import AllocatorState, HeldSequence
from kvspec.spec.invariants import INVARIANT_CLASSES, INVARIANTS
from kvspec.spec.notation import Violation

OBSERVABLES = ("free_sets", "mapping", "rows", "tree", "block_pool")
"""free_sets: the free page ids; mapping: the full->SWA mapping; rows: request rows and
cursors; tree: the prefix tree dump with locks and ledgers; block_pool: one shared block
pool (spec chapter 08) instead of the two pools, their mapping and the tree."""
TWO_POOL_OBSERVABLES = ("free_sets", "mapping", "rows", "tree")
"""What an adapter that declares no `observables` offers: the two-pool model, whole."""


class StepFailure(AssertionError):
    """A step that did not conform; `clauses` names what it broke."""

    kind = "violated"

    def __init__(self, message: str, clauses: Iterable[str] = ()):
        self.clauses = tuple(dict.fromkeys(clauses))
        if self.clauses and not message.startswith("["):
            message = f"[{', '.join(self.clauses)}] {message}"
        super().__init__(message)


class InvariantViolation(StepFailure):
    @classmethod
    def of(cls, violations: list[Violation], context: str = "") -> "InvariantViolation":
        failure = cls("\n".join(map(str, violations)), (v.clause for v in violations))
        if context:
            failure.args = (f"{context}\n{failure}",)
        return failure


class ImplementationCrash(StepFailure):
    """The implementation raised an exception the spec does not allow for this call."""

    kind = "crashed"


class StepNotApplicable(StepFailure):
    """A replayed step cannot be applied: the implementation diverged earlier."""

    kind = "diverged"


def leak_clauses(full_pages_leaked: int, swa_pages_leaked: int) -> list[str]:
    """[I2, I3] The conservation clause of each pool that leaked."""
    return ["I2"] * (full_pages_leaked > 0) + ["I3"] * (swa_pages_leaked > 0)


@dataclass(frozen=True)
class Check:
    clause: str
    invariant_class: str
    function: Callable
    needs: frozenset[str]
    needs_previous: bool = False


def both_pools(predicate):
    return lambda state, held: [*predicate(state.full), *predicate(state.swa)]


ALLOCATOR_CHECKS: tuple[Check, ...] = (
    Check("I1", "leak", both_pools(accounting.free_list_violations), frozenset({"free_sets"})),
    Check("I2", "leak", lambda state, held: accounting.conservation_violations(
        state.full, accounting.held_full_pages(held, state.page_size), "I2"), frozenset({"free_sets"})),
    Check("I3", "leak", lambda state, held: accounting.conservation_violations(
        state.swa, accounting.held_swa_pages(held, state.mapping, state.page_size), "I3"),
        frozenset({"free_sets", "mapping"})),
    Check("I4", "ownership", lambda state, held: [
        *accounting.ownership_violations(state.full, accounting.held_full_pages(held, state.page_size)),
        *accounting.ownership_violations(state.swa, accounting.held_swa_pages(held, state.mapping, state.page_size))],
        frozenset({"free_sets", "mapping"})),
    Check("I5", "mapping", lambda state, held: accounting.mapping_violations(
        state.mapping, state.size_full, state.page_size, held, state.swa), frozenset({"mapping"})),
    Check("I6", "alignment", lambda state, held: accounting.alignment_violations(held, state.page_size), frozenset()),
)
"""The allocator invariants (spec.accounting), checked while the machine holds `held`."""

_ENGINE_NEEDS = {  # what each engine predicate reads, beyond counts (the tree: positions below cpl)
    "engine_free_list_violations": {"free_sets"},
    "full_conservation_violations": {"free_sets", "rows", "tree"},
    "swa_conservation_violations": {"free_sets", "rows", "tree", "mapping"},
    "engine_ownership_violations": {"rows", "tree", "mapping"},
    "engine_mapping_violations": {"mapping", "rows", "tree"},
    "engine_alignment_violations": {"rows", "tree"},
    "cursor_bound_violations": {"rows"},
    "cursor_monotonicity_violations": {"rows"},
    "window_liveness_violations": {"rows", "mapping", "tree"},
    "decode_read_window_violations": {"rows", "mapping", "tree"},
    "decode_window_bound_violations": {"rows", "mapping"},
    "chunk_window_bound_violations": {"rows", "mapping", "tree"},
    "insert_boundary_violations": {"rows", "tree"},
    "lock_violations": {"rows", "tree"},
    "ledger_violations": {"tree"},
    "tree_structure_violations": {"tree", "mapping"},
    "eviction_violations": {"tree"},
    "atomicity_violations": {"rows"},
    "free_group_violations": {"free_sets"},
    "pool_accounting_violations": {"block_pool"},
    "reference_count_violations": {"block_pool"},
    "null_block_violations": {"block_pool"},
    "table_shape_violations": {"block_pool", "rows"},
    "window_coverage_violations": {"block_pool"},
    "window_release_violations": {"block_pool"},
    "cache_map_violations": {"block_pool"},
    "event_replay_violations": {"block_pool"},
}
ENGINE_CHECKS: tuple[Check, ...] = tuple(
    Check(i.clause, i.invariant_class, i.function, frozenset(_ENGINE_NEEDS[i.function.__name__]), i.needs_previous)
    for i in INVARIANTS)
"""Every registered spec invariant (spec.invariants.INVARIANTS), with what it reads."""


class Tally:
    """Per invariant class: checks run, violated, and skipped for a missing observable."""

    def __init__(self):
        self.checked, self.violated, self.skipped = Counter(), Counter(), Counter()
        self.skipped_because: dict[str, str] = {}

    def record(self, checks: Iterable[Check], observables: frozenset[str], violations: list[Violation]):
        broken = {v.clause for v in violations}
        for check in checks:
            missing = check.needs - observables
            if missing:
                self.skipped[check.invariant_class] += 1
                self.skipped_because[check.invariant_class] = f"adapter lacks observable {', '.join(sorted(missing))}"
            else:
                self.checked[check.invariant_class] += 1
                self.violated[check.invariant_class] += check.clause in broken

    def skip(self, invariant_class: str, because: str) -> None:
        """A check of this class that a step would have needed, not run."""
        self.skipped[invariant_class] += 1
        self.skipped_because[invariant_class] = because

    def merge(self, other: "Tally") -> None:
        self.checked.update(other.checked)
        self.violated.update(other.violated)
        self.skipped.update(other.skipped)
        self.skipped_because.update(other.skipped_because)

    def as_rows(self) -> dict[str, tuple[int, int, int]]:
        return {c: (self.checked[c], self.violated[c], self.skipped[c]) for c in INVARIANT_CLASSES
                if self.checked[c] or self.skipped[c]}


def run_checks(checks: Iterable[Check], observables: frozenset[str], tally: Tally, *args) -> list[Violation]:
    """Run the checks the observables allow; a predicate that cannot read what it was
    given (an index out of range) reports a violation of its clause, never a crash."""
    checks = tuple(checks)
    found = []
    for check in checks:
        if check.needs <= observables:
            try:
                found.extend(check.function(*args))
            except (IndexError, KeyError) as error:
                found.append(Violation(check.clause, f"cannot read the state: {type(error).__name__}: {error}"))
    tally.record(checks, observables, found)
    return found


def allocator_violations(state: AllocatorState, held: list[HeldSequence], observables: frozenset[str],
                         tally: Tally) -> list[Violation]:
    return run_checks(ALLOCATOR_CHECKS, observables, tally, state, held)


SNAPSHOT_CHECKS = tuple(c for c in ENGINE_CHECKS if not c.needs_previous)
STEP_CHECKS = tuple(c for c in ENGINE_CHECKS if c.needs_previous)


def engine_violations(previous, step, now, observables: frozenset[str], tally: Tally) -> list[Violation]:
    found = run_checks(SNAPSHOT_CHECKS, observables, tally, now)
    if previous is not None:
        found += run_checks(STEP_CHECKS, observables, tally, previous, step, now)
    return found
