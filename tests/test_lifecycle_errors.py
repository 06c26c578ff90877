"""[MODEL-3, MODEL-4, LIFE-1, LIFE-7, I15] How the reference engine refuses what the
lifecycle does not allow, and what it returns when memory runs out:

  * misuse raises `InvalidRequest`, says what was wrong, and leaves the engine exactly
    as it was (snapshot equality);
  * a configuration the spec does not allow raises `InvalidConfig` (also a ValueError)
    naming every problem;
  * an allocation the pools cannot serve, even after evicting what the prefix cache can
    give, *returns* `OutOfMemory` and leaves the request as it was (the cache may have
    been evicted on the way).
"""

import pytest

from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest, KvSpecError, Outcome, OutOfMemory
from kvspec.spec.snapshot import EngineConfig, Step
from kvspec.spec.window import NO_PREFIX_SHARING, SGLANG_0_5_23, Policy

P, W = 4, 8


def engine_with_every_kind_of_request(version: str = SGLANG_0_5_23) -> TwoPoolEngine:
    """p: in prefill; d: decoding; f: finished (cached); x: aborted; t: retracted."""
    engine = TwoPoolEngine(EngineConfig(page_size=P, window=W, size_full=256, size_swa=128, max_requests=8,
                                 policy=Policy(version, 4)))
    for rid, prompt in (("p", list(range(30))), ("d", list(range(20)) + [50] * 6), ("f", [7] * 9),
                        ("x", [8] * 5), ("t", [9] * 13)):
        assert engine.admit(rid, prompt) is None
    assert engine.prefill_chunk("p", 8) is None
    for rid in ("d", "f", "t"):
        assert engine.prefill_chunk(rid, 64) is None
    for _ in range(12):
        assert engine.decode("d") is None
    engine.finish("f")
    engine.abort("x")
    engine.retract("t")
    engine.check_invariants()
    return engine


REFUSALS = {
    # name: (operation, arguments, words the message must contain)
    "decode an unknown request": ("decode", ("nobody",), "unknown request"),
    "prefill an unknown request": ("prefill_chunk", ("nobody", 4), "unknown request"),
    "finish an unknown request": ("finish", ("nobody",), "unknown request"),
    "abort an unknown request": ("abort", ("nobody",), "unknown request"),
    "retract an unknown request": ("retract", ("nobody",), "unknown request"),
    "admit a running id (prefill)": ("admit", ("p", [1, 2, 3]), "already running"),
    "admit a running id (decode)": ("admit", ("d", [1, 2, 3]), "already running"),
    "pd_admit a running id": ("pd_admit", ("d", [1, 2, 3], 0), "already running"),
    "admit an empty prompt": ("admit", ("new", []), "no tokens"),
    "admit a prompt longer than the pool": ("admit", ("new", [1] * 256), "cannot fit"),
    "pd_admit a prompt longer than the pool": ("pd_admit", ("new", [1] * 256, 0), "cannot fit"),
    "re-admit a request never retracted": ("admit", ("nobody", None), "not retracted"),
    "re-admit a finished request without its prompt": ("admit", ("f", None), "not retracted"),
    "decode during prefill": ("decode", ("p",), "still in prefill"),
    "prefill after prefill": ("prefill_chunk", ("d", 4), "finished its prefill"),
    "prefill an empty chunk": ("prefill_chunk", ("p", 0), "chunk_len"),
    "finish during prefill": ("finish", ("p",), "during prefill"),
    "finish twice": ("finish", ("f",), "unknown request"),
    "abort twice": ("abort", ("x",), "unknown request"),
    "decode a retracted request": ("decode", ("t",), "unknown request"),
    "negative evict (full)": ("evict", (-1, 0), "non-negative"),
    "negative evict (SWA)": ("evict", (0, -4), "non-negative"),
    "negative trim": ("finish", ("d", -1), "trim"),
    "trim past the request's own tokens": ("finish", ("d", 10_000), "trim"),
}


@pytest.mark.parametrize("version", [SGLANG_0_5_23, NO_PREFIX_SHARING])
@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_misuse_is_refused_and_changes_nothing(name, version):
    operation, arguments, words = REFUSALS[name]
    engine = engine_with_every_kind_of_request(version)
    before = engine.snapshot()
    with pytest.raises(InvalidRequest, match=words):
        getattr(engine, operation)(*arguments)
    assert engine.snapshot() == before
    engine.check_invariants(before, None)


def test_a_stop_may_trim_all_the_request_owns():
    """[LIFE-5] The bound of the trim check is inclusive: committed - protected tokens may
    go, even below the request's SWA cursor (d decoded 12 steps past its prefill: its
    cursor is above what it keeps). The trimmed pages whose SWA is already released are
    freed full-only. (Regression: the over-allocated range [ceilP(owned), L) used to be
    freed whole with the strict free_segment: InvalidFree, the request half released.)"""
    engine = engine_with_every_kind_of_request()
    d = next(r for r in engine.snapshot().requests if r.rid == "d")
    previous = engine.snapshot()
    engine.finish("d", d.kv_committed_len - d.cache_protected_len)
    engine.check_invariants(previous, Step("finish", "d"))


def test_pd_admit_of_an_empty_prompt_is_refused():
    """[LIFE-1, LIFE-6] A PD-decode request's KV comes from a prefill server: it has at
    least one prompt token. (Regression: take_row sees prompt + [first_output], never
    empty, so the empty prompt used to be accepted with no KV at all, and the first
    decode then crashed reading row[-1] with an IndexError instead of a typed error.)"""
    for version in (SGLANG_0_5_23, NO_PREFIX_SHARING):
        engine = engine_with_every_kind_of_request(version)
        before = engine.snapshot()
        with pytest.raises(InvalidRequest):
            engine.pd_admit("new", [], 0)
        assert engine.snapshot() == before


def test_decode_past_the_full_pool_is_refused():
    """A request that would outgrow the whole full pool cannot decode: finish it."""
    engine = TwoPoolEngine(EngineConfig(page_size=P, window=W, size_full=16, size_swa=16,
                                        policy=Policy(SGLANG_0_5_23, 4)))
    engine.admit("r", list(range(14)))
    engine.prefill_chunk("r", 14)
    assert engine.decode("r") is None  # seq 15 -> 16
    before = engine.snapshot()
    with pytest.raises(InvalidRequest, match="outgrow"):
        engine.decode("r")
    assert engine.snapshot() == before


def test_errors_are_kvspec_errors():
    """[MODEL-3] Every error the spec raises is a KvSpecError (a configuration error also a ValueError)."""
    assert issubclass(InvalidRequest, KvSpecError) and issubclass(InvalidConfig, KvSpecError)
    assert issubclass(InvalidConfig, ValueError)


# -- configurations ----------------------------------------------------------------------------

def engine_config(**changes) -> EngineConfig:
    fields = dict(page_size=P, window=W, size_full=64, size_swa=32, max_requests=4, policy=Policy(SGLANG_0_5_23, 4))
    fields.update(changes)
    return EngineConfig(**fields)


BAD_CONFIGS = {
    "window 0": (dict(window=0), "sliding window must be >= 1"),
    "negative window": (dict(window=-3), "sliding window must be >= 1"),
    "page_size 0": (dict(page_size=0), "page_size must be >= 1"),
    "negative page_size": (dict(page_size=-4), "page_size must be >= 1"),
    "interval 0": (dict(policy=Policy(SGLANG_0_5_23, 0)), "decode_eviction_interval must be >= 1"),
    "unknown policy version": (dict(policy=Policy("sglang-9.9", 4)), "unknown policy version"),
    "full size not a page multiple": (dict(size_full=30), "size_full must be a multiple of page_size"),
    "SWA size not a page multiple": (dict(size_swa=10), "size_swa must be a multiple of page_size"),
    "full pool below a page": (dict(size_full=2), "size_full must hold at least one page"),
    "SWA pool below a page": (dict(size_swa=0), "size_swa must hold at least one page"),
    "no request rows": (dict(max_requests=0), "max_requests must be >= 1"),
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_invalid_configurations_are_refused(name):
    changes, words = BAD_CONFIGS[name]
    with pytest.raises(InvalidConfig, match=words):
        TwoPoolEngine(engine_config(**changes))


def test_every_problem_of_a_configuration_is_named():
    with pytest.raises(InvalidConfig) as refused:
        TwoPoolEngine(engine_config(window=0, policy=Policy("nope", 0)))
    message = str(refused.value)
    for words in ("sliding window must be >= 1", "unknown policy version", "decode_eviction_interval must be >= 1"):
        assert words in message


# -- out of memory ---------------------------------------------------------------------------

def test_prefill_out_of_memory_with_nothing_to_evict_changes_nothing():
    """[LIFE-7, I15, MODEL-3] 12 tokens need 3 pages; the SWA pool has 2 and the cache is
    empty: OutOfMemory is returned, not raised, and nothing changes."""
    engine = TwoPoolEngine(engine_config(size_full=16, size_swa=8))
    engine.admit("r", list(range(12)))
    before = engine.snapshot()
    outcome = engine.prefill_chunk("r", 12)
    assert outcome == OutOfMemory("swa", 3, 2)
    assert engine.snapshot() == before
    engine.check_invariants(before, Step("prefill_chunk", "r", Outcome.OUT_OF_MEMORY))
    assert engine.prefill_chunk("r", 8) is None  # a smaller chunk fits


def test_prefill_out_of_memory_even_after_eviction_leaves_the_request():
    """[LIFE-7, I15] A cached 8-token prefix (2 pages per pool) is evicted to make room,
    yet 20 tokens need 5 SWA pages of 4: OutOfMemory, the request as it was."""
    engine = TwoPoolEngine(engine_config(size_full=32, size_swa=16))
    engine.admit("a", [5] * 8)
    engine.prefill_chunk("a", 8)
    engine.finish("a")
    engine.admit("b", list(range(20)))
    before = engine.snapshot()
    outcome = engine.prefill_chunk("b", 20)
    assert outcome == OutOfMemory("swa", 5, 4)
    now = engine.check_invariants(before, Step("prefill_chunk", "b", Outcome.OUT_OF_MEMORY))
    assert now.requests == before.requests
    assert len(now.nodes) == 1  # the cache was evicted on the way
    assert len(now.allocator.full.free_pages) == 8 and len(now.allocator.swa.free_pages) == 4


def test_locked_window_is_not_evicted_for_another_request():
    """[LIFE-7, TREE-5, I14] a holds [0, 12) in the tree, its SWA lock covering the last W
    tokens [4, 12). b's 12-token chunk needs 3 pages per pool; the SWA pool has 1 free
    and only a's [0, 4), outside a's window, may be tombstoned for it: OutOfMemory, b as
    it was, a's window untouched."""
    engine = TwoPoolEngine(engine_config(size_full=32, size_swa=16))
    engine.admit("a", list(range(12)))
    engine.prefill_chunk("a", 12)
    engine.admit("b", list(range(50, 70)))
    before = engine.snapshot()
    outcome = engine.prefill_chunk("b", 12)
    assert outcome == OutOfMemory("swa", 3, 2)
    now = engine.check_invariants(before, Step("prefill_chunk", "b", Outcome.OUT_OF_MEMORY))
    assert now.requests == before.requests
    tree = sorted((n.start, n.end, n.swa_value is not None, n.swa_lock_ref) for n in now.nodes if n.parent is not None)
    assert tree == [(0, 4, False, 0), (4, 12, True, 1)]


def test_decode_out_of_memory_leaves_the_request():
    """[ALLOC-4, I15] A decode step that needs a new page when none is free."""
    engine = TwoPoolEngine(engine_config(size_full=16, size_swa=16, policy=Policy(NO_PREFIX_SHARING, 4)))
    engine.admit("a", list(range(8)))
    engine.prefill_chunk("a", 8)
    engine.admit("b", list(range(7)))
    engine.prefill_chunk("b", 7)
    engine.decode("b")  # b fills its second page: 4 pages held, none free
    before = engine.snapshot()
    outcome = engine.decode("b")
    assert outcome == OutOfMemory("full", 1, 0)
    engine.check_invariants(before, Step("decode", "b", Outcome.OUT_OF_MEMORY))
    assert engine.snapshot() == before


def test_pd_admit_out_of_memory_leaves_no_request_and_no_lock():
    """[LIFE-6, I15] A failed pre-allocation undoes the admission: no row, no lock."""
    engine = TwoPoolEngine(engine_config(size_full=32, size_swa=12))
    engine.admit("a", list(range(9)))
    engine.prefill_chunk("a", 9)
    engine.finish("a")  # cached [0, 8): 2 pages per pool, 1 SWA page free
    before = engine.snapshot()
    # tail 28 - floorP(28 - 1 - 8) = 12: 3 SWA pages; the match locks [0, 8), so nothing can be evicted
    outcome = engine.pd_admit("r", list(range(28)), 0)
    assert outcome == OutOfMemory("swa", 3, 1)
    assert isinstance(outcome, OutOfMemory)
    now = engine.check_invariants(before, Step("pd_admit", "r", Outcome.OUT_OF_MEMORY))
    assert now.requests == ()
    assert all(node.full_lock_ref == 0 and node.swa_lock_ref == 0 for node in now.nodes if node.parent is not None)


def test_admission_without_a_free_row_is_out_of_memory():
    """[LIFE-3] Admission takes a row, or returns OutOfMemory for the request pool and changes nothing."""
    engine = TwoPoolEngine(engine_config(max_requests=1))
    assert engine.admit("a", [1, 2, 3]) is None
    before = engine.snapshot()
    assert engine.admit("b", [1, 2, 3]) == OutOfMemory("requests", 1, 0)
    assert engine.pd_admit("c", [1, 2, 3], 0) == OutOfMemory("requests", 1, 0)
    assert engine.snapshot() == before
    engine.abort("a")
    assert engine.admit("b", [1, 2, 3]) is None  # the row came back
