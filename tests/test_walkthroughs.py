"""The worked examples of docs/engines/sglang.md (SGLang 0.5.23), replayed on the reference
engine step by step, with every invariant checked after every step:

  * §4.3 [LIFE-4, WIN-3, TREE-3, TREE-4]: a 40-token prompt prefilled in three chunks
    of 16 (W = 8, P = 4): cursors, tombstones, live nodes, locks and ledgers after each
    checkpoint, and an SWA footprint of O(W) per chunk;
  * §4.4 [LIFE-8, LIFE-5]: the same request decoding with I = 4: when the cursor moves,
    what is freed, and what its finish leaves in the tree;
  * §5 [LIFE-6, WIN-6]: PD-decode pre-allocation of 30 tokens, without a prefix cache and
    with a cached prefix of 12 (and one of 24, cut at fill - tail);
  * §4.1 [WIN-2, WIN-3, WIN-5]: the table of worked numbers of `eviction_frontier` and the
    window span right after an eviction;
  * §3.3 [WIN-7, TREE-3]: the match example, by `swa_match_length` and by the tree.
"""

import pytest

from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.pages import ceil_page, floor_page
from kvspec.spec.snapshot import EngineConfig, NodeView, RequestView, Step, TwoPoolSnapshot
from kvspec.spec.window import (
    DESIGN_MARGIN,
    DROP_MARGIN,
    NO_PREFIX_SHARING,
    SGLANG_0_5_23,
    Policy,
    eviction_frontier,
    eviction_span_bound,
    retention,
    swa_match_length,
    swa_tail_len,
)

P, W = 4, 8
PROMPT = list(range(100, 140))
"""40 distinct tokens: every node of the walk-through is cut by the lifecycle, never by a
chance match."""


def config(version: str = SGLANG_0_5_23, interval: int = 4) -> EngineConfig:
    return EngineConfig(page_size=P, window=W, size_full=128, size_swa=64, policy=Policy(version, interval))


class Walk:
    """An engine whose every operation is followed by `check_invariants(previous, step)`."""

    def __init__(self, engine_config: EngineConfig):
        self.engine = TwoPoolEngine(engine_config)
        self.snapshot = self.engine.check_invariants()

    def __call__(self, operation: str, rid: str | None, *args):
        outcome = getattr(self.engine, operation)(*(() if rid is None else (rid,)), *args)
        step = Step(operation, rid, type(outcome).__name__ if isinstance(outcome, OutOfMemory) else "ok")
        self.snapshot = self.engine.check_invariants(self.snapshot, step)
        return outcome

    def request(self, rid: str) -> RequestView:
        return next(r for r in self.snapshot.requests if r.rid == rid)

    def nodes(self) -> dict[int, NodeView]:
        return {node.node_id: node for node in self.snapshot.nodes}

    def path(self, rid: str) -> list[NodeView]:
        """The nodes from the root's child down to the request's last node."""
        nodes, path = self.nodes(), []
        node = nodes[self.request(rid).last_node]
        while node.parent is not None:
            path.append(node)
            node = nodes[node.parent]
        return path[::-1]

    def free_pages(self) -> tuple[int, int]:
        allocator = self.snapshot.allocator
        return len(allocator.full.free_pages), len(allocator.swa.free_pages)

    def swa_peer(self, full_slot: int) -> int:
        return self.snapshot.allocator.mapping[full_slot]


def layout(path: list[NodeView]) -> list[tuple[int, int, bool]]:
    """(start, end, live SWA) of each node."""
    return [(node.start, node.end, node.swa_value is not None) for node in path]


def locks(path: list[NodeView]) -> list[tuple[int, int]]:
    """(full lock ref, SWA lock ref) of each node."""
    return [(node.full_lock_ref, node.swa_lock_ref) for node in path]


def live_swa_tokens(snapshot: TwoPoolSnapshot) -> int:
    return sum(len(node.key) for node in snapshot.nodes if node.parent is not None and node.swa_value is not None)


def assert_every_page_accounted_for(snapshot: TwoPoolSnapshot) -> None:
    """With no request running: free pages plus the tree's pages are the whole pool."""
    assert not snapshot.requests
    nodes = [node for node in snapshot.nodes if node.parent is not None]
    full_held = {slot // P for node in nodes for slot in node.full_value}
    swa_held = {slot // P for node in nodes if node.swa_value is not None for slot in node.swa_value}
    full, swa = snapshot.allocator.full, snapshot.allocator.swa
    assert not full_held & set(full.free_pages) and not swa_held & set(swa.free_pages)
    assert len(full_held) + len(full.free_pages) == full.num_pages
    assert len(swa_held) + len(swa.free_pages) == swa.num_pages


# -- §4.3 chunked prefill ---------------------------------------------------------------------

def prefill_in_three_chunks(walk: Walk) -> list[dict]:
    """Admit r with PROMPT and prefill it in chunks of 16; what each checkpoint left."""
    assert walk("admit", "r", PROMPT) is None
    assert walk.request("r").cache_protected_len == 0  # nothing cached yet
    seen = []
    for _ in range(3):
        swa_free_before = walk.free_pages()[1]
        assert walk("prefill_chunk", "r", 16, 7) is None
        seen.append(dict(request=walk.request("r"), path=walk.path("r"), ledgers=walk.snapshot.ledgers,
                         swa_pages_taken=swa_free_before - walk.free_pages()[1], live=live_swa_tokens(walk.snapshot)))
    return seen


def test_4_3_chunked_prefill_walkthrough():
    """[LIFE-2, LIFE-4, WIN-3, TREE-3, TREE-4] docs/engines/sglang.md §4.3, checkpoint by checkpoint:
    the request's lengths and cursor after each."""
    walk = Walk(config())
    chunk1, chunk2, chunk3 = prefill_in_three_chunks(walk)

    # chunk 1: pre_len 15, thr 15 - 8 = 7, e = 4; insert [0,16): A tombstone, B1 + B2 live (B2 = ceilP(W))
    r = chunk1["request"]
    assert (r.cache_protected_len, r.swa_evicted_seqlen) == (16, 4)
    assert (r.kv_allocated_len, r.kv_committed_len, r.finished_prefill) == (16, 16, False)
    assert layout(chunk1["path"]) == [(0, 4, False), (4, 8, True), (8, 16, True)]
    a, b1, b2 = chunk1["path"]
    assert r.last_node == b2.node_id
    assert locks(chunk1["path"]) == [(1, 0), (1, 0), (1, 1)]  # full path A, B1, B2; SWA segment B2 only
    ledgers = chunk1["ledgers"]
    assert (ledgers.full_protected, ledgers.full_evictable, ledgers.swa_protected, ledgers.swa_evictable) == (16, 0, 8, 4)
    assert r.row[:16] == a.full_value + b1.full_value + b2.full_value  # the row points at the tree

    # chunk 2: cursor bumped to the protected length 16, thr 23, e = 20; C0 tombstone, C1 + C2 live
    r = chunk2["request"]
    assert (r.cache_protected_len, r.swa_evicted_seqlen) == (32, 20)
    assert layout(chunk2["path"]) == [(0, 4, False), (4, 8, True), (8, 16, True),
                                      (16, 20, False), (20, 24, True), (24, 32, True)]
    assert [node.node_id for node in chunk2["path"][:3]] == [a.node_id, b1.node_id, b2.node_id]  # A, B1, B2 untouched
    assert r.last_node == chunk2["path"][-1].node_id
    assert locks(chunk2["path"]) == [(1, 0)] * 5 + [(1, 1)]  # the lock moved to C2: B2's SWA is no longer locked
    ledgers = chunk2["ledgers"]
    assert (ledgers.swa_protected, ledgers.swa_evictable) == (8, 4 + 8 + 4)  # B1, B2 and C1 evictable
    assert (ledgers.full_protected, ledgers.full_evictable) == (32, 0)

    # chunk 3 (last): cursor bumped to 32, thr 31: nothing freed; D [32,40) live and locked
    r = chunk3["request"]
    assert (r.cache_protected_len, r.swa_evicted_seqlen) == (40, 32)
    assert (r.finished_prefill, r.seq_len, r.decode_steps) == (True, 41, 0)
    assert layout(chunk3["path"]) == layout(chunk2["path"]) + [(32, 40, True)]
    assert locks(chunk3["path"]) == [(1, 0)] * 6 + [(1, 1)]
    ledgers = chunk3["ledgers"]
    assert (ledgers.swa_protected, ledgers.swa_evictable, ledgers.full_protected) == (8, 24, 40)


def test_4_3_swa_footprint_is_bounded_by_the_window_per_chunk():
    """[WIN-5, bug class 7.1] With the out-of-window release every unclamped checkpoint
    leaves exactly cW + P = 12 live SWA tokens of its chunk, not the chunk's 16: after
    chunk 2 the tree holds live SWA on [4, 16) and [20, 32) (24 tokens), where without
    the release it would hold all of [0, 32). The request holds no private KV between
    chunks (each checkpoint caches all it computed), so the SWA pool holds just the tree's."""
    walk = Walk(config())
    chunks = prefill_in_three_chunks(walk)
    span = eviction_span_bound(retention(SGLANG_0_5_23, W, P), P)
    assert span == ceil_page(W, P) + P == 12
    assert [chunk["live"] for chunk in chunks] == [12, 24, 32]
    assert [chunk["swa_pages_taken"] * P for chunk in chunks] == [12, 12, 8]  # 16 allocated, 4 freed, twice
    for chunk in chunks[:2]:
        r = chunk["request"]
        assert r.cache_protected_len - r.swa_evicted_seqlen == span  # the new leaf's live part
        assert r.kv_allocated_len == r.cache_protected_len  # nothing private
    assert chunks[1]["live"] < 32  # the counterfactual without the release: all of [0, 32) live


def test_3_3_match_after_each_checkpoint():
    """[LIFE-3, WIN-7, TREE-3] A second request with the same prompt matches exactly up to each
    insert end: after chunk 1 the path A tombstone, B1, B2 accepts at B2 (16), after
    chunk 2 at C2 (32), whose live run after the tombstone C0 is 12 >= W."""
    for chunks, expected in ((1, 16), (2, 32)):
        walk = Walk(config())
        walk("admit", "r", PROMPT)
        for _ in range(chunks):
            walk("prefill_chunk", "r", 16, 7)
        path = [(len(node.key), node.swa_value is not None) for node in walk.path("r")]
        assert swa_match_length(path, W) == expected
        assert walk("admit", "q", PROMPT) is None
        q = walk.request("q")
        assert q.cache_protected_len == expected and q.last_node == walk.request("r").last_node


def test_3_3_match_example():
    """[WIN-7] A [0,4) tombstone, B1 [4,8) live, B2 [8,16) live, W = 8: A rejects
    (run 0), B1 rejects (run 4), B2 accepts (run 12): match length 16."""
    assert swa_match_length([(4, False), (4, True), (8, True)], 8) == 16
    assert swa_match_length([(4, False), (4, True)], 8) == 0
    assert swa_match_length([(4, True), (4, True)], 8) == 8  # no tombstone: every node accepts
    assert swa_match_length([(8, True), (4, False), (4, True), (4, True), (4, True)], 8) == 24


# -- §4.4 decode -----------------------------------------------------------------------------

def test_4_4_decode_walkthrough_and_finish():
    """[LIFE-8, WIN-4, LIFE-5] After the prefill: seq_len 41, allocated 40, cursor 32,
    protected 40. With I = 4 the eviction fires at the step with seq_len 45 (pre_len 44):
    the cursor is raised to the protected length 40 and nothing is freed; next at
    seq_len 53 (pre_len 52): thr 44, row[40:44]'s SWA freed, cursor 44. The finish
    inserts [0, 52): a tombstone [40, 44) and a live leaf [44, 52); every page is
    then either free or the tree's."""
    walk = Walk(config(interval=4))
    prefill_in_three_chunks(walk)
    r = walk.request("r")
    assert (r.seq_len, r.kv_allocated_len, r.swa_evicted_seqlen, r.cache_protected_len) == (41, 40, 32, 40)

    moves = {}
    while walk.request("r").seq_len <= 53:
        before = walk.request("r")
        full_free, swa_free = walk.free_pages()
        assert walk("decode", "r", 9) is None
        after = walk.request("r")
        new_pages = 1 if before.seq_len % P == 1 else 0  # position seq_len - 1 starts a page
        assert walk.free_pages()[0] == full_free - new_pages
        swa_freed = walk.free_pages()[1] - (swa_free - new_pages)
        if after.swa_evicted_seqlen != before.swa_evicted_seqlen:
            moves[before.seq_len] = (before.swa_evicted_seqlen, after.swa_evicted_seqlen, swa_freed)
        else:
            assert swa_freed == 0
        assert (after.seq_len, after.kv_committed_len, after.decode_steps) == \
               (before.seq_len + 1, before.seq_len, before.decode_steps + 1)
    assert moves == {45: (32, 40, 0), 53: (40, 44, 1)}
    r = walk.request("r")
    assert all(walk.swa_peer(slot) == 0 for slot in r.row[40:44])
    assert all(walk.swa_peer(slot) > 0 for slot in r.row[44:])

    full_free, swa_free = walk.free_pages()
    assert walk("finish", "r") is None  # committed 53: inserts [0, 52), frees [52, 53) full + SWA
    assert walk.free_pages() == (full_free + 1, swa_free + 1)
    nodes = sorted((node.start, node.end, node.swa_value is not None, node.full_lock_ref, node.swa_lock_ref)
                   for node in walk.snapshot.nodes if node.parent is not None)
    assert nodes[-2:] == [(40, 44, False, 0, 0), (44, 52, True, 0, 0)]
    assert [n[:3] for n in nodes[:-2]] == [(0, 4, False), (4, 8, True), (8, 16, True), (16, 20, False),
                                            (20, 24, True), (24, 32, True), (32, 40, True)]
    assert_every_page_accounted_for(walk.snapshot)
    walk("evict", None, 128, 64)
    assert walk.free_pages() == (32, 16) and len(walk.snapshot.nodes) == 1


# -- §5 PD-decode pre-allocation ---------------------------------------------------------------

def test_5_pd_admit_without_a_prefix_cache():
    """[LIFE-6, WIN-6] fill 30, W 8, P 4, no prefix cache: ws = floorP(30 - 8) = 20, tail
    10; 8 full pages and 3 SWA pages; positions 0..19 map to 0, 20..29 to SWA slots at
    their in-page offsets; cursor 20, protected 0; private SWA ceilP(30) - 20 = 12 slots."""
    assert swa_tail_len(30, W, P, prefix_sharing=False) == 10
    walk = Walk(config(NO_PREFIX_SHARING))
    prompt = PROMPT[:30]
    assert walk("pd_admit", "r", prompt, 7) is None
    r = walk.request("r")
    assert (r.swa_evicted_seqlen, r.cache_protected_len, r.kv_allocated_len, r.kv_committed_len) == (20, 0, 30, 30)
    assert (r.seq_len, r.finished_prefill, r.decode_steps, r.last_node) == (31, True, 0, None)
    assert walk.free_pages() == (32 - 8, 16 - 3)
    peers = [walk.swa_peer(slot) for slot in r.row]
    assert peers[:20] == [0] * 20
    assert all(peer > 0 and peer % P == position % P for position, peer in zip(range(20, 30), peers[20:]))
    assert len({peer // P for peer in peers[20:]}) == 3
    assert ceil_page(r.kv_allocated_len, P) - r.swa_live_from == 12
    # decode, then release: the head [0, 20) is freed full-only (a strict full + SWA free would refuse it)
    assert walk("decode", "r", 9) is None
    walk("finish", "r")
    assert walk.free_pages() == (32, 16)


def cache_prefix(walk: Walk, length: int) -> None:
    """An earlier request with the prompt's first `length` tokens, prefilled and finished."""
    walk("admit", "a", PROMPT[:length])
    walk("prefill_chunk", "a", length)
    walk("finish", "a")


def test_5_pd_admit_with_a_cached_prefix_of_12():
    """[LIFE-6, WIN-6] With a decode-side prefix cache: ws = floorP(30 - 1 - 8) = 20, tail
    10, the match limited to fill - tail = 20 finds the cached 12; 8 - 3 = 5 new full
    pages, 3 SWA pages; the head [12, 20) maps to 0. Released without caching (abort),
    the dead range [12, 20) is freed full-only: both pools return to where they were."""
    assert swa_tail_len(30, W, P, prefix_sharing=True) == 30 - floor_page(30 - 1 - W, P) == 10
    walk = Walk(config())
    cache_prefix(walk, 12)
    before = walk.free_pages()
    assert walk("pd_admit", "r", PROMPT[:30], 7) is None
    r = walk.request("r")
    assert (r.cache_protected_len, r.swa_evicted_seqlen, r.kv_allocated_len) == (12, 20, 30)
    assert walk.nodes()[r.last_node].end == 12
    assert walk.free_pages() == (before[0] - 5, before[1] - 3)
    peers = [walk.swa_peer(slot) for slot in r.row]
    assert all(peer > 0 for peer in peers[:12])  # the tree's live prefix
    assert peers[12:20] == [0] * 8
    assert all(peer > 0 and peer % P == position % P for position, peer in zip(range(20, 30), peers[20:]))
    walk("abort", "r")
    assert walk.free_pages() == before


def test_5_pd_admit_with_a_cached_prefix_of_12_finished():
    """[LIFE-5, LIFE-6] The same request finished: the checkpoint caches [12, 20) as a
    tombstone (its SWA was never allocated) and the live rest; every page is the tree's or free."""
    walk = Walk(config())
    cache_prefix(walk, 12)
    walk("pd_admit", "r", PROMPT[:30], 7)
    walk("decode", "r", 9)  # committed 31: the finish inserts [0, 28)
    walk("finish", "r")
    nodes = sorted((node.start, node.end, node.swa_value is not None)
                   for node in walk.snapshot.nodes if node.parent is not None)
    assert (12, 20, False) in nodes
    assert [n for n in nodes if n[0] >= 20] == [(20, 28, True)]
    assert_every_page_accounted_for(walk.snapshot)


def test_5_pd_match_is_cut_at_fill_minus_tail():
    """[LIFE-6] A cached prefix of 24 tokens (its first 12 a tombstone) is matched only to
    fill - tail = 20, so the whole SWA tail [20, 30) is fresh: 3 new full pages, 3 SWA."""
    walk = Walk(config())
    cache_prefix(walk, 24)
    before = walk.free_pages()
    walk("pd_admit", "r", PROMPT[:30], 7)
    r = walk.request("r")
    assert (r.cache_protected_len, r.swa_evicted_seqlen) == (20, 20)
    assert walk.free_pages() == (before[0] - 3, before[1] - 3)
    assert ceil_page(r.kv_allocated_len, P) - r.swa_live_from == 12


# -- §4.1 worked numbers -------------------------------------------------------------------

EARLY = "early return"
WORKED_NUMBERS = [
    # pre_len, W, P: 0.5.23 sharing, 0.5.23 no-sharing, design (W + P), design with the margin dropped
    ((15, 8, 4), (4, 4, 0, 4)),
    ((25, 6, 4), (16, 16, 12, 16)),
    ((30, 6, 4), (20, 24, 20, 24)),
    ((5000, 4096, 256), (768, 768, 512, 768)),
    ((100, 4096, 256), (EARLY, EARLY, EARLY, EARLY)),
]
VERSIONS = (SGLANG_0_5_23, NO_PREFIX_SHARING, DESIGN_MARGIN, DROP_MARGIN)


@pytest.mark.parametrize("arguments, cursors", WORKED_NUMBERS)
def test_4_1_worked_numbers(arguments, cursors):
    """[WIN-2, WIN-3] The table of docs/engines/sglang.md §4.1 (cursor 0, protected 0). The design-era code had
    no early return, but its threshold is negative there: nothing moves either way."""
    pre_len, window, page_size = arguments
    for version, expected in zip(VERSIONS, cursors):
        decision = eviction_frontier(pre_len, 0, 0, window, page_size, version, eviction_interval=1)
        if expected == EARLY:
            assert decision is None, version
        else:
            assert decision is not None and decision.raised_cursor == 0, version
            assert decision.new_cursor == expected, version


def test_4_1_span_right_after_an_eviction():
    """[WIN-5] 0.5.23 with sharing, unclamped: a chunk's eviction (L = pre_len + 1) leaves
    exactly ceilP(W) + P slots; a decode's (L = pre_len) ceilP(W) or ceilP(W) + P."""
    for page_size in (1, 2, 3, 4, 8):
        for window in range(1, 20):
            cw = ceil_page(window, page_size)
            for pre_len in range(0, 80):
                decision = eviction_frontier(pre_len, 0, 0, window, page_size, SGLANG_0_5_23, 1)
                if decision is None or decision.clamped:
                    continue
                assert ceil_page(pre_len + 1, page_size) - decision.new_cursor == cw + page_size
                assert ceil_page(pre_len, page_size) - decision.new_cursor in (cw, cw + page_size)
