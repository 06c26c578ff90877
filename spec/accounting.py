"""Accounting invariants of the allocator [I1 .. I6].

Each predicate takes plain observed data and returns the `Violation`s it finds (an
empty list: the invariant holds). They never look at the order of a free list or at
which free page an allocator chose: only counts, sets and ownership [MODEL-5].

Observed data:
  * `PoolState`: one pool's free pages (a multiset) and pages waiting in a free group;
  * the full->SWA `mapping` as a sequence of slot ids;
  * `HeldSequence`s: what the caller holds, the full slots of a run of positions, and
    the first position whose SWA peer is still live (below it the SWA KV was released
    or never allocated, as for the head of a PD-decode tail).
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .notation import MAPPING_SENTINEL, NO_SWA_PEER, PADDING_PAGE, PageId, Position, SlotId, Violation


@dataclass(frozen=True)
class PoolState:
    """One pool as observed: `num_pages` allocatable pages with ids 1..num_pages."""

    name: str
    page_size: int
    num_pages: int
    free_pages: tuple[PageId, ...] | None
    """The free list, a multiset; None in a partial snapshot [OBS-4], which shows only
    `free_count`."""
    pending_pages: tuple[PageId, ...] = ()
    """Pages freed inside an open free group: no longer the caller's, not yet free."""
    free_count: int = -1
    """The length of the free list (set from `free_pages` when they are shown)."""

    def __post_init__(self):
        if self.free_pages is not None:
            object.__setattr__(self, "free_count", len(self.free_pages))


class PartialMapping(dict):
    """[OBS-4] The full->SWA mapping as a partial snapshot shows it: its length, and its
    entries at the full slots the snapshot's holders name (reading another is a
    KeyError, which a check reports as a snapshot it cannot read). A dict underneath, so
    a check reads an entry as fast as from a whole mapping's tuple."""

    def __init__(self, length: int, entries: dict[SlotId, SlotId]):
        super().__init__(entries)
        self.length = length

    @property
    def entries(self) -> dict[SlotId, SlotId]:
        return dict(self)

    def __len__(self) -> int:
        return self.length

    def __missing__(self, slot):
        if slot in (-1, self.length - 1):
            return MAPPING_SENTINEL
        raise KeyError(slot)

    def __eq__(self, other) -> bool:
        return isinstance(other, PartialMapping) and self.length == other.length and dict.__eq__(self, other)

    __hash__ = None


@dataclass(frozen=True)
class HeldSequence:
    """A run of consecutive positions the caller holds, as the allocator placed them:
    `slots[i]` is the full slot of position `start + i`."""

    slots: tuple[SlotId, ...]
    start: Position = 0
    swa_live_from: Position = 0
    """Positions below this have no live SWA peer (released, or a tail's head)."""

    def positions(self) -> range:
        return range(self.start, self.start + len(self.slots))

    def swa_live_positions(self) -> range:
        return range(max(self.start, self.swa_live_from), self.start + len(self.slots))

    def slot(self, position: Position) -> SlotId:
        return self.slots[position - self.start]


def free_list_violations(pool: PoolState) -> list[Violation]:
    """[I1, I16] A free list holds each page at most once, never the padding page, only
    ids of the pool; a page waits in a free group at most once and is not also free."""
    found = []
    free = pool.free_pages or ()  # a partial snapshot [OBS-4]: the pending pages only
    distinct = set(free)
    # the common case in C (set, min, max); the page-by-page walk only when it fails
    if len(distinct) < len(free) or (distinct and not 1 <= min(distinct) <= max(distinct) <= pool.num_pages):
        for page, count in sorted(Counter(free).items()):
            if page == PADDING_PAGE:
                found.append(Violation("I1", f"{pool.name} pool: padding page 0 is in the free list"))
            elif not 1 <= page <= pool.num_pages:
                found.append(Violation("I1", f"{pool.name} pool: page {page} is not a page of the pool (1..{pool.num_pages})"))
            if count > 1:
                found.append(Violation("I1", f"{pool.name} pool: page {page} is {count} times in the free list"))
    for page in sorted(distinct.intersection(pool.pending_pages)):
        found.append(Violation("I1", f"{pool.name} pool: page {page} is free and also pending in a free group"))
    return found + pending_violations(pool)


def pending_violations(pool: PoolState) -> list[Violation]:
    """[I16] A page waits in a free group at most once."""
    return [Violation("I16", f"{pool.name} pool: page {page} is queued {count} times in the free group")
            for page, count in sorted(Counter(pool.pending_pages).items()) if count > 1]


def pages_of(slots: Iterable[SlotId], page_size: int) -> set[PageId]:
    """The pages the given slots lie on."""
    return {slot // page_size for slot in slots}


def held_full_pages(sequences: Sequence[HeldSequence], page_size: int) -> list[PageId]:
    """Full pages held, once per sequence that holds them (a multiset across sequences)."""
    held = []
    for sequence in sequences:
        held.extend(pages_of(sequence.slots, page_size))
    return held


def held_swa_pages(sequences: Sequence[HeldSequence], mapping: Sequence[SlotId],
                   page_size: int) -> list[PageId]:
    """SWA pages held through the mapping of each sequence's live-SWA positions."""
    held = []
    for sequence in sequences:
        peers = (mapping[sequence.slot(p)] for p in sequence.swa_live_positions())
        held.extend(pages_of((peer for peer in peers if peer > 0), page_size))
    return held


def conservation_violations(pool: PoolState, held_pages: Sequence[PageId], clause: str) -> list[Violation]:
    """[I2, I3] Every page (I2 for the full pool, I3 for the SWA pool) is accounted for exactly once:
    free + pending + held == all pages. A leak shows as too few, a double
    allocation or a double free as too many."""
    accounted = pool.free_count + len(pool.pending_pages) + len(held_pages)
    if accounted == pool.num_pages:
        return []
    return [Violation(clause, (
        f"{pool.name} pool: {pool.free_count} free + {len(pool.pending_pages)} pending + "
        f"{len(held_pages)} held = {accounted} pages, but the pool has {pool.num_pages}"
        + (" (leaked pages)" if accounted < pool.num_pages else " (a page counted twice)")))]


def ownership_violations(pool: PoolState, held_pages: Sequence[PageId]) -> list[Violation]:
    """[I4] A held page is a page of the pool, has exactly one holder and is neither
    free nor pending."""
    found = []
    for page in sorted(set(held_pages)):
        if not 1 <= page <= pool.num_pages:
            found.append(Violation("I4", f"{pool.name} pool: page {page} is held but is not an allocatable page "
                                         f"(1..{pool.num_pages}; 0 is the padding page)"))
    for page, count in sorted(Counter(held_pages).items()):
        if count > 1:
            found.append(Violation("I4", f"{pool.name} pool: page {page} is held by {count} owners"))
    held = set(held_pages)  # intersection() walks the free list in C, building no set of it
    for page in sorted(held.intersection(pool.free_pages or ()) | held.intersection(pool.pending_pages)):
        found.append(Violation("I4", f"{pool.name} pool: held page {page} is also free or pending"))
    return found


def mapping_violations(mapping: Sequence[SlotId], size_full: int, page_size: int,
                       sequences: Sequence[HeldSequence], swa: PoolState) -> list[Violation]:
    """[I5, MAP-2, MAP-3] The full->SWA mapping: (a) its shape and sentinel; (b) every live-SWA
    position maps to an SWA slot that is not free; (c) no two live full slots share
    an SWA slot; (d) page-in-step: same in-page offset, one SWA page per full page;
    (e) every other full slot maps to 0."""
    found = []
    if len(mapping) != size_full + page_size + 1 or mapping[-1] != MAPPING_SENTINEL:
        found.append(Violation("I5", f"mapping must have {size_full + page_size + 1} entries ending in -1 "
                                     f"(has {len(mapping)}, last {mapping[-1] if mapping else None})"))
        return found
    peer_pages = {peer // page_size for sequence in sequences for position in sequence.swa_live_positions()
                  if (peer := mapping[sequence.slot(position)]) > 0}
    swa_free = peer_pages.intersection(swa.free_pages or ()) | peer_pages.intersection(swa.pending_pages)
    live: dict[SlotId, SlotId] = {}
    for sequence in sequences:
        for position in sequence.swa_live_positions():
            full_slot = sequence.slot(position)
            peer = mapping[full_slot]
            live[full_slot] = peer
            if peer <= 0:
                found.append(Violation("I5", f"position {position} (full slot {full_slot}) has live SWA KV but maps to {peer}"))
            elif not 1 <= peer // page_size <= swa.num_pages:
                found.append(Violation("I5", f"full slot {full_slot} maps to SWA slot {peer}, which is not on an "
                                             f"allocatable SWA page (1..{swa.num_pages})"))
            elif peer // page_size in swa_free:
                found.append(Violation("I5", f"full slot {full_slot} maps to SWA slot {peer}, whose page is free"))
            elif peer % page_size != full_slot % page_size:
                found.append(Violation("I5", f"full slot {full_slot} maps to SWA slot {peer} at another in-page offset"))
    owners: dict[SlotId, SlotId] = {}
    swa_page_of_full_page: dict[PageId, PageId] = {}
    for full_slot, peer in sorted(live.items()):
        if peer <= 0:
            continue
        if peer in owners:
            found.append(Violation("I5", f"full slots {owners[peer]} and {full_slot} share SWA slot {peer}"))
        owners[peer] = full_slot
        full_page = full_slot // page_size
        first = swa_page_of_full_page.setdefault(full_page, peer // page_size)
        if first != peer // page_size:
            found.append(Violation("I5", f"full page {full_page} maps into SWA pages {first} and {peer // page_size}"))
    if isinstance(mapping, PartialMapping):  # [OBS-4] the rest of the mapping is not shown
        return found
    # every live slot maps above 0 (else reported above): the rest are all 0 exactly when
    # the mapping has as many non-zero entries as live slots (counted in C)
    mapped = len(mapping) - 1 - mapping[:-1].count(NO_SWA_PEER)
    if mapped == sum(peer > 0 for peer in live.values()):
        return found
    for full_slot in range(size_full + page_size):
        if full_slot not in live and mapping[full_slot] != NO_SWA_PEER:
            found.append(Violation("I5", f"full slot {full_slot} holds no live SWA position but maps to {mapping[full_slot]} (stale mapping)"))
    return found


def alignment_violations(sequences: Sequence[HeldSequence], page_size: int) -> list[Violation]:
    """[I6] Each position sits at its own in-page offset (PAGE-4), positions of one page
    share one slot page, and the SWA-live boundary is page aligned."""
    found = []
    for index, sequence in enumerate(sequences):
        for position in sequence.positions():
            slot = sequence.slot(position)
            if slot % page_size != position % page_size:
                found.append(Violation("I6", f"sequence {index}: position {position} at slot {slot}, another in-page offset"))
            if position % page_size != 0 and position > sequence.start and slot != sequence.slot(position - 1) + 1:
                found.append(Violation("I6", f"sequence {index}: positions {position - 1} and {position} share a page but not a slot page"))
        boundary = max(sequence.start, sequence.swa_live_from)
        if boundary % page_size != 0 and boundary < sequence.start + len(sequence.slots):
            found.append(Violation("I6", f"sequence {index}: SWA-live boundary {boundary} is not page aligned"))
    return found


@dataclass(frozen=True)
class AllocatorState:
    """Everything observable of a hybrid allocator at a quiescent point."""

    page_size: int
    size_full: int
    full: PoolState
    swa: PoolState
    mapping: Sequence[SlotId]
    """A tuple, or a PartialMapping in a partial snapshot [OBS-4]."""

