"""[BLOCK-1 .. BLOCK-10] The reference's shared block pool (kvspec.reference.block_pool and
block_pool_engine): the worked example of docs/engines/vllm.md §7 step for step, the
spec's decisions it calls (prefix hits, retention, release order) on worked numbers, the
predicates of BLOCK-9 and BLOCK-10 on its own steps and on seeded bugs, and the
reference adapter serving both memory models."""

from dataclasses import replace

import pytest
import torch
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.harness.checks import StepFailure
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.engine_machine import engine_machine
from kvspec.conformance.harness.profiles import profile
from kvspec.conformance.harness.protocol import AdapterError, load_adapter, validate
from kvspec.conformance.runs.plan import plan
from kvspec.reference.block_pool_engine import BlockPoolEngine
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.block_pool import (
    NULL_BLOCK,
    PREFIX_CACHE_RETENTION,
    SWA,
    BlockPoolSnapshot,
    block_prefix_hit_violations,
    eviction_order_violations,
    prefix_hit_blocks,
    release_order,
    swa_block_bound,
    swa_block_cached,
    swa_hit_run,
    tables_of,
    uncached_full_block_violations,
)
from kvspec.spec.invariants import engine_violations
from kvspec.spec.models import BLOCK_POOL
from kvspec.spec.outcomes import InvalidConfig
from kvspec.spec.snapshot import EngineConfig, Step
from kvspec.spec.window import SGLANG_0_5_23, VLLM_0_33, VLLM_0_33_DENSE, Policy

PROMPT = [t % 5 for t in range(30)]


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
"""The reference's tensors live on any torch device; a GPU is used where there is one."""


def engine(version=VLLM_0_33_DENSE, page_size=4, window=7, size_full=128, size_swa=124,
           device="cpu") -> BlockPoolEngine:
    return BlockPoolEngine(EngineConfig(page_size, window, size_full, size_swa, 4, Policy(version, 4)), device)


class Stepper:
    """An engine whose every step is checked against every invariant, keeping each
    (previous, step, now) for the predicates below."""

    def __init__(self, e: BlockPoolEngine):
        self.engine = e
        self.now = e.check_invariants()
        self.steps: list[tuple[BlockPoolSnapshot, Step, BlockPoolSnapshot]] = []

    def __call__(self, operation: str, *args):
        outcome = getattr(self.engine, operation)(*args)
        step = Step(operation, args[0] if operation != "evict" else None, "out_of_memory" if outcome and
                    operation != "evict" else "ok")
        previous, self.now = self.now, self.engine.check_invariants(self.now, step)
        self.steps.append((previous, step, self.now))
        return outcome

    def swa(self, rid: str) -> list:
        view = self.now.block_pool
        tables = next(r.tables for r in view.requests if r.rid == rid)
        return ["." if b == NULL_BLOCK else b for b in tables[view.groups.index(SWA)]]

    def free(self) -> int:
        return self.now.block_pool.free_count

    def hit(self, rid: str) -> int:
        return next(r.kv_committed_len for r in self.now.requests if r.rid == rid)


# -- the worked example ------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_the_scripted_trace_of_docs_vllm_section_7(device):
    """[BLOCK-4, BLOCK-6, BLOCK-9] docs/engines/vllm.md §7 (block size 4, window 7, 63 real
    blocks, dense retention, chunks of 8), on the reference: the free counts and the
    sliding-window tables vLLM 0.33 shows, step for step (block ids included: the reference
    takes blocks from the free queue in vLLM's order), and B's and C's hits of 28 tokens, C's
    on blocks A had released. The same on every torch device."""
    s = Stepper(engine(device=device))
    s("admit", "A", PROMPT)
    seen = []
    for _ in range(4):
        s("prefill_chunk", "A", 8, 1)
        seen.append((s.free(), s.swa("A")))
    for _ in range(3):
        s("decode", "A", 1)
        seen.append((s.free(), s.swa("A")))
    assert seen == [
        (59, [3, 4]),
        (55, [3, 4, 7, 8]),
        (53, [".", ".", 7, 8, 11, 12]),
        (51, [".", ".", ".", ".", 11, 12, 15, 16]),
        (52, [".", ".", ".", ".", ".", 12, 15, 16]),
        (53, [".", ".", ".", ".", ".", ".", 15, 16]),
        (51, [".", ".", ".", ".", ".", ".", 15, 16, 18]),
    ]
    assert len([b for b in seen[4][1] if b != "."]) == swa_block_bound(7, 1, 4) == 3  # the tight decode bound
    s("admit", "B", [*PROMPT[:28], 9, 9, 9])
    assert s.hit("B") == 28 and s.swa("B") == [".", ".", ".", ".", ".", 12, 15]  # 12: A released it, still cached
    s("finish", "A", 0)
    s("admit", "C", [*PROMPT[:28], 8, 8])
    assert s.hit("C") == 28 and s.swa("C") == [".", ".", ".", ".", ".", 12, 15]


# -- the spec's decisions, worked numbers ----------------------------------------------------------

def test_prefix_hit_blocks_worked_numbers():
    """[BLOCK-9] The full group's leading run, cut back to the last end with `run` cached
    sliding-window blocks before it, or the sliding-window group's own leading run."""
    T, F = True, False
    assert swa_hit_run(7, 4) == 2 and swa_hit_run(8, 4) == 2 and swa_hit_run(9, 4) == 3 and swa_hit_run(3, 1) == 3
    assert prefix_hit_blocks([T] * 7, [F, F, F, F, F, T, T], 2, 7) == 7  # docs §7: B's hit of 28 tokens
    assert prefix_hit_blocks([T] * 7, [F, F, T, T, F, T, F], 2, 7) == 4  # the last end with 2 cached before it
    assert prefix_hit_blocks([T, T, T, F, T], [T, T, T, T, T], 2, 5) == 3  # full attention stops at its first miss
    assert prefix_hit_blocks([T] * 5, [T, F, F, F, T], 2, 5) == 1  # no run of 2: the leading run
    assert prefix_hit_blocks([T] * 5, [T] * 5, 2, 3) == 3  # at most the limit (LIFE-3: len(tokens) - 1)
    assert prefix_hit_blocks([], [], 2, 0) == 0


def test_swa_block_cached_under_each_retention():
    """[BLOCK-9] Dense retention caches every block; retention 0 only the `cdiv(W, P)`
    blocks ending at each boundary floored to a block: a resend of a 30-token prompt stops
    at 29 (blocks 5 and 6 at P = 4, W = 7), a hit cut short at 12 by the window (2 and 1)."""
    assert PREFIX_CACHE_RETENTION == {VLLM_0_33: 0, VLLM_0_33_DENSE: None}
    assert all(swa_block_cached(i, 7, 4, None, (29,)) for i in range(8))
    assert [i for i in range(8) if swa_block_cached(i, 7, 4, 0, (29,))] == [5, 6]
    assert [i for i in range(8) if swa_block_cached(i, 7, 4, 0, (29, 12))] == [1, 2, 5, 6]
    assert [i for i in range(4) if swa_block_cached(i, 3, 1, 0, (3,))] == [0, 1, 2]


def test_release_order_is_each_table_from_its_last_entry_back():
    """[BLOCK-10] Group by group, each table from its last entry back; a window release
    gives back only the entries it nulls, never the null block."""
    assert release_order(((1, 2, 5), (0, 6, 7)), ()) == [5, 2, 1, 7, 6]
    assert release_order(((1, 2, 5), (0, 6, 7)), ((1, 2, 5), (0, 0, 7))) == [6]
    assert release_order(((1, 2, 5), (3, 4, 7, 8)), ((1, 2, 5), (0, 0, 7, 8))) == [4, 3]


# -- the engine ---------------------------------------------------------------------------------

def test_sparse_retention_caches_the_window_tail_at_the_prompt_end_only():
    """[BLOCK-9] Under vllm-0.33 a prompt's sliding-window blocks are cached only where a
    resend would hit (the two blocks before 29, floored to 28): a resend hits 28 tokens, a
    shorter prompt on the same prefix finds no sliding-window run and hits nothing, while
    under vllm-0.33-dense it hits 16."""
    for version, expected in ((VLLM_0_33, 0), (VLLM_0_33_DENSE, 16)):
        s = Stepper(engine(version))
        s("admit", "A", PROMPT)
        for _ in range(4):
            s("prefill_chunk", "A", 8, 1)
        s("finish", "A", 0)
        s("admit", "B", PROMPT)
        s("admit", "C", [*PROMPT[:18], 9])
        assert (s.hit("B"), s.hit("C")) == (28, expected), version


def test_a_failed_allocation_releases_the_window_first_and_conforms():
    """[I15, BLOCK-6] As vLLM: the window release runs before the capacity check, so a chunk
    that fails has freed its out-of-window blocks; every check passes on the step."""
    s = Stepper(engine(size_full=28, size_swa=16))  # 11 real blocks
    s("admit", "A", list(range(24)))
    s("prefill_chunk", "A", 8, 0)
    s("prefill_chunk", "A", 8, 0)
    s("admit", "B", [9, 9, 9, 9])
    s("prefill_chunk", "B", 4, 0)
    assert (s.free(), s.swa("A")) == (1, [3, 4, 7, 8])
    assert s("prefill_chunk", "A", 8, 0) is not None  # OutOfMemory
    assert (s.free(), s.swa("A")) == (3, [".", ".", 7, 8])


def test_eviction_drops_the_least_recently_released_keys_of_each_group():
    """[LIFE-7, BLOCK-10] evict drops keys in the free queue's order, per group, as many
    blocks as the tokens asked round up to, and leaves the blocks where they stand."""
    s = Stepper(engine())
    s("admit", "A", PROMPT[:16])
    s("prefill_chunk", "A", 16, 1)
    s("finish", "A", 0)
    queue = s.now.block_pool.free_queue
    assert s("evict", 5, 0) == (8, 0)  # 2 blocks of the full group
    view = s.now.block_pool
    assert view.free_queue == queue
    full_cached = [b for b in queue if s.steps[-1][0].block_pool.blocks[b].block_hash is not None
                   and s.steps[-1][0].block_pool.blocks[b].block_hash[1] == 0]
    assert [view.blocks[b].block_hash for b in full_cached[:2]] == [None, None]
    assert all(view.blocks[b].block_hash is not None for b in full_cached[2:])


def test_retract_and_admit_again_with_every_token():
    """[LIFE-5, BLOCK-9] A retracted request gives every block back and is admitted again
    with its outputs: it hits its own cached prefix, and prefills the rest again."""
    s = Stepper(engine())
    s("admit", "A", PROMPT[:12])
    s("prefill_chunk", "A", 12, 1)
    s("decode", "A", 2)
    s("decode", "A", 3)
    s("retract", "A")
    assert s.now.requests == () and s.free() == 63
    s("admit", "A", None)
    assert s.hit("A") == 12 and next(r.seq_len for r in s.now.requests) == 15
    s("prefill_chunk", "A", 8, 4)
    assert next(r.finished_prefill for r in s.now.requests)


def test_pd_admit_allocates_the_prompt_with_the_window_tail_only():
    """[LIFE-6, BLOCK-5, BLOCK-6] A PD-decode admission takes the prompt's KV computed: full
    blocks for all of it, sliding-window blocks from the window on, cached at once."""
    s = Stepper(engine())
    s("pd_admit", "A", PROMPT, 7)
    row = s.now.requests[0]
    assert (row.kv_committed_len, row.kv_allocated_len, row.seq_len, row.finished_prefill) == (30, 30, 31, True)
    assert s.swa("A")[:5] == ["."] * 5 and "." not in s.swa("A")[5:]
    s("decode", "A", 1)
    s("admit", "B", PROMPT)
    assert s.hit("B") == 28


def test_invalid_configurations_are_clear_errors():
    with pytest.raises(InvalidConfig, match="is a version of the two-pool model"):
        engine(SGLANG_0_5_23)
    with pytest.raises(InvalidConfig, match="no recurrent-state group"):
        BlockPoolEngine(EngineConfig(4, 7, 64, 64, 4, Policy(VLLM_0_33), state_slots=8, state_grid=4))
    with pytest.raises(InvalidConfig, match="multiple of the page size"):
        engine(size_full=30)
    with pytest.raises(InvalidConfig, match="shared block pool, checked by chapter 08"):
        TwoPoolEngine(EngineConfig(4, 7, 64, 64, 4, Policy(VLLM_0_33)))


# -- BLOCK-9 and BLOCK-10 on the reference's steps and on seeded bugs --------------------------

def recorded() -> Stepper:
    """A few requests sharing a prefix, evictions and releases, every step checked."""
    s = Stepper(engine(size_full=128, size_swa=64))
    s("admit", "A", PROMPT)
    for _ in range(4):
        s("prefill_chunk", "A", 8, 1)
    s("decode", "A", 1)
    s("admit", "B", [*PROMPT[:20], 4, 4])
    s("prefill_chunk", "B", 8, 1)
    s("finish", "A", 0)
    s("evict", 4, 4)
    s("admit", "C", [3] * 30)
    s("prefill_chunk", "C", 30, 1)
    return s


def step_of(s: Stepper, operation: str, rid: str | None = None):
    return next((p, st, n) for p, st, n in s.steps if st.operation == operation and (rid is None or st.rid == rid))


def with_queue(snapshot: BlockPoolSnapshot, queue) -> BlockPoolSnapshot:
    return replace(snapshot, block_pool=replace(snapshot.block_pool, free_queue=tuple(queue)))


def with_key(snapshot: BlockPoolSnapshot, block: int, key) -> BlockPoolSnapshot:
    blocks = list(snapshot.block_pool.blocks)
    blocks[block] = replace(blocks[block], block_hash=key)
    return replace(snapshot, block_pool=replace(snapshot.block_pool, blocks=tuple(blocks)))


def test_the_reference_steps_hold_block_9_and_block_10():
    """[BLOCK-9, BLOCK-10] Every step of the recorded run: nothing reported."""
    for previous, step, now in recorded().steps:
        assert engine_violations(previous, step, now) == [], step


def test_a_whole_full_block_left_uncached():
    """[BLOCK-9] A full-attention block a later request could hit, not cached."""
    _, _, now = step_of(recorded(), "prefill_chunk", "A")
    block = now.block_pool.requests[0].tables[0][0]
    messages = [v.message for v in uncached_full_block_violations(with_key(now, block, None))]
    assert len(messages) == 1 and f"whole blocks [{block}]" in messages[0]


def test_a_hit_as_long_as_the_request_or_on_an_uncached_block():
    """[BLOCK-9] The hit must leave the last token to compute, and adopt cached blocks only."""
    previous, step, now = step_of(recorded(), "admit", "B")
    assert block_prefix_hit_violations(previous, step, now) == []
    whole = replace(now, requests=tuple(replace(r, seq_len=r.kv_committed_len) if r.rid == "B" else r
                                        for r in now.requests))
    assert [v.clause for v in block_prefix_hit_violations(previous, step, whole)] == ["BLOCK-9"]
    adopted = next(r for r in now.block_pool.requests if r.rid == "B").tables[0][0]
    assert "not cached" in block_prefix_hit_violations(previous, step, with_key(now, adopted, None))[0].message


def test_free_blocks_reordered():
    """[BLOCK-10] Blocks free before and after a step keep their order."""
    previous, step, now = step_of(recorded(), "evict")
    queue = list(now.block_pool.free_queue)
    queue[-1], queue[-2] = queue[-2], queue[-1]
    assert "changed their order" in eviction_order_violations(previous, step, with_queue(now, queue))[0].message


def test_released_blocks_queued_at_the_wrong_end_or_out_of_release_order():
    """[BLOCK-10] A release queues its blocks without a key at the head, those with one at
    the tail, in release order."""
    previous, step, now = step_of(recorded(), "finish", "A")
    assert eviction_order_violations(previous, step, now) == []
    old = [b for b in now.block_pool.free_queue if b in previous.block_pool.free_queue]
    new = [b for b in now.block_pool.free_queue if b not in previous.block_pool.free_queue]
    cached = [b for b in new if now.block_pool.blocks[b].block_hash is not None]
    uncached = [b for b in new if now.block_pool.blocks[b].block_hash is None]
    assert len(cached) >= 2 and uncached
    assert "goes to the tail" in eviction_order_violations(
        previous, step, with_queue(now, [*uncached, *cached[:1], *old, *cached[1:]]))[0].message
    assert "goes to the head" in eviction_order_violations(
        previous, step, with_queue(now, [*old[:1], *uncached, *old[1:], *cached]))[0].message
    assert "not in release order" in eviction_order_violations(
        previous, step, with_queue(now, [*uncached, *old, *cached[::-1]]))[0].message


def test_without_uncached_first_a_release_queues_every_block_at_the_tail_in_release_order():
    """[BLOCK-10] Under a policy without `uncached_first` (vLLM before 0.23) a release must
    queue the blocks it frees without a key at the tail too, in release order: the head
    placement the default policy asks for is reported, and so is a freed block out of
    release order, keyed or not; every freed block at the tail in release order is not."""
    def unkept(snapshot):
        return replace(snapshot, config=replace(snapshot.config, policy=replace(snapshot.config.policy,
                                                                                uncached_first=())))
    previous, step, now = step_of(recorded(), "finish", "A")
    previous, now = unkept(previous), unkept(now)
    old = [b for b in now.block_pool.free_queue if b in previous.block_pool.free_queue]
    new = [b for b in now.block_pool.free_queue if b not in previous.block_pool.free_queue]
    uncached = [b for b in new if now.block_pool.blocks[b].block_hash is None]
    assert uncached and "goes to the tail" in eviction_order_violations(previous, step, now)[0].message
    assert eviction_order_violations(previous, step, with_queue(now, [*old, *new])) != []  # not in release order
    in_order = [b for b in release_order_of(previous, now) if b in set(new)]
    assert eviction_order_violations(previous, step, with_queue(now, [*old, *in_order])) == []


@pytest.mark.parametrize("groups", [(), ("swa",)])
def test_the_reference_without_uncached_first_conforms(groups):
    """[BLOCK-10] The reference built under a policy whose `uncached_first` leaves out the full
    group (vLLM 0.23.0) or both (before) passes every check on its own steps, and queues a
    full-attention block freed without a key at the tail."""
    config = EngineConfig(4, 7, 128, 64, 4, Policy(VLLM_0_33_DENSE, 4, uncached_first=groups))
    s = Stepper(BlockPoolEngine(config, "cpu"))
    s("admit", "A", PROMPT)
    for _ in range(4):
        s("prefill_chunk", "A", 8, 1)
    s("decode", "A", 1)
    s("admit", "B", [*PROMPT[:20], 4, 4])
    s("prefill_chunk", "B", 8, 1)
    s("finish", "A", 0)
    previous, step, now = s.steps[-1]
    new = [b for b in now.block_pool.free_queue if b not in previous.block_pool.free_queue]
    full = set(next(r for r in previous.block_pool.requests if r.rid == "A").tables[0])
    queue = now.block_pool.free_queue
    was_free = [queue.index(b) for b in previous.block_pool.free_queue if b in queue]
    assert any(now.block_pool.blocks[b].block_hash is None and b in full for b in new)
    assert all(queue.index(b) > max(was_free) for b in new if b in full)  # behind every block free before


def release_order_of(previous, now) -> list[int]:
    current = tables_of(now.block_pool)
    return [block for rid, tables in sorted(tables_of(previous.block_pool).items())
            for block in release_order(tables, current.get(rid, ()))]


def test_an_allocation_that_skips_the_head():
    """[BLOCK-10] New KV takes the queue's head: a block taken from behind a block that
    stays free is reported."""
    previous, step, now = step_of(recorded(), "prefill_chunk", "C")
    assert eviction_order_violations(previous, step, now) == []
    before, after = previous.block_pool.free_queue, now.block_pool.free_queue
    taken = [b for b in before if b not in after]
    kept = [b for b in before if b in after]
    # as if the allocation had taken the first kept block instead of its last taken one
    swapped = with_queue(now, [taken[-1] if b == kept[0] else b for b in after])
    blocks = list(swapped.block_pool.blocks)
    blocks[taken[-1]], blocks[kept[0]] = replace(blocks[kept[0]], block_id=taken[-1]), \
        replace(blocks[taken[-1]], block_id=kept[0])
    swapped = replace(swapped, block_pool=replace(swapped.block_pool, blocks=tuple(blocks)))
    assert any("takes the queue's head" in v.message for v in eviction_order_violations(previous, step, swapped))


def test_an_eviction_that_keeps_an_older_key():
    """[BLOCK-10] An eviction drops a group's least recently released keys first."""
    previous, step, now = step_of(recorded(), "evict")
    view, before = now.block_pool, previous.block_pool
    dropped = [b for b in before.free_queue if before.blocks[b].block_hash and not view.blocks[b].block_hash]
    group = before.blocks[dropped[0]].block_hash[1]
    kept = [b for b in before.free_queue if view.blocks[b].block_hash and view.blocks[b].block_hash[1] == group]
    seeded = with_key(with_key(now, dropped[0], before.blocks[dropped[0]].block_hash), kept[-1], None)
    assert any("an eviction dropped" in v.message for v in eviction_order_violations(previous, step, seeded))


# -- the adapter serves both models --------------------------------------------------------------

def test_the_reference_adapter_serves_both_memory_models():
    """[OBS-1, WIN-1] The reference implements every policy version; its engines of a
    block-pool version are the shared block pool's, with that model's snapshot and
    capabilities, and a check makes that model's runs too, labelled with its name."""
    reference = load_adapter("reference")
    assert reference.model_versions() == (SGLANG_0_5_23, VLLM_0_33)
    shared = reference.for_version(VLLM_0_33_DENSE)
    assert shared.model is BLOCK_POOL and "recurrent_state" not in shared.capabilities
    assert "pd_decode" in shared.capabilities and reference.for_version("no-such-version") is None
    labels = plan(reference).labels
    assert "engine P=4 W=6 I=4" in labels and "block-pool P=4 W=6 I=4" in labels
    assert not any(label.startswith("block-pool+state") for label in labels)
    config = EngineConfig(4, 6, 64, 32, 4, Policy(VLLM_0_33))
    driver = EngineDriver(reference.make_engine(config), shared.model, shared.observables)
    assert isinstance(driver.previous, BlockPoolSnapshot)


def test_a_differential_against_the_reference_makes_the_runs_both_can():
    """The state runs of vLLM have no block-pool reference to compare with: left out, and
    said so; an adapter and one that shares none of its versions have no run in common."""
    vllm_like = validate(type("SHARED", (), {
        "name": "shared", "policy_version": VLLM_0_33, "memory_model": "block-pool",
        "capabilities": ("page_size_1", "page_size_gt_1", "chunked_prefill", "recurrent_state"),
        "make_engine": lambda config: BlockPoolEngine(config)}), "x")
    compared = plan(vllm_like, load_adapter("reference"))
    assert compared.labels and not any(planned.run.recurrent for planned in compared.runs)
    assert "engine+state P=1 W=3 I=4 G=1" in [skipped.what for skipped in compared.skipped]
    with pytest.raises(AdapterError, match="no run in common"):
        plan(load_adapter("mutant-leak-on-release"), load_adapter("mutant-release-head-first"))


@pytest.mark.parametrize("declared, says", [({"version_capabilities": {"design-margin": ()}}, "only its other"),
                                            ({"policy_versions": ("sglang-0.5.23", "vllm-0.33"),
                                              "version_capabilities": {"vllm-0.33": ("warp_drive",)}},
                                             "unknown capabilities \\['warp_drive'\\]")])
def test_bad_version_capabilities_are_a_clear_adapter_error(declared, says):
    adapter = type("A", (), {"name": "a", "policy_version": "sglang-0.5.23", "capabilities": ("page_size_1",),
                             "make_engine": TwoPoolEngine, **declared})
    with pytest.raises(AdapterError, match=says):
        validate(adapter, "x")


# -- the differential compares what the spec fixes, never block ids -------------------------------

class DenseAsSparse(BlockPoolEngine):
    """Declares vllm-0.33 but caches every sliding-window block: every invariant holds, the
    hit lengths differ from the spec's (BLOCK-9), which only a comparison sees (OBS-3)."""

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.retention = None


class ReversedIds(BlockPoolEngine):
    """Hands out the never-used blocks highest id first: other block ids, the same
    observables (block ids are not fixed)."""

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.pool.rank = self.pool.num_blocks - 1 - self.pool.rank  # ranks still between head and tail


def differential(make_engine, examples: int):
    reference = load_adapter("reference").for_version(VLLM_0_33)
    machine = engine_machine(make_engine, 4, 6, Policy(VLLM_0_33, 4), reference.capabilities, reference.observables,
                             shadow=reference, model=BLOCK_POOL)
    run_state_machine_as_test(seed(0)(machine), settings=settings(profile("ci"), max_examples=examples, database=None,
                                                                  phases=[Phase.generate]))


def test_the_differential_sees_a_hit_length_the_spec_fixes():
    """[OBS-3, BLOCK-9] Caching more than the policy version keeps is a difference."""
    with pytest.raises(StepFailure) as failure:
        differential(DenseAsSparse, 300)
    assert "OBS-3" in failure.value.clauses and "differ" in str(failure.value)


def test_the_differential_never_compares_block_ids():
    """[OBS-3] Other block ids, the same observables: the comparison passes."""
    differential(ReversedIds, 40)

