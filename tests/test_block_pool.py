"""[BLOCK-1 .. BLOCK-8] The block-pool predicates of spec/block_pool.py: a clean view built
by hand reports nothing, and seeded bugs are reported under the clause they break.

The view (block size 4, window 6, groups 0 "full" and 1 "swa", 13 blocks) is a moment in
a vLLM-like engine:
  * r1: a 10-token prompt, prefilled, then three decode steps; its last allocation ran
    with 12 tokens computed and left 13 slots. Its SWA table has released the block of
    [0, 4) (6 tokens before position 12 start at 6, so block 0 is wholly outside).
  * r2: admitted with a prefix hit of 8 tokens on r1's prompt (blocks 1, 2 of the full
    group; blocks 9, 6 of the SWA group: 9 is the block r1 released, still cached and
    free until r2's hit took it back), then a prefill chunk of 2: 8 computed, 10 slots.
  * block 11: free but still cached (a finished request's block: vLLM evicts lazily);
    block 12: free, never used.
Seeded bugs are made with dataclasses.replace; where a bug would also upset the ref
counts, the free queue or the events, those are mended too, so that only the clause
under test breaks (each test asserts the exact set of clauses reported).
"""

from collections import Counter
from dataclasses import replace
from itertools import product

from kvspec.spec.block_pool import (
    FULL,
    NULL_BLOCK,
    SWA,
    Block,
    BlockPoolSnapshot,
    BlockPoolView,
    RequestBlocks,
    cache_map_violations,
    event_replay_violations,
    held_swa_blocks,
    null_block_violations,
    null_prefix_length,
    pool_accounting_violations,
    reference_count_violations,
    released_swa_blocks,
    swa_block_bound,
    table_references,
    table_shape_violations,
    window_coverage_violations,
    window_release_violations,
)
from kvspec.spec.invariants import INVARIANTS, applicable, engine_violations
from kvspec.spec.pages import pages_for
from kvspec.spec.snapshot import EngineConfig, EngineSnapshot, RequestView, TwoPoolSnapshot
from kvspec.spec.window import VLLM_0_33, Policy

BS, W = 4, 6
G_FULL, G_SWA = 0, 1
H0, H1, H2 = 0xA0, 0xA1, 0xA2
"""The chained hashes of r1's first three blocks (r2 shares the first two)."""
HC = 0xC0
"""The hash of a finished request's block, still cached in free block 11."""
PROGRESS = {"r1": {"kv_committed_len": 13, "seq_len": 14, "decode_steps": 3, "finished_prefill": True},
            "r2": {"kv_committed_len": 10, "seq_len": 16, "decode_steps": 0, "finished_prefill": False}}
"""What each request's row shows besides its slots (after the step that ran its last allocation)."""
PREDICATES = (pool_accounting_violations, reference_count_violations, null_block_violations, table_shape_violations,
              window_coverage_violations, window_release_violations, cache_map_violations, event_replay_violations)


def pool_view() -> BlockPoolView:
    """The clean view of the module docstring, written out by hand."""
    blocks = (
        Block(0, 0),                  # the null block
        Block(1, 2, (H0, G_FULL)),    # full [0, 4): r1, and r2 by its prefix hit
        Block(2, 2, (H1, G_FULL)),    # full [4, 8): r1 and r2
        Block(3, 1, (H2, G_FULL)),    # full [8, 12): r1
        Block(4, 1),                  # full [12, 13): r1, not a whole block yet: no key
        Block(5, 1),                  # full [8, 10): r2
        Block(6, 2, (H1, G_SWA)),     # SWA [4, 8): r1 and r2
        Block(7, 1, (H2, G_SWA)),     # SWA [8, 12): r1
        Block(8, 1),                  # SWA [12, 13): r1
        Block(9, 1, (H0, G_SWA)),     # SWA [0, 4): released by r1, taken back by r2's hit
        Block(10, 1),                 # SWA [8, 10): r2
        Block(11, 0, (HC, G_FULL)),   # free, still cached
        Block(12, 0),                 # free, never used
    )
    r1 = RequestBlocks("r1", ((1, 2, 3, 4), (NULL_BLOCK, 6, 7, 8)), processed=12, slots=13)
    r2 = RequestBlocks("r2", ((1, 2, 5), (9, 6, 10)), processed=8, slots=10)
    cache_map = ((H0, G_FULL, 1), (H0, G_SWA, 9), (H1, G_FULL, 2), (H1, G_SWA, 6), (H2, G_FULL, 3),
                 (H2, G_SWA, 7), (HC, G_FULL, 11))
    replayed = ((H0, G_FULL, 1), (H0, G_SWA, 1), (H1, G_FULL, 1), (H1, G_SWA, 1), (H2, G_FULL, 1),
                (H2, G_SWA, 1), (HC, G_FULL, 1))
    return BlockPoolView(block_size=BS, window=W, groups=(FULL, SWA), blocks=blocks, free_queue=(12, 11),
                         requests=(r1, r2), cache_map=cache_map, replayed_map=replayed)


def released_view() -> BlockPoolView:
    """The same pool after r1 and r2 both finished: no tables, every real block free, and
    the cached ones keep their keys (lazy eviction)."""
    view = pool_view()
    return replace(view, requests=(), blocks=tuple(replace(block, ref_cnt=0) for block in view.blocks),
                   free_queue=(12, 11, 10, 8, 5, 4, 9, 7, 6, 3, 2, 1))


def request_row(blocks: RequestBlocks) -> RequestView:
    """A request's row as a block-pool engine shows it (adapters/vllm/engine.py): the full
    table's slots, the released SWA range as the cursor, no prefix tree."""
    full = blocks.tables[G_FULL]
    row = tuple(full[i // BS] * BS + i % BS for i in range(blocks.slots))
    return RequestView(rid=blocks.rid, row=row, cache_protected_len=0,
                       swa_evicted_seqlen=null_prefix_length(blocks.tables[G_SWA]) * BS,
                       kv_allocated_len=blocks.slots, last_node=None, **PROGRESS[blocks.rid])


def engine_snapshot(view: BlockPoolView, rows: tuple[RequestView, ...] | None = None) -> BlockPoolSnapshot:
    """The snapshot of an engine showing `view`: its rows are those of `view`'s requests
    unless given."""
    if rows is None:
        rows = tuple(request_row(blocks) for blocks in view.requests)
    num_blocks = len(view.blocks)
    config = EngineConfig(page_size=BS, window=W, size_full=8 * BS, size_swa=(num_blocks - 1 - 8) * BS,
                          policy=Policy(VLLM_0_33))
    return BlockPoolSnapshot(config, rows, view)


def reported(view: BlockPoolView, rows: tuple[RequestView, ...] | None = None) -> set[str]:
    """The clauses of every violation the eight predicates find in the snapshot of `view`."""
    now = engine_snapshot(view, rows)
    return {violation.clause for predicate in PREDICATES for violation in predicate(now)}


def messages(predicate, view: BlockPoolView, rows: tuple[RequestView, ...] | None = None) -> list[str]:
    return [violation.message for violation in predicate(engine_snapshot(view, rows))]


def with_block(view: BlockPoolView, block_id: int, **changes) -> BlockPoolView:
    blocks = list(view.blocks)
    blocks[block_id] = replace(blocks[block_id], **changes)
    return replace(view, blocks=tuple(blocks))


def with_table(view: BlockPoolView, rid: str, group: int, table: tuple[int, ...]) -> BlockPoolView:
    def changed(request: RequestBlocks) -> RequestBlocks:
        tables = list(request.tables)
        tables[group] = table
        return replace(request, tables=tuple(tables))
    return replace(view, requests=tuple(changed(r) if r.rid == rid else r for r in view.requests))


def with_map(view: BlockPoolView, cache_map: tuple[tuple[int, int, int], ...]) -> BlockPoolView:
    """`view` with another prefix-cache map, and the events that would have built it (so
    that the events still agree: only the map's agreement with the blocks is at stake)."""
    keys = Counter((h, g) for h, g, _ in cache_map)
    return replace(view, cache_map=cache_map, replayed_map=tuple((h, g, n) for (h, g), n in sorted(keys.items())))


# -- clean views -------------------------------------------------------------------------------

def test_clean_view_reports_nothing():
    """[BLOCK-1, BLOCK-2, BLOCK-3, BLOCK-4, BLOCK-5, BLOCK-6, BLOCK-7, BLOCK-8] The hand-built
    view holds every clause: each predicate returns no violation."""
    now = engine_snapshot(pool_view())
    for predicate in PREDICATES:
        assert predicate(now) == [], predicate.__name__


def test_every_real_block_is_free_after_every_request_is_released():
    """[BLOCK-1, BLOCK-7] After both requests finish, every real block is in the free queue
    and the cached ones keep their keys (lazy eviction): nothing is reported. A block that
    the release forgot (ref count 0, not queued) is a leak."""
    assert reported(released_view()) == set()
    leaked = replace(released_view(), free_queue=(12, 11, 10, 8, 5, 9, 7, 6, 3, 2, 1))  # block 4 lost
    assert reported(leaked) == {"BLOCK-1"}
    assert messages(pool_accounting_violations, leaked) == ["block 4 has ref count 0 and is not in the free queue"]


def test_block_clauses_are_registered_engine_invariants():
    """[BLOCK-1, BLOCK-2, BLOCK-3, BLOCK-4, BLOCK-5, BLOCK-6, BLOCK-7, BLOCK-8] Each predicate
    is registered under its clause, so the conformance suite runs it after every step; a
    seeded bug reaches engine_violations."""
    registered = {invariant.clause: invariant.function for invariant in INVARIANTS  # BLOCK-9, BLOCK-10:
                  if invariant.clause.startswith("BLOCK-") and invariant.clause not in ("BLOCK-9", "BLOCK-10", "BLOCK-11")}
    # tests/test_reference_block_pool.py; BLOCK-11: tests/test_group_layouts.py
    assert registered == {"BLOCK-1": pool_accounting_violations, "BLOCK-2": reference_count_violations,
                          "BLOCK-3": null_block_violations, "BLOCK-4": table_shape_violations,
                          "BLOCK-5": window_coverage_violations, "BLOCK-6": window_release_violations,
                          "BLOCK-7": cache_map_violations, "BLOCK-8": event_replay_violations}
    assert not any(invariant.compares_steps for invariant in INVARIANTS if invariant.clause in registered)
    broken = engine_snapshot(replace(pool_view(), free_queue=(12, 11, 12)))
    assert "BLOCK-1" in {violation.clause for violation in engine_violations(None, None, broken)}


def test_a_check_of_the_other_memory_model_does_not_apply():
    """[BLOCK-1, BLOCK-2, BLOCK-3, BLOCK-4, BLOCK-5, BLOCK-6, BLOCK-7, BLOCK-8, OBS-1] Each
    memory model has its own snapshot type, and a check reads only its own: no BLOCK check
    applies to a two-pool snapshot, and of the two-pool checks only those of every
    engine (I7's cursors, I15's atomicity: request rows) apply to a block-pool one."""
    assert not any(check.clause.startswith("BLOCK-") for check in applicable(TwoPoolSnapshot))
    shared = {check.clause for check in applicable(BlockPoolSnapshot) if not check.clause.startswith("BLOCK-")}
    assert shared == {"I7", "I15"}
    assert all(check.snapshot_type is EngineSnapshot for check in INVARIANTS if check.clause in shared)


# -- BLOCK-1 the pool and its free queue ---------------------------------------------------------

def test_block_twice_in_the_free_queue():
    """[BLOCK-1] A double free queues block 12 twice: the next two allocations would get it."""
    broken = replace(pool_view(), free_queue=(12, 11, 12))
    assert reported(broken) == {"BLOCK-1"}
    assert messages(pool_accounting_violations, broken) == ["block 12 is 2 times in the free queue"]


def test_referenced_block_in_the_free_queue():
    """[BLOCK-1] Block 4 is queued while r1's table holds it (ref count 1): freed while in use."""
    broken = replace(pool_view(), free_queue=(12, 11, 4))
    assert reported(broken) == {"BLOCK-1"}
    assert messages(pool_accounting_violations, broken) == ["block 4 has ref count 1 and is in the free queue"]


def test_unreferenced_block_missing_from_the_free_queue():
    """[BLOCK-1] Block 12 has ref count 0 but is not queued: leaked (free + used + 1 < the pool)."""
    broken = replace(pool_view(), free_queue=(11,))
    assert reported(broken) == {"BLOCK-1"}


def test_free_queue_names_a_block_outside_the_pool():
    """[BLOCK-1] The pool has blocks 0..12; a queued id 13 is no block of it."""
    broken = replace(pool_view(), free_queue=(12, 11, 13))
    assert reported(broken) == {"BLOCK-1"}


# -- BLOCK-2 reference counts ---------------------------------------------------------------------

def test_table_references_count_every_entry_but_the_null_block():
    """[BLOCK-2] Blocks 1, 2 and 6 are each in two tables (r2's prefix hit); the null block
    in r1's SWA table is not counted, and free blocks are not held."""
    assert table_references(pool_view()) == Counter({1: 2, 2: 2, 6: 2, 3: 1, 4: 1, 5: 1, 7: 1, 8: 1, 9: 1, 10: 1})


def test_prefix_hit_that_missed_its_reference():
    """[BLOCK-2] r1 and r2 both hold SWA block 6, but its count says 1: r1's release would
    free it under r2."""
    broken = with_block(pool_view(), 6, ref_cnt=1)
    assert reported(broken) == {"BLOCK-2"}
    assert messages(reference_count_violations, broken) == ["block 6 has ref count 1 but 2 table entries hold it"]


def test_reference_count_one_too_many():
    """[BLOCK-2] r1's private block 4 counts 2 holders: it would never come back after r1 ends."""
    broken = with_block(pool_view(), 4, ref_cnt=2)
    assert reported(broken) == {"BLOCK-2"}


def test_block_held_by_tables_of_two_groups():
    """[BLOCK-2] r2's SWA table reuses its full block 5 for [8, 10) (and block 10 is freed):
    the counts and the free queue agree, but one block now holds two groups' KV."""
    view = with_table(pool_view(), "r2", G_SWA, (9, 6, 5))
    broken = replace(with_block(with_block(view, 5, ref_cnt=2), 10, ref_cnt=0), free_queue=(12, 11, 10))
    assert reported(broken) == {"BLOCK-2"}
    assert messages(reference_count_violations, broken) == ["block 5 is held by tables of groups [0, 1]"]


# -- BLOCK-3 the null block ---------------------------------------------------------------------

def test_null_prefix_length():
    """[BLOCK-3] Only the leading run of null blocks counts."""
    assert null_prefix_length(()) == 0
    assert null_prefix_length((9, 6, 10)) == 0
    assert null_prefix_length((NULL_BLOCK, 6, 7, 8)) == 1
    assert null_prefix_length((NULL_BLOCK, NULL_BLOCK)) == 2
    assert null_prefix_length((NULL_BLOCK, 6, NULL_BLOCK)) == 1


def test_null_block_in_the_free_queue():
    """[BLOCK-3, BLOCK-1] Freeing a table's released entries pushed the null block onto the
    free queue: both clauses say it never is there."""
    broken = replace(pool_view(), free_queue=(12, 11, NULL_BLOCK))
    assert reported(broken) == {"BLOCK-1", "BLOCK-3"}
    assert messages(null_block_violations, broken) == ["the null block is in the free queue"]


def test_null_block_cached():
    """[BLOCK-3] The null block carries a key and the map has it (consistently, so BLOCK-7
    and BLOCK-8 stay quiet): a prefix hit could hand it out as real KV."""
    view = with_block(pool_view(), NULL_BLOCK, block_hash=(0xD0, G_SWA))
    broken = with_map(view, (*view.cache_map, (0xD0, G_SWA, NULL_BLOCK)))
    assert reported(broken) == {"BLOCK-3"}
    assert messages(null_block_violations, broken) == ["the null block is in the prefix cache"]


def test_null_block_cached_on_one_side_only():
    """[BLOCK-3, BLOCK-7] The null block carries a key the map lacks, or the map names the
    null block under a key it does not carry: each is a null block in the prefix cache
    (BLOCK-3) and a map that disagrees with its blocks (BLOCK-7)."""
    keyed = with_block(pool_view(), NULL_BLOCK, block_hash=(0xD0, G_SWA))
    assert reported(keyed) == {"BLOCK-3", "BLOCK-7"}
    view = pool_view()
    mapped = with_map(view, (*view.cache_map, (0xD0, G_SWA, NULL_BLOCK)))
    assert reported(mapped) == {"BLOCK-3", "BLOCK-7"}


def test_null_block_counted():
    """[BLOCK-3] The null block has ref count 1 (a release took it as a real block)."""
    broken = with_block(pool_view(), NULL_BLOCK, ref_cnt=1)
    assert reported(broken) == {"BLOCK-3"}


def test_a_null_block_count_the_policy_does_not_keep_is_not_read_but_the_rest_of_block_3_is():
    """[BLOCK-3] Where the policy does not keep the null block's count (vLLM before 0.33,
    null_block_counted off), a count of -1 (a free of a table holding it, as those releases
    do) says nothing; the null block on the free queue still breaks the clause."""
    unkept = EngineConfig(page_size=BS, window=W, size_full=8 * BS, size_swa=4 * BS,
                          policy=Policy(VLLM_0_33, null_block_counted=False))
    counted = with_block(pool_view(), NULL_BLOCK, ref_cnt=-1)
    assert null_block_violations(replace(engine_snapshot(counted), config=unkept)) == []
    assert messages(null_block_violations, counted) == ["the null block has ref count -1"]
    freed = replace(counted, free_queue=(12, 11, NULL_BLOCK))
    assert [v.message for v in null_block_violations(replace(engine_snapshot(freed), config=unkept))] == [
        "the null block is in the free queue"]


def test_null_block_in_a_full_attention_table():
    """[BLOCK-3] r1's full table released [0, 4) as if it were sliding-window (block 1 now
    held by r2 only): full attention reads every token."""
    broken = with_block(with_table(pool_view(), "r1", G_FULL, (NULL_BLOCK, 2, 3, 4)), 1, ref_cnt=1)
    assert reported(broken) == {"BLOCK-3"}
    assert messages(null_block_violations, broken) == ["request r1: its full table holds the null block (1 of its entries)"]


def test_null_block_not_a_prefix_of_an_sliding_window_table():
    """[BLOCK-3] r2's SWA table has the null block in the middle (block 6 released out of
    order): entries are released from the front only."""
    broken = with_block(with_table(pool_view(), "r2", G_SWA, (9, NULL_BLOCK, 10)), 6, ref_cnt=1)
    assert reported(broken) == {"BLOCK-3"}


# -- BLOCK-4 block tables ---------------------------------------------------------------------------

def test_table_with_one_entry_too_many():
    """[BLOCK-4] r1's full table took free block 12 ahead of time: 5 entries for 13 slots
    (cdiv(13, 4) = 4)."""
    view = with_table(pool_view(), "r1", G_FULL, (1, 2, 3, 4, 12))
    broken = replace(with_block(view, 12, ref_cnt=1), free_queue=(11,))
    assert reported(broken) == {"BLOCK-4"}
    assert messages(table_shape_violations, broken) == [
        "request r1: its group 0 table has 5 entries for 13 slots (expected 4)"]


def test_tables_of_a_request_that_holds_no_kv():
    """[BLOCK-4] r2 is gone from the engine's rows (finished) but its tables were not freed."""
    view = pool_view()
    rows = (request_row(view.requests[0]),)
    assert reported(view, rows) == {"BLOCK-4"}


def test_request_holding_slots_without_a_table():
    """[BLOCK-4] A row r3 with 4 slots has no table; a row with no slots needs none."""
    view = pool_view()
    clean_rows = tuple(request_row(blocks) for blocks in view.requests)
    r3 = RequestView(rid="r3", row=(48, 49, 50, 51), cache_protected_len=0, swa_evicted_seqlen=0, kv_allocated_len=4,
                     kv_committed_len=0, seq_len=4, decode_steps=0, finished_prefill=False, last_node=None)
    assert reported(view, (*clean_rows, r3)) == {"BLOCK-4"}
    waiting = replace(r3, row=(), kv_allocated_len=0)
    assert reported(view, (*clean_rows, waiting)) == set()


def test_recorded_allocation_is_not_the_row():
    """[BLOCK-4] The view records r1's last allocation as 12 slots, the row shows 13."""
    view = pool_view()
    clean_rows = tuple(request_row(blocks) for blocks in view.requests)
    broken = replace(view, requests=(replace(view.requests[0], slots=12), view.requests[1]))
    assert reported(broken, clean_rows) == {"BLOCK-4"}


# -- BLOCK-5 window coverage ----------------------------------------------------------------------

def test_one_null_too_many_at_the_head_of_a_sliding_window_table():
    """[BLOCK-5] r1 released SWA block 6 ([4, 8)) too: after 12 tokens the next token reads
    from position 6, inside that block. (Block 6 stays held by r2, count 1.)"""
    broken = with_block(with_table(pool_view(), "r1", G_SWA, (NULL_BLOCK, NULL_BLOCK, 7, 8)), 6, ref_cnt=1)
    assert reported(broken) == {"BLOCK-5"}
    assert len(messages(window_coverage_violations, broken)) == 1


# -- BLOCK-6 window release -----------------------------------------------------------------------

def test_one_null_too_few_at_the_head_of_a_sliding_window_table():
    """[BLOCK-6] r1 kept SWA block 9 ([0, 4)) after its allocation at 12 tokens: nothing
    reads it any more, and r1 holds 4 SWA blocks where the bound is 3."""
    broken = with_block(with_table(pool_view(), "r1", G_SWA, (9, 6, 7, 8)), 9, ref_cnt=2)
    assert reported(broken) == {"BLOCK-6"}
    assert messages(window_release_violations, broken) == [
        ("request r1: holds 4 SWA blocks (0 released, 1 due after 12 tokens; at most 3 for 1 new tokens): "
         "[9, 6, 7, 8]")]


def test_release_falling_behind_within_the_bound():
    """[BLOCK-6] Two decode steps later (r1 at 14 computed, 15 slots) the next token reads
    from 8, so blocks [0, 4) and [4, 8) are both due. Releasing only the first leaves r1
    with 3 real SWA blocks, within the bound 3: only the exact release count catches it."""
    view = pool_view()
    r1, r2 = view.requests
    later = replace(view, requests=(replace(r1, processed=14, slots=15), r2))
    rows = tuple(replace(request_row(blocks), kv_committed_len=15, seq_len=16, decode_steps=5)
                 if blocks.rid == "r1" else request_row(blocks) for blocks in later.requests)
    released = with_block(with_table(later, "r1", G_SWA, (NULL_BLOCK, NULL_BLOCK, 7, 8)), 6, ref_cnt=1)
    assert reported(released, rows) == set()  # the correct step: block 6 stays r2's
    assert reported(later, rows) == {"BLOCK-6"}
    assert messages(window_release_violations, later, rows) == [
        ("request r1: holds 3 SWA blocks (1 released, 2 due after 14 tokens; at most 3 for 1 new tokens): "
         "[0, 6, 7, 8]")]


def test_more_sliding_window_blocks_than_the_bound():
    """[BLOCK-6, BLOCK-4] r2's SWA table took an extra block: its null prefix is right (none
    is due at 8 tokens) but it holds 4 blocks, over the bound 1 + cdiv(6 - 1 + 2, 4) = 3."""
    view = with_table(pool_view(), "r2", G_SWA, (9, 6, 10, 12))
    broken = replace(with_block(view, 12, ref_cnt=1), free_queue=(11,))
    assert reported(broken) == {"BLOCK-4", "BLOCK-6"}
    assert "at most 3" in messages(window_release_violations, broken)[0]


# -- BLOCK-7 the prefix-cache map ---------------------------------------------------------------

def test_cache_entry_names_a_block_with_another_key():
    """[BLOCK-7] An entry for (H1, full) names block 3, which carries (H2, full): a hit on
    r1's second block would return its third."""
    view = pool_view()
    broken = with_map(view, (*view.cache_map, (H1, G_FULL, 3)))
    assert reported(broken) == {"BLOCK-7"}
    assert messages(cache_map_violations, broken) == [
        f"cache entry ({H1:#x}, group 0) names block 3, whose key is ({H2}, 0)"]


def test_cache_entry_names_a_block_of_another_group():
    """[BLOCK-7] An entry for (H1, swa) names block 2, which carries (H1, full): the same
    hash, but the SWA group's hit would return full-attention KV."""
    view = pool_view()
    broken = with_map(view, (*view.cache_map, (H1, G_SWA, 2)))
    assert reported(broken) == {"BLOCK-7"}
    assert messages(cache_map_violations, broken) == [
        f"cache entry ({H1:#x}, group 1) names block 2, whose key is ({H1}, 0)"]


def test_cache_entry_names_no_block_of_the_pool():
    """[BLOCK-7] An entry names block 13; the pool ends at 12."""
    view = pool_view()
    assert reported(with_map(view, (*view.cache_map, (0xF0, G_FULL, 13)))) == {"BLOCK-7"}


def test_cached_block_missing_from_the_map():
    """[BLOCK-7] Block 11 was evicted from the map but kept its key (vLLM must reset it)."""
    view = pool_view()
    broken = with_map(view, tuple(entry for entry in view.cache_map if entry[2] != 11))
    assert reported(broken) == {"BLOCK-7"}
    assert messages(cache_map_violations, broken) == [
        f"block 11 is cached as ({HC}, 0) but the map has no such entry"]


def test_block_cached_for_another_group_than_its_table():
    """[BLOCK-7] r1's SWA block 7 was cached under the full group's key (H2, 0), and the map
    agrees with the block: a full-attention hit on H2 may now return SWA KV."""
    view = with_block(pool_view(), 7, block_hash=(H2, G_FULL))
    broken = with_map(view, tuple((h, G_FULL, b) if b == 7 else (h, g, b) for h, g, b in view.cache_map))
    assert reported(broken) == {"BLOCK-7"}
    assert messages(cache_map_violations, broken) == ["request r1: block 7 of its group 1 table is cached for group 0"]


def test_one_key_cached_in_two_blocks_is_allowed():
    """[BLOCK-7, BLOCK-8] Two requests computed r1's first block: free block 11 carries (H0,
    full) as block 1 does. Keys are not unique; the events count it twice, as the map does."""
    view = with_block(pool_view(), 11, block_hash=(H0, G_FULL))
    duplicated = with_map(view, tuple((H0, G_FULL, 11) if b == 11 else (h, g, b) for h, g, b in view.cache_map))
    assert (H0, G_FULL, 2) in duplicated.replayed_map
    assert reported(duplicated) == set()


# -- BLOCK-8 KV events --------------------------------------------------------------------------

def test_event_replay_with_an_extra_key():
    """[BLOCK-8] A key was stored and its removal never published: a router believes it cached."""
    view = pool_view()
    broken = replace(view, replayed_map=(*view.replayed_map, (0xB0, G_FULL, 1)))
    assert reported(broken) == {"BLOCK-8"}
    assert messages(event_replay_violations, broken) == [
        "replaying the KV events does not give the map: 1 keys differ; (0xb0, group 0): events 1, map 0"]


def test_event_replay_missing_a_key():
    """[BLOCK-8] Block 11's store event was never published: the map holds (HC, full), the events do not."""
    view = pool_view()
    broken = replace(view, replayed_map=tuple(key for key in view.replayed_map if key[0] != HC))
    assert reported(broken) == {"BLOCK-8"}


def test_event_replay_with_a_negative_count():
    """[BLOCK-8] A key was removed twice (or never stored): its replayed count is -1."""
    view = pool_view()
    broken = replace(view, replayed_map=(*view.replayed_map, (0xB1, G_SWA, -1)))
    assert reported(broken) == {"BLOCK-8"}


def test_event_replay_counting_a_key_once_the_map_holds_twice():
    """[BLOCK-8] The map holds (H0, full) in blocks 1 and 11; the events stored it once."""
    view = with_block(pool_view(), 11, block_hash=(H0, G_FULL))
    broken = replace(view, cache_map=tuple((H0, G_FULL, 11) if b == 11 else (h, g, b) for h, g, b in view.cache_map),
                     replayed_map=tuple(key for key in view.replayed_map if key[0] != HC))
    assert reported(broken) == {"BLOCK-8"}


def test_events_not_published_or_zero_counted():
    """[BLOCK-8] An engine that publishes no events (replayed_map None) has nothing to
    compare; a key stored and removed as often (count 0) is not cached."""
    view = pool_view()
    assert reported(replace(view, replayed_map=None)) == set()
    assert reported(replace(view, replayed_map=(*view.replayed_map, (0xB2, G_FULL, 0)))) == set()


# -- the window arithmetic -----------------------------------------------------------------------

def test_released_swa_blocks_worked_numbers():
    """[BLOCK-5, BLOCK-6] max(0, p - W) // bs whole blocks lie before the first position the
    next token reads (W = 6, bs = 4)."""
    assert released_swa_blocks(0, 6, 4) == 0
    assert released_swa_blocks(5, 6, 4) == 0    # p < W: the window reaches position 0
    assert released_swa_blocks(9, 6, 4) == 0    # reads from 3: block [0, 4) still needed
    assert released_swa_blocks(10, 6, 4) == 1   # reads from 4: block [0, 4) released
    assert released_swa_blocks(12, 6, 4) == 1   # r1's allocation
    assert released_swa_blocks(14, 6, 4) == 2
    assert released_swa_blocks(7, 1, 1) == 6


def test_spec_window_is_vllm_window_minus_one():
    """[BLOCK-5, BLOCK-6] vLLM's `sliding_window` counts the current token, the spec's window
    does not: vLLM built with sliding_window = W + 1 has the spec's window W. Transcribed
    from vLLM 0.33: `SlidingWindowManager.get_num_skipped_tokens` (p - sliding_window + 1,
    at least 0) released in whole blocks, and `SlidingWindowSpec.max_admission_blocks_per_request`
    (cdiv(sliding_window - 1 + in-flight tokens, bs) + 1): the same release, and a sizing
    one block above the spec's tight bound exactly when (W - 1 + C) % bs == 0."""
    for window, new_tokens, bs in product(range(1, 10), range(10), range(1, 7)):
        sliding_window = window + 1
        for p in range(3 * (window + bs)):
            assert released_swa_blocks(p, window, bs) == max(0, p - sliding_window + 1) // bs
        vllm_sizing = pages_for(sliding_window - 1 + new_tokens, bs) + 1
        extra = 1 if (window - 1 + new_tokens) % bs == 0 else 0
        assert vllm_sizing == swa_block_bound(window, new_tokens, bs) + extra


def test_swa_block_bound_worked_numbers():
    """[BLOCK-6] 1 + cdiv(W - 1 + C, bs): one block of rounding plus the window and the new tokens."""
    assert swa_block_bound(6, 1, 4) == 3    # decode: 1 + cdiv(6, 4)
    assert swa_block_bound(6, 2, 4) == 3    # r2's chunk of 2: 1 + cdiv(7, 4)
    assert swa_block_bound(6, 0, 4) == 3    # 1 + cdiv(5, 4)
    assert swa_block_bound(8, 1, 4) == 3    # 1 + cdiv(8, 4)
    assert swa_block_bound(6, 10, 4) == 5   # a 10-token prefill: 1 + cdiv(15, 4)
    assert swa_block_bound(1, 1, 1) == 2


def test_held_swa_blocks_worked_numbers():
    """[BLOCK-6] cdiv(N, bs) entries less the released ones: r1 and r2 of the clean view."""
    view = pool_view()
    for request in view.requests:
        swa = request.tables[G_SWA]
        assert held_swa_blocks(request.processed, request.slots, W, BS) == len(swa) - null_prefix_length(swa)
    assert held_swa_blocks(12, 13, 6, 4) == 3    # r1: 4 entries, 1 released
    assert held_swa_blocks(8, 10, 6, 4) == 3     # r2: 3 entries, none released
    assert held_swa_blocks(0, 10, 6, 4) == 3     # a first chunk of 10
    assert held_swa_blocks(15, 16, 6, 4) == 2    # 4 entries, 2 released


def test_swa_block_bound_holds_and_is_tight():
    """[BLOCK-6] For every small window, chunk and block size, no allocation holds more than
    swa_block_bound(W, C, bs) real SWA blocks, and some allocation holds exactly that many.
    held_swa_blocks is periodic in p (period bs) once p >= W, so p < W + 3 * bs covers all."""
    for window, new_tokens, bs in product(range(1, 13), range(13), range(1, 9)):
        bound = swa_block_bound(window, new_tokens, bs)
        held = [held_swa_blocks(p, p + new_tokens, window, bs) for p in range(window + 3 * bs)]
        assert all(count <= bound for count in held), (window, new_tokens, bs)
        assert bound in held, (window, new_tokens, bs)  # tight: some p reaches it


def test_table_entry_naming_no_block_of_the_pool():
    """[BLOCK-4] A table entry beyond the pool (block 13 of a 13-block pool) names no block:
    no reference count or key can vouch for it."""
    broken = with_table(pool_view(), "r1", G_FULL, (1, 2, 3, 13))
    assert "BLOCK-4" in reported(broken)


def test_an_allocation_recorded_ahead_of_the_computed_tokens():
    """[BLOCK-4] The allocation a request records ran with at most the tokens it has
    computed since: a `processed` ahead of kv_committed_len would loosen BLOCK-5."""
    view = pool_view()
    committed = PROGRESS["r1"]["kv_committed_len"]
    ahead = replace(view, requests=tuple(replace(r, processed=committed + 1) if r.rid == "r1" else r
                                         for r in view.requests))
    assert "BLOCK-4" in reported(ahead)


def test_a_block_shown_under_another_id():
    """[BLOCK-1] The pool lists its blocks by id: the predicates index them by position."""
    view = pool_view()
    shuffled = replace(view, blocks=(view.blocks[0], view.blocks[2], view.blocks[1], *view.blocks[3:]))
    assert "BLOCK-1" in reported(shuffled)
