"""[I1 .. I16] The engine invariants of spec/invariants.py: clean snapshots built by hand
report nothing, and one realistic seeded bug per clause is reported under that clause.

The snapshots (page size 4, window 8, full pool 16 pages, SWA pool 8 pages) hold:
  * node A [0, 4): SWA tombstone (the insert was below the request's cursor);
  * node B [4, 16): live SWA; A and B are the path of request r1, locked by it;
  * node C [0, 4): another prompt's unlocked leaf with live SWA;
  * request r1: cache_protected_len 16 (the tree owns [0, 16) and the row points at A
    and B), private positions [16, 22), SWA cursor 16, decoding.
`engine()` lays every holder out on pages in a fixed order, then derives the mapping,
the free lists, the lock refs and the ledgers, so every variant it builds is
consistent; seeded bugs are made with dataclasses.replace."""

from dataclasses import replace

import pytest

from kvspec.spec.accounting import AllocatorState, PoolState
from kvspec.spec.invariants import INVARIANTS, engine_violations
from kvspec.spec.outcomes import Outcome
from kvspec.spec.registry import INVARIANT_CLASSES, InvalidInvariant
from kvspec.spec.snapshot import EngineConfig, Ledgers, NodeView, RequestView, Step, TwoPoolSnapshot
from kvspec.spec.window import Policy

P, W = 4, 8
FULL_PAGES, SWA_PAGES = 16, 8
FULL_PAGE_ORDER = (3, 9, 14, 1, 6, 11, 16, 2, 8, 12, 5, 15, 4, 7, 10, 13)
SWA_PAGE_ORDER = (5, 2, 8, 1, 7, 3, 6, 4)
ROOT, A, B, C = 0, 1, 2, 3
PROMPT = tuple(range(1, 41))
OTHER_PROMPT = (100, 101, 102, 103)


class Layout:
    """Hands out pages in a fixed order and writes the full->SWA mapping."""

    def __init__(self):
        self.full_pages = list(FULL_PAGE_ORDER)
        self.swa_pages = list(SWA_PAGE_ORDER)
        self.mapping = [0] * (FULL_PAGES * P + P) + [-1]

    def full_slots(self, length: int) -> tuple[int, ...]:
        """Full slots for `length` positions that start on a page boundary."""
        slots = []
        for offset in range(0, length, P):
            page = self.full_pages.pop(0)
            slots.extend(page * P + i for i in range(min(P, length - offset)))
        return tuple(slots)

    def give_swa(self, slots: tuple[int, ...], start: int, live_from: int) -> tuple[int, ...]:
        """SWA peers for the positions at or above `live_from`, one SWA page per full page."""
        swa_page_of_full_page = {}
        for position, full_slot in zip(range(start, start + len(slots)), slots):
            if position >= live_from:
                if full_slot // P not in swa_page_of_full_page:
                    swa_page_of_full_page[full_slot // P] = self.swa_pages.pop(0)
                self.mapping[full_slot] = swa_page_of_full_page[full_slot // P] * P + full_slot % P
        return tuple(self.mapping[full_slot] for full_slot in slots)


def ledgers_of(nodes: tuple[NodeView, ...]) -> Ledgers:
    counts = {"full_evictable": 0, "full_protected": 0, "swa_evictable": 0, "swa_protected": 0}
    for node in nodes:
        if node.parent is not None:
            counts["full_protected" if node.full_lock_ref else "full_evictable"] += len(node.key)
            if node.swa_value is not None:
                counts["swa_protected" if node.swa_lock_ref else "swa_evictable"] += len(node.key)
    return Ledgers(**counts)


def engine(*, tree="path", a_live=False, b_live=True, leaf=True, cursor=16, allocated=22, committed=21,
           decode_steps=6, finished_prefill=True, seq_len=22, policy=Policy(), prefix_cache=True) -> TwoPoolSnapshot:
    """A consistent snapshot. tree: "path" (A and B, r1 locks B), "a" (A only, r1 at the
    root, admitted before A was inserted) or "none" (r1 at the root)."""
    layout = Layout()
    other_leaf = layout.full_slots(4)  # laid out first: C keeps its slots in every variant
    other_leaf_swa = layout.give_swa(other_leaf, 0, 0)
    if not (leaf and prefix_cache):  # C evicted (or never there): its pages are free again
        layout.full_pages.append(other_leaf[0] // P)
        layout.swa_pages.append(other_leaf_swa[0] // P)
        for full_slot in other_leaf:
            layout.mapping[full_slot] = 0
    path = [(A, 0, 4, a_live)] if tree in ("a", "path") else []
    path += [(B, 4, 16, b_live)] if tree == "path" else []
    nodes, row = [], []
    for node_id, start, end, live in path:
        full = layout.full_slots(end - start)
        swa = layout.give_swa(full, start, start if live else end)
        nodes.append(NodeView(node_id, ROOT, start, PROMPT[start:end], full, swa if live else None, 0, 0))
    protected = 16 if tree == "path" else 0
    row = [slot for node in nodes for slot in node.full_value][:protected]
    private = layout.full_slots(allocated - protected)
    layout.give_swa(private, protected, max(cursor, protected))
    last_node = B if tree == "path" else ROOT
    if leaf and prefix_cache:
        nodes.append(NodeView(C, ROOT, 0, OTHER_PROMPT, other_leaf, other_leaf_swa, 0, 0))
    if tree == "path":  # r1's lock: the full path A, B and the SWA segment of W tokens above its end (B alone)
        nodes = [replace(node, parent=A if node.node_id == B else ROOT, full_lock_ref=1 if node.node_id in (A, B) else 0,
                         swa_lock_ref=1 if node.node_id == B else 0) for node in nodes]
    nodes.insert(0, NodeView(ROOT, None, 0, (), (), (), 1, 1))
    request = RequestView("r1", tuple(row) + private, protected, cursor, allocated, committed, seq_len, decode_steps,
                          finished_prefill, last_node if prefix_cache else None)
    full = PoolState("full", P, FULL_PAGES, tuple(sorted(layout.full_pages)))
    swa = PoolState("swa", P, SWA_PAGES, tuple(sorted(layout.swa_pages)))
    config = EngineConfig(page_size=P, window=W, size_full=FULL_PAGES * P, size_swa=SWA_PAGES * P, policy=policy)
    nodes = tuple(nodes) if prefix_cache else ()
    return TwoPoolSnapshot(config, AllocatorState(P, FULL_PAGES * P, full, swa, tuple(layout.mapping)), (request,), nodes,
                          ledgers_of(nodes) if prefix_cache else None)


PREFILL = dict(allocated=16, committed=16, decode_steps=0, finished_prefill=False, seq_len=40)
BEFORE_FIRST_CHUNK = dict(tree="none", cursor=0, allocated=0, committed=0, decode_steps=0, finished_prefill=False, seq_len=40)
LONG_DECODE = dict(allocated=30, committed=29, decode_steps=14, seq_len=30)
DECODE, CHUNK, EVICT = Step("decode", "r1"), Step("prefill_chunk", "r1"), Step("evict")


def clauses(previous, step, now) -> set[str]:
    return {violation.clause for violation in engine_violations(previous, step, now)}


def with_request(snapshot: TwoPoolSnapshot, **changes) -> TwoPoolSnapshot:
    return replace(snapshot, requests=(replace(snapshot.requests[0], **changes),))


def with_node(snapshot: TwoPoolSnapshot, node_id: int, **changes) -> TwoPoolSnapshot:
    """The snapshot with one node changed and the ledgers recounted (the bug is in the node)."""
    nodes = tuple(replace(node, **changes) if node.node_id == node_id else node for node in snapshot.nodes)
    return replace(snapshot, nodes=nodes, ledgers=ledgers_of(nodes))


def with_pool(snapshot: TwoPoolSnapshot, pool: str, **changes) -> TwoPoolSnapshot:
    allocator = snapshot.allocator
    return replace(snapshot, allocator=replace(allocator, **{pool: replace(getattr(allocator, pool), **changes)}))


def node(snapshot: TwoPoolSnapshot, node_id: int) -> NodeView:
    return next(n for n in snapshot.nodes if n.node_id == node_id)


# -- the registry --------------------------------------------------------------------------


def test_every_clause_is_registered_once_per_part_with_a_known_class():
    assert {invariant.clause for invariant in INVARIANTS} == {f"I{n}" for n in range(1, 17)} | {
        f"BLOCK-{n}" for n in range(1, 12)} | {  # the shared block pool's (chapter 08)
        f"STATE-{n}" for n in range(1, 15)} | {  # recurrent state's (chapter 09: two-pool 1..9, block pool 10..14)
        f"SCHED-{n}" for n in range(2, 10)}  # the scheduler tier's (chapter 10; SCHED-1 states the tier itself)
    assert all(invariant.invariant_class in INVARIANT_CLASSES for invariant in INVARIANTS)
    classes = {invariant.clause: invariant.invariant_class for invariant in INVARIANTS}
    assert classes["I8"] == "window-liveness" and classes["I9"] == classes["I10"] == "window-bound"


def test_every_check_names_its_clause_first_in_its_docstring():
    for invariant in INVARIANTS:
        first_claim = invariant.function.__doc__.split("]")[0] + "]"
        assert first_claim.startswith(f"[{invariant.clause}") and first_claim[len(invariant.clause) + 1] in "],", first_claim


def test_an_unknown_class_fails_at_definition_time():
    with pytest.raises(InvalidInvariant, match="unknown invariant class"):
        replace(INVARIANTS[0], invariant_class="speed")


# -- clean snapshots -----------------------------------------------------------------------


@pytest.mark.parametrize("previous, step, now", [
    pytest.param(None, None, engine(), id="decoding-request"),
    pytest.param(engine(), DECODE, engine(), id="decode-step"),
    pytest.param(engine(**BEFORE_FIRST_CHUNK), CHUNK, engine(cursor=4, **PREFILL), id="first-chunk"),
    pytest.param(engine(**{**BEFORE_FIRST_CHUNK, "tree": "a"}, a_live=True), CHUNK, engine(cursor=4, a_live=True, **PREFILL),
                 id="chunk-over-another-requests-live-node"),
    pytest.param(engine(), EVICT, engine(leaf=False), id="evict-the-unlocked-leaf"),
    pytest.param(None, None, engine(cursor=20, policy=Policy(decode_eviction_interval=1), **LONG_DECODE), id="decode-interval-1"),
    pytest.param(engine(prefix_cache=False, tree="none", cursor=12), DECODE, engine(prefix_cache=False, tree="none", cursor=12), id="no-prefix-cache"),
    pytest.param(engine(), Step("decode", "r1", Outcome.OUT_OF_MEMORY), engine(), id="failed-decode-changes-nothing"),
    pytest.param(engine(**LONG_DECODE), Step("decode", "r1", Outcome.OUT_OF_MEMORY), engine(cursor=20, **LONG_DECODE),
                 id="failed-decode-after-its-window-eviction"),
])
def test_a_consistent_engine_has_no_violations(previous, step, now):
    assert engine_violations(previous, step, now) == []


def test_transition_checks_wait_for_a_previous_snapshot():
    changed = with_request(engine(), decode_steps=7)
    assert engine_violations(None, Step("decode", "r1", Outcome.OUT_OF_MEMORY), changed) == []


# -- seeded bugs: allocator invariants over the engine's holders ----------------------------


def test_i1_padding_page_freed():
    now = engine()
    assert "I1" in clauses(None, None, with_pool(now, "full", free_pages=now.allocator.full.free_pages + (0,)))


def test_i2_full_page_leaked():
    now = engine()
    assert clauses(None, None, with_pool(now, "full", free_pages=now.allocator.full.free_pages[1:])) == {"I2"}


def test_i3_swa_page_leaked():
    now = engine()
    assert clauses(None, None, with_pool(now, "swa", free_pages=now.allocator.swa.free_pages[1:])) == {"I3"}


def test_i4_page_of_a_locked_node_freed_while_held():
    now = engine()
    page_of_b = node(now, B).full_value[0] // P
    assert "I4" in clauses(None, None, with_pool(now, "full", free_pages=now.allocator.full.free_pages + (page_of_b,)))


def test_i5_stale_mapping_of_a_free_full_slot():
    now = engine()
    free_slot = now.allocator.full.free_pages[0] * P
    mapping = list(now.allocator.mapping)
    mapping[free_slot] = now.allocator.swa.free_pages[0] * P
    assert clauses(None, None, replace(now, allocator=replace(now.allocator, mapping=tuple(mapping)))) == {"I5"}


def test_i16_page_queued_twice_in_a_free_group():
    now = engine()
    page = now.allocator.full.free_pages[0]
    with_group = with_pool(now, "full", free_pages=now.allocator.full.free_pages[1:], pending_pages=(page, page))
    assert "I16" in clauses(None, None, with_group)


# -- seeded bugs: cursors ------------------------------------------------------------------


def test_i6_cursor_not_page_aligned():
    assert "I6" in clauses(None, None, engine(cursor=18))


def test_i6_node_not_page_aligned():
    now = engine()
    assert "I6" in clauses(None, None, with_node(now, C, key=OTHER_PROMPT[:3], full_value=node(now, C).full_value[:3],
                                                 swa_value=node(now, C).swa_value[:3]))


def test_i7_cursor_moved_backwards():
    assert clauses(engine(cursor=20, **LONG_DECODE), DECODE, engine(cursor=16, **LONG_DECODE)) == {"I7"}


def test_i7_cursor_beyond_the_allocation():
    assert "I7" in clauses(None, None, with_request(engine(), swa_evicted_seqlen=24))


# -- seeded bugs: window liveness and bounds ---------------------------------------------------


def test_i8_eviction_into_the_live_window():
    # The cursor reached 20 while the window is [13, 21): positions 16..19 lost their SWA KV.
    assert clauses(None, None, engine(cursor=20)) == {"I8"}


def test_i8_last_allocated_position_released():
    # Over-allocated to 24 with the window ending at 16: the cursor at 24 released row[23].
    now = engine(cursor=24, allocated=24, committed=16)
    assert "I8" in clauses(None, None, now)
    assert any("last allocated position" in v.message for v in engine_violations(None, None, now))


def test_i9_decode_never_evicts():
    bug = engine(cursor=16, policy=Policy(decode_eviction_interval=1), **LONG_DECODE)
    assert clauses(None, None, bug) == {"I9"}


def test_i9_chunk_without_out_of_window_release():
    # The whole chunk [0, 16) published with live SWA: the cursor stayed at 0.
    assert clauses(engine(**BEFORE_FIRST_CHUNK), CHUNK, engine(cursor=0, a_live=True, **PREFILL)) == {"I9"}


def test_i9_chunk_publishes_live_swa_below_the_cursor():
    assert clauses(engine(**BEFORE_FIRST_CHUNK), CHUNK, engine(cursor=4, a_live=True, **PREFILL)) == {"I9"}


def test_i9_reads_the_bumped_cursor_from_what_the_chunk_published_only():
    # The cursor was raised to cpl after the insert (SGLang's branch insert, SGL-8), so the
    # tree tells the insert's cursor: the live run the chunk published, [4, 16), within the
    # span. A, live before with the same slots, is another holder's, not the chunk's: found
    # by CI's SGLang Python-core differential run (engine P=1 W=3 I=4), where reading the
    # run back to 0 reported a violation SGLang did not commit.
    before = engine(tree="a", a_live=True, cursor=0, allocated=0, committed=0, decode_steps=0, finished_prefill=False,
                    seq_len=40)
    assert clauses(before, CHUNK, engine(cursor=16, a_live=True, **PREFILL)) == set()


def test_i9_a_chunk_that_revives_a_tombstone_below_its_window_publishes_it():
    # The same, but A was a tombstone before: the chunk revived it, so the run it published
    # is [0, 16), more than the span.
    before = engine(tree="a", a_live=False, cursor=0, allocated=0, committed=0, decode_steps=0, finished_prefill=False,
                    seq_len=40)
    assert clauses(before, CHUNK, engine(cursor=16, a_live=True, **PREFILL)) == {"I9"}


def test_i10_all_tombstone_leaf():
    # The frontier reached the insert boundary: [0, 16) inserted with no live SWA.
    found = clauses(engine(**BEFORE_FIRST_CHUNK), CHUNK, engine(cursor=16, b_live=False, **PREFILL))
    assert "I10" in found


# -- seeded bugs: locks, ledgers, tree ------------------------------------------------------


def test_i11_path_lock_missing():
    assert clauses(None, None, with_node(engine(), B, full_lock_ref=0, swa_lock_ref=0)) == {"I11"}


def test_i11_swa_segment_lock_missing():
    assert clauses(None, None, with_node(engine(), B, swa_lock_ref=0)) == {"I11"}


def test_i11_row_does_not_point_at_the_tree():
    now = engine()
    row = list(now.requests[0].row)
    row[5] = node(now, C).full_value[1]
    assert "I11" in clauses(None, None, with_request(now, row=tuple(row)))


def test_i12_ledger_off_by_a_page():
    now = engine()
    assert clauses(None, None, replace(now, ledgers=replace(now.ledgers, full_evictable=now.ledgers.full_evictable + P))) == {"I12"}


def test_i13_swa_value_differs_from_the_mapping():
    """[TREE-1] A node's SWA slots are exactly the mapping of its full slots."""
    now = engine()
    swa = node(now, B).swa_value
    assert clauses(None, None, with_node(now, B, swa_value=(swa[1],) + swa[1:])) == {"I13"}


def test_i13_siblings_share_a_first_page():
    assert "I13" in clauses(None, None, with_node(engine(), C, key=PROMPT[:4]))


def test_i14_locked_swa_evicted():
    # An SWA eviction that ignored B's SWA lock: B became a tombstone under the request.
    assert "I14" in clauses(engine(), EVICT, engine(b_live=False))


def test_i15_request_changed_by_a_failed_decode():
    failed = with_request(engine(), decode_steps=7, seq_len=23)
    assert clauses(engine(), Step("decode", "r1", Outcome.OUT_OF_MEMORY), failed) == {"I15"}


def test_i15_failed_admission_left_a_request():
    before = replace(engine(leaf=False), requests=())
    assert "I15" in clauses(before, Step("admit", "r1", Outcome.OUT_OF_MEMORY), engine(leaf=False))


# -- robustness ------------------------------------------------------------------------------


def test_a_malformed_snapshot_is_reported_not_raised():
    now = engine()
    row = now.requests[0].row[:-1] + (10_000,)
    found = engine_violations(None, None, with_request(now, row=row))
    assert any("cannot read this snapshot" in v.message for v in found)
