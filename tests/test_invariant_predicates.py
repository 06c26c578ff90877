"""[I1 .. I6] Every predicate of spec/accounting.py on a clean state built by the reference
(no violations), and on seeded corruptions of that state (one violation class each,
reported under the right clause id).

The clean state holds three sequences in a page-4 hybrid allocator:
  * A: 10 fresh tokens, SWA of its first page released (swa_live_from 4);
  * B: a PD-decode SWA-tail allocation of 12 tokens, head 8, tail 4;
  * C: a fork of A at the page-aligned prefix 4, grown to 9 tokens (holds positions 4..8).
Corruptions are made with dataclasses.replace on `HybridAllocator.state()`."""

from dataclasses import replace

import pytest

from kvspec.reference import HybridAllocator
from kvspec.spec.accounting import (
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
from kvspec.spec.invariants.allocator import allocator_violations

P = 4


def held(row: list[int], swa_live_from: int = 0, first: int = 0) -> HeldSequence:
    """What a caller holds of `row`: positions `first ..`, with live SWA from `swa_live_from`."""
    return HeldSequence(slots=tuple(row[first:]), start=first, swa_live_from=swa_live_from)


class World:
    """The reference allocator and what its caller holds."""

    def __init__(self):
        self.allocator = HybridAllocator(12 * P, 10 * P, P)
        a = self.allocator.alloc_extend([0], [10], [-1]).tolist()
        b = self.allocator.alloc_extend_swa_tail(0, 12, -1, 4).tolist()
        c = a[:4] + self.allocator.alloc_extend([4], [9], [a[3]]).tolist()
        self.allocator.free_swa_segment(a[:4], 0)
        self.a, self.b, self.c = a, b, c
        self.sequences = [
            held(a, swa_live_from=4),
            held(b, swa_live_from=8),
            held(c, swa_live_from=4, first=4),
        ]
        self.state: AllocatorState = self.allocator.state()

    @property
    def full_held(self):
        return held_full_pages(self.sequences, P)

    @property
    def swa_held(self):
        return held_swa_pages(self.sequences, self.state.mapping, P)

    def peer(self, full_slot: int) -> int:
        return self.state.mapping[full_slot]

    def with_mapping(self, changes: dict[int, int]) -> AllocatorState:
        mapping = list(self.state.mapping)
        for slot, value in changes.items():
            mapping[slot] = value
        return replace(self.state, mapping=tuple(mapping))

    def mapping_of(self, state: AllocatorState, sequences=None):
        return mapping_violations(state.mapping, state.size_full, P,
                                  self.sequences if sequences is None else sequences, state.swa)


@pytest.fixture
def world() -> World:
    return World()


def clauses(violations) -> set[str]:
    return {violation.clause for violation in violations}


def assert_found(violations, clause: str, fragment: str):
    """At least one violation, all under `clause`, one of them saying `fragment`."""
    assert violations, f"expected a [{clause}] violation saying {fragment!r}, found none"
    assert clauses(violations) == {clause}, violations
    assert any(fragment in violation.message for violation in violations), violations
    assert all(str(violation).startswith(f"[{clause}] ") for violation in violations)


def pool_of(state: AllocatorState, name: str):
    return state.full if name == "full" else state.swa


# -- the clean state ------------------------------------------------------------------------

def test_world_is_what_the_docstring_says(world):
    state = world.state
    assert len(state.full.free_pages) == 12 - 3 - 3 - 2
    assert len(state.swa.free_pages) == 10 - 2 - 1 - 2
    assert [world.peer(slot) for slot in world.b[:8]] == [0] * 8
    assert [world.peer(slot) for slot in world.a[:4]] == [0] * 4


def test_clean_state_has_no_violation_in_any_predicate(world):
    state = world.state
    assert free_list_violations(state.full) == free_list_violations(state.swa) == []
    assert conservation_violations(state.full, world.full_held, "I2") == []
    assert conservation_violations(state.swa, world.swa_held, "I3") == []
    assert ownership_violations(state.full, world.full_held) == []
    assert ownership_violations(state.swa, world.swa_held) == []
    assert world.mapping_of(state) == []
    assert alignment_violations(world.sequences, P) == []
    assert allocator_violations(state, world.sequences) == []


def test_clean_state_with_an_open_free_group(world):
    world.allocator.free_group_begin()
    world.allocator.free_segment(world.c[4:], 4)
    world.allocator.free_full_segment(world.a[:4], 0)
    state = world.allocator.state()
    assert len(state.full.pending_pages) == 3 and len(state.swa.pending_pages) == 2
    remaining = [held(world.a, swa_live_from=4, first=4), world.sequences[1]]
    assert allocator_violations(state, remaining) == []
    world.allocator.free_group_end()
    assert allocator_violations(world.allocator.state(), remaining) == []


def test_an_empty_allocator_has_no_violation():
    for page_size in (1, 4):
        assert allocator_violations(HybridAllocator(8 * page_size, 4 * page_size, page_size).state(), []) == []


# -- [I1] free_list_violations ----------------------------------------------------------------

@pytest.mark.parametrize("pool_name", ["full", "swa"])
def test_i1_duplicate_free_page(world, pool_name):
    pool = pool_of(world.state, pool_name)
    bad = replace(pool, free_pages=pool.free_pages + (pool.free_pages[0],))
    assert_found(free_list_violations(bad), "I1", f"page {pool.free_pages[0]} is 2 times in the free list")


@pytest.mark.parametrize("pool_name", ["full", "swa"])
def test_i1_padding_page_in_free_list(world, pool_name):
    pool = pool_of(world.state, pool_name)
    bad = replace(pool, free_pages=(0,) + pool.free_pages)
    assert_found(free_list_violations(bad), "I1", "padding page 0 is in the free list")


@pytest.mark.parametrize("pool_name", ["full", "swa"])
@pytest.mark.parametrize("offset", [1, 7])
def test_i1_out_of_range_page(world, pool_name, offset):
    pool = pool_of(world.state, pool_name)
    page = pool.num_pages + offset
    bad = replace(pool, free_pages=pool.free_pages + (page,))
    assert_found(free_list_violations(bad), "I1", f"page {page} is not a page of the pool")


def test_i1_negative_page(world):
    bad = replace(world.state.full, free_pages=world.state.full.free_pages + (-1,))
    assert_found(free_list_violations(bad), "I1", "page -1 is not a page of the pool")


@pytest.mark.parametrize("pool_name", ["full", "swa"])
def test_i1_page_free_and_pending(world, pool_name):
    pool = pool_of(world.state, pool_name)
    bad = replace(pool, pending_pages=(pool.free_pages[-1],))
    assert_found(free_list_violations(bad), "I1", "is free and also pending in a free group")


@pytest.mark.parametrize("pool_name", ["full", "swa"])
def test_i16_page_queued_twice_in_a_free_group(world, pool_name):
    pool = pool_of(world.state, pool_name)
    page = held_of(world, pool_name)[0]
    bad = replace(pool, pending_pages=(page, page))
    assert_found(free_list_violations(bad), "I16", f"page {page} is queued 2 times in the free group")


# -- [I2, I3] conservation_violations ---------------------------------------------------------

def held_of(world, pool_name):
    return world.full_held if pool_name == "full" else world.swa_held


@pytest.mark.parametrize("pool_name, clause", [("full", "I2"), ("swa", "I3")])
def test_conservation_leaked_page(world, pool_name, clause):
    pool = pool_of(world.state, pool_name)
    bad = replace(pool, free_pages=pool.free_pages[1:])  # a page neither free nor held
    assert_found(conservation_violations(bad, held_of(world, pool_name), clause), clause, "(leaked pages)")


@pytest.mark.parametrize("pool_name, clause", [("full", "I2"), ("swa", "I3")])
def test_conservation_page_forgotten_by_its_holder(world, pool_name, clause):
    pool = pool_of(world.state, pool_name)
    held = held_of(world, pool_name)[1:]
    assert_found(conservation_violations(pool, held, clause), clause, "(leaked pages)")


@pytest.mark.parametrize("pool_name, clause", [("full", "I2"), ("swa", "I3")])
def test_conservation_double_counted_page(world, pool_name, clause):
    pool = pool_of(world.state, pool_name)
    held = held_of(world, pool_name)
    bad = replace(pool, free_pages=pool.free_pages + (held[0],))  # held and returned
    assert_found(conservation_violations(bad, held, clause), clause, "(a page counted twice)")


@pytest.mark.parametrize("pool_name, clause", [("full", "I2"), ("swa", "I3")])
def test_conservation_page_pending_and_held(world, pool_name, clause):
    pool = pool_of(world.state, pool_name)
    held = held_of(world, pool_name)
    bad = replace(pool, pending_pages=(held[-1],))
    assert_found(conservation_violations(bad, held, clause), clause, "1 pending")


# -- [I4] ownership_violations -------------------------------------------------------------------

@pytest.mark.parametrize("pool_name", ["full", "swa"])
def test_i4_page_held_twice(world, pool_name):
    pool = pool_of(world.state, pool_name)
    held = held_of(world, pool_name)
    assert_found(ownership_violations(pool, held + [held[0]]), "I4", f"page {held[0]} is held by 2 owners")


def test_i4_two_sequences_holding_one_row(world):
    a = world.sequences[0]
    held = held_full_pages([a, a], P)
    assert_found(ownership_violations(world.state.full, held), "I4", "held by 2 owners")


@pytest.mark.parametrize("pool_name", ["full", "swa"])
def test_i4_held_page_also_free(world, pool_name):
    pool = pool_of(world.state, pool_name)
    held = held_of(world, pool_name)
    bad = replace(pool, free_pages=pool.free_pages + (held[0],))
    assert_found(ownership_violations(bad, held), "I4", f"held page {held[0]} is also free or pending")


@pytest.mark.parametrize("pool_name", ["full", "swa"])
def test_i4_held_page_also_pending(world, pool_name):
    pool = pool_of(world.state, pool_name)
    held = held_of(world, pool_name)
    bad = replace(pool, pending_pages=(held[0],))
    assert_found(ownership_violations(bad, held), "I4", f"held page {held[0]} is also free or pending")


# -- [I5] mapping_violations ----------------------------------------------------------------------

def test_i5a_wrong_mapping_length(world):
    bad = replace(world.state, mapping=world.state.mapping[:-2] + (-1,))
    assert_found(world.mapping_of(bad), "I5", f"mapping must have {12 * P + P + 1} entries ending in -1")


def test_i5a_missing_sentinel(world):
    bad = replace(world.state, mapping=world.state.mapping[:-1] + (0,))
    assert_found(world.mapping_of(bad), "I5", "ending in -1 (has 53, last 0)")


def test_i5b_live_position_mapped_to_zero(world):
    slot = world.a[5]
    assert_found(world.mapping_of(world.with_mapping({slot: 0})), "I5",
                 f"position 5 (full slot {slot}) has live SWA KV but maps to 0")


def test_i5b_live_position_mapped_to_a_free_swa_page(world):
    slot = world.a[9]
    free_page = world.state.swa.free_pages[0]
    peer = free_page * P + slot % P
    assert_found(world.mapping_of(world.with_mapping({slot: peer})), "I5",
                 f"full slot {slot} maps to SWA slot {peer}, whose page is free")


def test_i5b_live_position_mapped_to_a_pending_swa_page(world):
    slot = world.a[9]
    pending_page = world.state.swa.free_pages[0]
    swa = replace(world.state.swa, free_pages=world.state.swa.free_pages[1:], pending_pages=(pending_page,))
    bad = replace(world.with_mapping({slot: pending_page * P + slot % P}), swa=swa)
    assert_found(world.mapping_of(bad), "I5", "whose page is free")


def test_i5c_two_full_slots_share_one_swa_slot(world):
    # position 4 of A and position 4 of C both at in-page offset 0
    a_slot, c_slot = world.a[4], world.c[4]
    bad = world.with_mapping({c_slot: world.peer(a_slot)})
    assert_found(world.mapping_of(bad), "I5", f"share SWA slot {world.peer(a_slot)}")


def test_i5d_different_in_page_offset(world):
    # position 9 of A sits at offset 1 of its page; offsets 2, 3 of its SWA page are unused
    slot = world.a[9]
    bad = world.with_mapping({slot: world.peer(slot) + 1})
    assert_found(world.mapping_of(bad), "I5", "at another in-page offset")


def test_i5d_one_full_page_split_across_two_swa_pages(world):
    # position 6 of A (offset 2) moved to offset 2 of the SWA page of positions 8..11,
    # whose offset 2 is unused: same offset, not shared, not free, but two SWA pages.
    slot = world.a[6]
    other = world.peer(world.a[8]) + 2
    bad = world.with_mapping({slot: other})
    assert_found(world.mapping_of(bad), "I5", f"full page {slot // P} maps into SWA pages")


def test_i5e_stale_entry_on_a_free_full_page(world):
    slot = world.state.full.free_pages[0] * P + 1
    bad = world.with_mapping({slot: world.state.swa.free_pages[0] * P + 1})
    assert_found(world.mapping_of(bad), "I5", f"full slot {slot} holds no live SWA position")


@pytest.mark.parametrize("which", ["released front of A", "head of B"])
def test_i5e_stale_entry_where_swa_was_released(world, which):
    slot = world.a[1] if which == "released front of A" else world.b[3]
    bad = world.with_mapping({slot: world.state.swa.free_pages[0] * P + slot % P})
    assert_found(world.mapping_of(bad), "I5", "(stale mapping)")


def test_i5e_stale_entry_on_the_padding_page(world):
    bad = world.with_mapping({2: 6})
    assert_found(world.mapping_of(bad), "I5", "full slot 2 holds no live SWA position but maps to 6")


def test_i5b_live_page_moved_onto_the_swa_padding_page(world):
    # Moving a live full page onto SWA page 0 (what SGLang does when mapping[last_loc] == 0)
    # always maps its offset-0 slot to 0: a live page starts at offset 0 (I6).
    bad = world.with_mapping({world.a[8]: 0, world.a[9]: 1})
    assert_found(world.mapping_of(bad), "I5", f"full slot {world.a[8]}) has live SWA KV but maps to 0")


def test_i5b_live_page_moved_outside_the_swa_pool(world):
    # SPEC GAP (reported): I5(b) says a live peer must be an *allocated* SWA slot, but the
    # predicate only rejects peers <= 0 and peers on free pages. Move the whole last page
    # of A (positions 8, 9) to a page past the SWA pool, same offsets: the real SWA page
    # is leaked but the bogus one is counted as held, so I3 balances, I4 sees no free
    # page held, and every I5 clause passes.
    outside_page = world.state.swa.num_pages + 5
    moved = {world.a[8]: outside_page * P, world.a[9]: outside_page * P + 1}
    bad = world.with_mapping(moved)
    assert allocator_violations(bad, world.sequences) != [], "a leaked SWA page went unnoticed"
    assert_found(world.mapping_of(bad), "I5", f"maps to SWA slot {outside_page * P}")


# -- [I6] alignment_violations -------------------------------------------------------------------

def with_slot(sequence: HeldSequence, position: int, slot: int) -> HeldSequence:
    slots = list(sequence.slots)
    slots[position - sequence.start] = slot
    return replace(sequence, slots=tuple(slots))


def test_i6_slot_at_another_in_page_offset(world):
    a = world.sequences[0]
    bad = with_slot(a, 5, world.a[5] + 1)
    assert_found(alignment_violations([bad], P), "I6", "position 5 at slot")


def test_i6_page_split_across_slot_pages(world):
    # position 5 moved to offset 1 of another page: right offset, wrong page
    a = world.sequences[0]
    other_page = world.state.full.free_pages[0]
    bad = with_slot(a, 5, other_page * P + 1)
    assert_found(alignment_violations([bad], P), "I6", "positions 4 and 5 share a page but not a slot page")


@pytest.mark.parametrize("swa_live_from, first", [(2, 0), (0, 5), (6, 4)])
def test_i6_unaligned_swa_boundary(world, swa_live_from, first):
    bad = held(world.a, swa_live_from=swa_live_from, first=first)
    boundary = max(swa_live_from, first)
    assert_found(alignment_violations([bad], P), "I6", f"SWA-live boundary {boundary} is not page aligned")


def test_i6_boundary_at_the_end_of_the_row_needs_no_alignment(world):
    # a sequence whose SWA is released up to its (unaligned) end has no live boundary
    a = world.sequences[0]
    assert alignment_violations([replace(a, swa_live_from=len(world.a))], P) == []


def test_i6_sequence_index_in_the_message(world):
    c = world.sequences[2]
    bad = with_slot(c, 6, world.c[6] + 1)
    assert_found(alignment_violations([world.sequences[0], bad], P), "I6", "sequence 1: position 6")


# -- allocator_violations: every seeded bug surfaces under its clause ----------------------------

def corruptions(world: World):
    """(name, state, sequences, clause) for one corruption of each kind."""
    state, seqs = world.state, world.sequences
    full, swa = state.full, state.swa
    yield "duplicate free page", replace(state, full=replace(full, free_pages=full.free_pages * 2)), seqs, "I1"
    yield "padding page free", replace(state, swa=replace(swa, free_pages=(0,) + swa.free_pages[1:])), seqs, "I1"
    yield "leaked full page", replace(state, full=replace(full, free_pages=full.free_pages[1:])), seqs, "I2"
    yield "leaked SWA page", replace(state, swa=replace(swa, free_pages=swa.free_pages[1:])), seqs, "I3"
    yield "full page held twice", state, seqs + [seqs[0]], "I4"
    yield "held SWA page free", replace(state, swa=replace(
        swa, free_pages=swa.free_pages[1:] + (world.peer(world.a[4]) // P,))), seqs, "I4"
    yield "stale mapping", world.with_mapping({world.b[0]: 0 + world.state.swa.free_pages[0] * P}), seqs, "I5"
    yield "live peer 0", world.with_mapping({world.c[8]: 0}), seqs, "I5"
    yield "unaligned boundary", state, [replace(seqs[0], swa_live_from=5)] + seqs[1:], "I6"


@pytest.mark.parametrize("index", range(9))
def test_allocator_violations_reports_each_seeded_bug_under_its_clause(world, index):
    name, state, sequences, clause = list(corruptions(world))[index]
    found = allocator_violations(state, sequences)
    assert clause in clauses(found), f"{name}: expected [{clause}], got {found}"


def test_allocator_violations_reports_several_bugs_at_once(world):
    state = world.with_mapping({world.a[5]: 0})
    state = replace(state, full=replace(state.full, free_pages=state.full.free_pages + (0,)))
    found = allocator_violations(state, world.sequences)
    assert {"I1", "I2", "I5"} <= clauses(found)
