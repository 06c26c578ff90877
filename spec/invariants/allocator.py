"""[I1-I6] The allocator tier: the allocator invariants (spec/accounting.py) over an
allocator and what its caller holds.

At the allocator tier there are no requests or tree: the caller (the conformance
harness, or a test) holds sequences of slots, and the allocator's state must account for
exactly those.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from ..accounting import (
    AllocatorState,
    HeldSequence,
    alignment_violations,
    conservation_violations,
    free_list_violations,
    held_full_pages,
    held_swa_pages,
    mapping_violations,
    ownership_violations,
)
from ..notation import PageId, Violation
from ..registry import invariant, violations


@dataclass(frozen=True)
class AllocatorView:
    """What the allocator tier checks after each step: the allocator's state and the
    sequences its caller holds."""

    state: AllocatorState
    held: tuple[HeldSequence, ...]
    kept: tuple[tuple[PageId, ...], tuple[PageId, ...]] = ((), ())
    """Full and SWA pages that failed allocations kept, on an allocator that says its failed
    alloc_decode may keep what it took (ALLOC-4): charged to those calls, so that every
    invariant keeps checking the rest (a kept full slot still maps to 0, I5)."""

    def full_pages(self) -> list[PageId]:
        return [*held_full_pages(self.held, self.state.page_size), *self.kept[0]]

    def swa_pages(self) -> list[PageId]:
        return [*held_swa_pages(self.held, self.state.mapping, self.state.page_size), *self.kept[1]]


@invariant("I1", "leak", reads={"free_sets"})
def allocator_free_list_violations(now: AllocatorView) -> list[Violation]:
    """[I1] Both free lists: no duplicate, no padding page, only pages of the pool."""
    return [*free_list_violations(now.state.full), *free_list_violations(now.state.swa)]


@invariant("I2", "leak", reads={"free_sets"})
def allocator_full_conservation_violations(now: AllocatorView) -> list[Violation]:
    """[I2] free + pending + held full pages == all full pages."""
    return conservation_violations(now.state.full, now.full_pages(), "I2")


@invariant("I3", "leak", reads={"free_sets", "mapping"})
def allocator_swa_conservation_violations(now: AllocatorView) -> list[Violation]:
    """[I3] free + pending + held SWA pages == all SWA pages."""
    return conservation_violations(now.state.swa, now.swa_pages(), "I3")


@invariant("I4", "ownership", reads={"free_sets", "mapping"})
def allocator_ownership_violations(now: AllocatorView) -> list[Violation]:
    """[I4] Each held page, full or SWA, has one holder and is not free."""
    return [*ownership_violations(now.state.full, now.full_pages()),
            *ownership_violations(now.state.swa, now.swa_pages())]


@invariant("I5", "mapping", reads={"mapping"})
def allocator_mapping_violations(now: AllocatorView) -> list[Violation]:
    """[I5] Live-SWA positions map to allocated SWA slots, injectively and page-in-step;
    every other full slot maps to 0."""
    state = now.state
    return mapping_violations(state.mapping, state.size_full, state.page_size, now.held, state.swa)


@invariant("I6", "alignment")
def allocator_alignment_violations(now: AllocatorView) -> list[Violation]:
    """[I6] Held slots sit at their positions' in-page offsets."""
    return alignment_violations(now.held, now.state.page_size)


def allocator_violations(state: AllocatorState, sequences: Sequence[HeldSequence]) -> list[Violation]:
    """Every allocator invariant (I1-I6) of `state` while the caller holds `sequences`."""
    from . import applicable  # the package's registry, complete once this module is imported

    return violations(applicable(AllocatorView), AllocatorView(state, tuple(sequences)))
