"""Pictures of a run (conformance/review/occupancy.py and occupancy_plot.py): the occupancy
of known snapshots, the timeline of docs/checking.md's example on the reference and on
mutant-no-chunk-release, `--plot` on `kvspec check` and `kvspec replay`, and the picture
of one shared block pool (spec chapter 08): a hand-made view, and, with vLLM installed,
real vLLM runs."""

import importlib.util
import os
import subprocess
import sys
from dataclasses import replace
from functools import partial
from itertools import pairwise
from pathlib import Path

import pytest
from test_engine_invariants import PREFILL, engine, with_request

from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.commands import pictures
from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.protocol import load_adapter, validate
from kvspec.conformance.harness.replay import build_driver, replay
from kvspec.conformance.harness.trace import Trace, TraceStep, engine_config_json, load
from kvspec.conformance.review.occupancy import (
    BLOCKS_UNACCOUNTED,
    CACHED_FREE,
    CALLER,
    CHECKPOINT_LOCKED,
    EVICTABLE,
    FREE,
    FULL_TABLES,
    NOT_ATTRIBUTED,
    PRIVATE,
    PROTECTED,
    STATE_UNACCOUNTED,
    SWA_TABLES,
    UNACCOUNTED,
    WORKING,
    Point,
    Timeline,
    allocator_occupancy,
    block_pool_occupancy,
    engine_occupancy,
    timeline,
    window_bound,
    window_span,
)
from kvspec.conformance.review.occupancy_plot import SWA_BLOCKS, draw, panels, plot_pool, pyplot
from kvspec.spec.block_pool import (
    FULL,
    NULL_BLOCK,
    SWA,
    Block,
    BlockPoolSnapshot,
    BlockPoolView,
    RequestBlocks,
    pool_accounting_violations,
    reference_count_violations,
    swa_block_bound,
)
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import NO_PREFIX_SHARING, VLLM_0_33, Policy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "vectors" / "examples" / "long-chunked-prefill.jsonl"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NO_TREE = frozenset({"free_sets", "mapping", "rows"})


def kvspec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], check=False, capture_output=True, text=True, cwd=cwd)


def is_png(path: Path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_SIGNATURE


# -- the occupancy of a snapshot (test_engine_invariants' hand-made one, P = 4, W = 8) -------------
# Full pool 16 pages, SWA pool 8. Request r1 holds [16, 22) privately (2 pages, live SWA);
# it locks node A [0, 4) (an SWA tombstone) and node B [4, 16) (live SWA, SWA-locked);
# node C [0, 4) is another prompt's unlocked leaf with live SWA.

def test_each_pool_splits_into_private_protected_evictable_and_free_pages():
    occupancy = engine_occupancy(engine())
    assert occupancy.full == {PRIVATE: 2, PROTECTED: 4, EVICTABLE: 1, UNACCOUNTED: 0, FREE: 9}
    assert occupancy.swa == {PRIVATE: 2, PROTECTED: 3, EVICTABLE: 1, UNACCOUNTED: 0, FREE: 2}
    assert sum(occupancy.full.values()) == 16 and sum(occupancy.swa.values()) == 8


def test_a_tombstone_holds_no_swa_and_a_live_node_is_evictable_by_its_own_lock():
    """A is full-locked (its full page is protected) but not SWA-locked: once live, its
    SWA page is evictable."""
    tombstone, live = engine_occupancy(engine()), engine_occupancy(engine(a_live=True))
    assert live.full == tombstone.full
    assert (tombstone.swa[EVICTABLE], live.swa[EVICTABLE]) == (1, 2)
    assert live.swa[FREE] == tombstone.swa[FREE] - 1


def test_pages_nobody_holds_are_unaccounted_never_hidden():
    snapshot = engine()
    full = snapshot.allocator.full
    leaked = replace(snapshot, allocator=replace(snapshot.allocator, full=replace(full, free_pages=full.free_pages[1:])))
    assert engine_occupancy(leaked).full == {PRIVATE: 2, PROTECTED: 4, EVICTABLE: 1, UNACCOUNTED: 1, FREE: 8}


def test_without_the_tree_what_requests_do_not_hold_is_not_attributed():
    occupancy = engine_occupancy(engine(), NO_TREE)
    assert occupancy.full == {PRIVATE: 2, NOT_ATTRIBUTED: 5, FREE: 9}
    assert occupancy.swa == {PRIVATE: 2, NOT_ATTRIBUTED: 4, FREE: 2}


def test_without_rows_nothing_is_attributed_and_there_are_no_window_lines():
    occupancy = engine_occupancy(engine(), {"free_sets", "mapping", "tree"})
    assert occupancy.full == {PROTECTED: 4, EVICTABLE: 1, NOT_ATTRIBUTED: 2, FREE: 9}
    assert occupancy.window_span is occupancy.window_bound is None


def test_the_window_lines_are_the_span_and_bound_i9_checks():
    """[WIN-5, I9] Decoding: from max(e, cpl) = 16 to ceil_page(22) = 24, 2 pages, against
    decode_window_bound(W=8, P=4, I=128) = 139 slots, 34 pages. Before the first decode:
    from the cursor e, against eviction_span_bound(8, 4) = 12 slots."""
    decoding = engine()
    assert (window_span(decoding.requests[0], 4), window_bound(decoding.requests[0], decoding.config)) == (8, 139)
    assert (engine_occupancy(decoding).window_span, engine_occupancy(decoding).window_bound) == (2, 34)
    prefilling = with_request(engine(**PREFILL), swa_evicted_seqlen=4)
    assert (window_span(prefilling.requests[0], 4), window_bound(prefilling.requests[0], prefilling.config)) == (12, 12)
    assert window_bound(replace(decoding.requests[0], decode_steps=2), decoding.config) == 139 + 4  # a page more before the 3rd
    no_sharing = replace(decoding.config, policy=Policy(NO_PREFIX_SHARING))
    assert window_bound(prefilling.requests[0], no_sharing) is None  # it evicts before the chunk's allocation
    assert engine_occupancy(replace(prefilling, config=no_sharing)).window_bound is None


def test_the_allocator_tier_has_what_the_caller_holds_and_free():
    trace = Trace("allocator", {"page_size": 4, "size_full": 16, "size_swa": 8}, "reference",
                  (TraceStep("new_sequence", {"length": 5}),))
    driver = build_driver(trace, load_adapter("reference"))
    driver.apply(trace.steps[0])
    occupancy = allocator_occupancy(driver)
    assert occupancy.full == {CALLER: 2, UNACCOUNTED: 0, FREE: 2}
    assert occupancy.swa == {CALLER: 2, UNACCOUNTED: 0, FREE: 0}


# -- the timeline of docs/checking.md's example ----------------------------------------------

def test_the_example_conforms_on_the_reference_and_keeps_within_the_window_bound():
    trace, reference = load(EXAMPLE), load_adapter("reference")
    assert replay(trace, reference).conforms
    points = timeline(trace, reference).points
    assert len(points) == len(trace.steps) and not any(point.violated for point in points)
    for point in points:
        occupancy = point.occupancy
        assert sum(occupancy.full.values()) == 64 and sum(occupancy.swa.values()) == 64
        assert occupancy.swa[PRIVATE] <= occupancy.window_span <= occupancy.window_bound


def test_without_the_chunk_release_the_timeline_marks_i9_and_goes_past_the_window_bound():
    """The SWA the request keeps from its cursor grows with the prompt; the timeline goes
    on past each violation to the end of the trace."""
    trace = load(EXAMPLE)
    points = timeline(trace, load_adapter("mutant-no-chunk-release")).points
    chunks = [point for point in points if point.operation == "prefill_chunk"]
    assert len(points) == len(trace.steps)
    assert all("I9" in point.violated for point in chunks)
    assert all(point.occupancy.window_span > point.occupancy.window_bound for point in chunks)
    spans = [point.occupancy.window_span for point in chunks]
    assert spans == sorted(spans) and spans[-1] == 48  # the whole prompt: 192 tokens, 48 pages
    assert all(point.occupancy.swa[PRIVATE] <= point.occupancy.window_bound for point in points)  # the tree holds it


def test_after_a_violation_the_engine_driver_checks_the_next_step_from_the_state_it_left():
    trace = load(EXAMPLE)
    driver = build_driver(trace, load_adapter("mutant-no-chunk-release"))
    driver.apply(trace.steps[0])
    with pytest.raises(InvariantViolation):
        driver.apply(trace.steps[1])
    assert driver.previous == driver.snapshot()


def test_an_adapter_without_the_tree_shows_what_it_holds_as_not_attributed():
    points = timeline(load(EXAMPLE), load_adapter("sample_adapters:NO_TREE_DUMP")).points
    assert all(PROTECTED not in point.occupancy.swa for point in points)
    assert max(point.occupancy.swa[NOT_ATTRIBUTED] for point in points) > 0


class DecodeRaises(ReferenceEngineAdapter):
    def decode(self, rid, token):
        raise RuntimeError("decode kernel failed")


class DECODE_RAISES:
    name, policy_version, make_engine = "decode-raises", "sglang-0.5.23", DecodeRaises
    capabilities = ("page_size_gt_1", "chunked_prefill")


def test_a_crash_ends_the_timeline_and_the_picture_marks_it(tmp_path):
    trace = load(EXAMPLE)
    crashing = timeline(trace, validate(DECODE_RAISES, "decode-raises"))
    first_decode = next(i for i, step in enumerate(trace.steps) if step.op == "decode")
    assert len(crashing.points) == first_decode
    assert (crashing.stop.step, crashing.stop.kind) == (first_decode, "crashed")
    assert "decode kernel failed" in crashing.stop.message
    assert is_png(draw(crashing, tmp_path / "crash.png"))


class LeaksAPage(ReferenceEngineAdapter):
    def snapshot(self):
        snapshot = self.engine.snapshot()
        full = snapshot.allocator.full
        return replace(snapshot, allocator=replace(snapshot.allocator, full=replace(full, free_pages=full.free_pages[1:])))


class LEAKS_A_PAGE:
    name, policy_version, make_engine = "leaks-a-page", "sglang-0.5.23", LeaksAPage
    capabilities = ("page_size_gt_1", "chunked_prefill")


def test_an_implementation_broken_from_the_start_gets_a_picture_saying_so(tmp_path):
    broken = timeline(load(EXAMPLE), validate(LEAKS_A_PAGE, "leaks-a-page"))
    assert broken.points == () and (broken.stop.step, broken.stop.kind) == (0, "violated")
    assert "[I2]" in broken.stop.message
    assert is_png(draw(broken, tmp_path / "broken.png"))


def test_a_passing_check_keeps_its_busiest_example():
    """Not the longest: Hypothesis' simplest examples repeat one refused call."""
    from hypothesis.stateful import run_state_machine_as_test

    from kvspec.conformance.harness.profiles import profile
    from kvspec.conformance.runs.plan import plan

    reference = load_adapter("reference")
    machine = plan(reference).named("allocator P=4").machine(reference)
    machine.reset_counters()
    run_state_machine_as_test(machine, settings=profile("quick"))
    busiest = machine.busiest_example("reference", None, "allocator P=4")
    observed = replay(busiest, reference).observed
    pools = busiest.config["size_full"] // 4, busiest.config["size_swa"] // 4
    free = [pools, *((seen["free_full_pages"], seen["free_swa_pages"]) for seen in observed)]
    traffic = sum(abs(a - b) for before, after in pairwise(free) for a, b in zip(before, after))
    assert traffic == machine.busiest[0] > 0


# -- the command line ------------------------------------------------------------------------------

def test_replay_with_plot_writes_a_png_and_prints_its_path(tmp_path):
    result = kvspec("replay", str(EXAMPLE), "--adapter", "mutant-no-chunk-release", "--plot", "run.png", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr  # I9: the picture is drawn all the same
    assert "picture: run.png" in result.stdout
    assert is_png(tmp_path / "run.png")


def test_replay_of_a_directory_draws_one_picture_per_trace(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(EXAMPLE.read_text())
    result = kvspec("replay", ".", "--plot", "pics/run.svg", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "picture: pics/run-a.svg" in result.stdout and "picture: pics/run-b.svg" in result.stdout
    assert (tmp_path / "pics" / "run-b.svg").read_text().lstrip().startswith("<?xml")


def test_check_with_plot_writes_a_png_per_run_and_prints_its_path(tmp_path):
    result = kvspec("check", "--adapter", "reference", "--profile", "quick", "--run", "engine P=4 W=6",
                    "--plot", "x.png", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "picture: x.png" in result.stdout
    assert is_png(tmp_path / "x.png")


def test_several_runs_or_traces_get_one_picture_each_named_after_it():
    assert pictures(None, ["allocator-p-4"]) == {"allocator-p-4": None}
    assert pictures("out/x.png", ["allocator-p-4"]) == {"allocator-p-4": "out/x.png"}
    assert pictures("out/x.png", ["allocator-p-4", "engine-p-4-w-6-i-4"]) == {
        "allocator-p-4": "out/x-allocator-p-4.png", "engine-p-4-w-6-i-4": "out/x-engine-p-4-w-6-i-4.png"}


@pytest.mark.parametrize("command", [["check", "--run", "engine P=4 W=6"], ["replay", str(EXAMPLE)]])
def test_a_plot_file_that_is_no_picture_format_exits_2_before_anything_runs(command, tmp_path):
    result = kvspec(*command, "--plot", "run.jpg", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "use .png, .svg, .pdf" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "kvspec-traces").exists() and "kvspec check:" not in result.stdout


def test_without_matplotlib_plot_exits_2_saying_what_to_install(tmp_path):
    hide_matplotlib = ("import sys; sys.modules['matplotlib'] = None; from kvspec.conformance.cli import main; "
                       f"sys.exit(main(['replay', {str(EXAMPLE)!r}, '--plot', 'run.png']))")
    result = subprocess.run([sys.executable, "-c", hide_matplotlib], check=False, capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'kvspec[plot]'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run.png").exists()


def test_the_example_and_its_picture_are_what_the_docs_script_writes(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "long_chunked_prefill.py"),
                             "--out", str(tmp_path)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    written, committed = load(tmp_path / "examples" / EXAMPLE.name), load(EXAMPLE)
    assert (written.config, written.steps) == (committed.config, committed.steps)
    assert all(step.expect is not None for step in committed.steps)
    assert is_png(tmp_path / "images" / "swa-release-on-off.png")


# -- one shared block pool (spec chapter 08) ---------------------------------------------------------
# A hand-made view (block size 4, window 6, groups 0 "full" and 1 "swa", 11 real blocks):
#   * r1 decodes: its last allocation ran with 10 tokens computed and left 11 slots; full
#     blocks 1, 2, 3; its SWA table has released [0, 4) (the null block), then 4, 5.
#   * r2, admitted with a prefix hit on r1's first 8 tokens (full 1, 2; SWA 4, and 7, the
#     block of [0, 4) r1 had released, still cached and free until the hit took it back),
#     then a chunk of 2: 8 computed, 10 slots; full 6, SWA 8 for [8, 10).
#   * block 9: free, still cached (vLLM evicts lazily); blocks 10, 11: free, no key.

BS, W = 4, 6
H0, H1, HC = 0xA0, 0xA1, 0xC0


def pool_view() -> BlockPoolView:
    refs = {1: 2, 2: 2, 3: 1, 4: 2, 5: 1, 6: 1, 7: 1, 8: 1}
    keys = {1: (H0, 0), 2: (H1, 0), 4: (H1, 1), 7: (H0, 1), 9: (HC, 0)}
    r1 = RequestBlocks("r1", ((1, 2, 3), (NULL_BLOCK, 4, 5)), processed=10, slots=11)
    r2 = RequestBlocks("r2", ((1, 2, 6), (7, 4, 8)), processed=8, slots=10)
    return BlockPoolView(block_size=BS, window=W, groups=(FULL, SWA),
                         blocks=tuple(Block(b, refs.get(b, 0), keys.get(b)) for b in range(12)),
                         free_queue=(11, 10, 9), requests=(r1, r2),
                         cache_map=tuple(sorted((h, g, b) for b, (h, g) in keys.items())))


def pool_snapshot(view: BlockPoolView) -> BlockPoolSnapshot:
    """A block-pool engine's snapshot as the vllm adapter shows one, with no requests."""
    real = len(view.blocks) - 1
    config = EngineConfig(page_size=BS, window=W, size_full=8 * BS, size_swa=(real - 8) * BS, policy=Policy(VLLM_0_33))
    return BlockPoolSnapshot(config, (), view)


def block_clauses(view: BlockPoolView) -> set[str]:
    now = pool_snapshot(view)
    return {v.clause for v in pool_accounting_violations(now) + reference_count_violations(now)}


def test_a_block_pool_splits_into_blocks_held_by_each_kind_of_table_cached_and_free():
    """[BLOCK-1, BLOCK-2] Each real block once (the null block is not drawn): a block two
    requests share counts once, under the kind of the tables that hold it; the shared pool
    the allocator shows as `full` is no full pool."""
    view = pool_view()
    assert block_clauses(view) == set()
    occupancy = engine_occupancy(pool_snapshot(view))
    assert occupancy == block_pool_occupancy(view) and set(occupancy.pools) == {"blocks"}
    assert occupancy.blocks == {FULL_TABLES: 4, SWA_TABLES: 4, BLOCKS_UNACCOUNTED: 0, CACHED_FREE: 1, FREE: 2}
    assert sum(occupancy.blocks.values()) == len(view.blocks) - 1 == 11


def test_the_block_pool_window_lines_are_the_held_swa_blocks_and_the_bound_block_6_checks():
    """[BLOCK-6] Summed over the requests: r1 holds 2 real SWA blocks, r2 3 (block 4, which
    both hold, once each), against swa_block_bound(W, slots - processed): 1 + cdiv(6 - 1 +
    1, 4) = 3 for r1, 1 + cdiv(6 - 1 + 2, 4) = 3 for r2."""
    occupancy = block_pool_occupancy(pool_view())
    assert occupancy.window_span == 2 + 3
    assert occupancy.window_bound == swa_block_bound(W, 1, BS) + swa_block_bound(W, 2, BS) == 6
    released = replace(pool_view(), requests=(), free_queue=(11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1),
                       blocks=tuple(replace(block, ref_cnt=0) for block in pool_view().blocks))
    after = block_pool_occupancy(released)
    assert (after.window_span, after.window_bound) == (0, 0)
    assert after.blocks == {FULL_TABLES: 0, SWA_TABLES: 0, BLOCKS_UNACCOUNTED: 0, CACHED_FREE: 5, FREE: 6}


def leaked(view: BlockPoolView) -> BlockPoolView:
    """Block 10 keeps a reference after its request let go: held by no table."""
    return replace(view, blocks=tuple(replace(b, ref_cnt=1) if b.block_id == 10 else b for b in view.blocks),
                   free_queue=(11, 9))


def lost(view: BlockPoolView) -> BlockPoolView:
    """Block 10, with no reference, is missing from the free queue."""
    return replace(view, free_queue=(11, 9))


def two_kinds(view: BlockPoolView) -> BlockPoolView:
    """r2's full table takes r1's SWA block 5 where its own block 6 was (6 freed, 5's
    count mended): a block held by tables of both kinds."""
    r1, r2 = view.requests
    refs = {5: 2, 6: 0}
    return replace(view, requests=(r1, replace(r2, tables=((1, 2, 5), r2.tables[1]))), free_queue=(11, 10, 9, 6),
                   blocks=tuple(replace(b, ref_cnt=refs.get(b.block_id, b.ref_cnt)) for b in view.blocks))


@pytest.mark.parametrize(("seed", "clause", "held"), [(leaked, "BLOCK-2", (4, 4)), (lost, "BLOCK-1", (4, 4)),
                                                      (two_kinds, "BLOCK-2", (3, 3))])
def test_a_block_neither_held_by_one_kind_of_table_nor_free_is_unaccounted(seed, clause, held):
    """[BLOCK-1, BLOCK-2] Each seeded bug breaks the clause named, and its block is drawn as
    unaccounted, never as held or free; the categories still add up to the pool."""
    view = seed(pool_view())
    assert block_clauses(view) == {clause}
    blocks = block_pool_occupancy(view).blocks
    assert blocks[BLOCKS_UNACCOUNTED] == 1 and (blocks[FULL_TABLES], blocks[SWA_TABLES]) == held
    assert sum(blocks.values()) == 11


def test_a_leak_in_a_block_pool_is_drawn_unaccounted_and_marked(tmp_path):
    """[BLOCK-2] A hand-made timeline, clean then leaking: the top panel's legend has the
    unaccounted band, the step its clause; the second panel has the window lines."""
    clean, leaking = block_pool_occupancy(pool_view()), block_pool_occupancy(leaked(pool_view()))
    run = Timeline("a leak", {"blocks": 11}, (Point(0, "decode", clean), Point(1, "finish", leaking, ("BLOCK-2",))))
    assert panels(run) == ("blocks", SWA_BLOCKS)
    plt = pyplot()
    figure, (top, bottom) = plt.subplots(2, 1)
    plot_pool(top, run, "blocks")
    plot_pool(bottom, run, SWA_BLOCKS, marks=False)
    assert BLOCKS_UNACCOUNTED in [text.get_text() for text in top.get_legend().get_texts()]
    assert "BLOCK-2" in [text.get_text() for text in top.texts] and top.get_ylim() == (0, 11)
    assert [text.get_text() for text in bottom.get_legend().get_texts()] == [
        "window bound (BLOCK-6)", "held, summed over requests"]
    plt.close(figure)
    assert is_png(draw(run, tmp_path / "leak.png"))


class SnapshotRaises(ReferenceEngineAdapter):
    def snapshot(self):
        raise RuntimeError("no snapshot")


class BLOCK_POOL_SNAPSHOT_RAISES:
    name, policy_version, memory_model = "block-pool-snapshot-raises", VLLM_0_33, "block-pool"
    make_engine = SnapshotRaises
    capabilities = ("page_size_gt_1", "chunked_prefill")


def test_a_block_pool_engine_broken_before_its_first_step_gets_the_block_pool_panels(tmp_path):
    """[OBS-1] With no snapshot to read the pool's size from, the panels follow the
    memory model the adapter declares, sized by the configuration's pages together."""
    trace = load(EXAMPLE)
    broken = timeline(trace, validate(BLOCK_POOL_SNAPSHOT_RAISES, "block-pool-snapshot-raises"))
    assert broken.points == () and (broken.stop.step, broken.stop.kind) == (0, "crashed")
    assert panels(broken) == ("blocks", SWA_BLOCKS)
    assert broken.pool_pages == {"blocks": (trace.config["size_full"] + trace.config["size_swa"]) // 4}
    assert is_png(draw(broken, tmp_path / "broken.png"))


# -- real vLLM (adapters/vllm; skipped without it, unless KVSPEC_REQUIRE_VLLM=1) -----------------------

needs_vllm = pytest.mark.skipif(
    os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt")
VLLM_CONFIG = EngineConfig(page_size=4, window=7, size_full=64, size_swa=32, max_requests=4,
                           policy=Policy(VLLM_0_33, 4))
"""24 real blocks in the vllm adapter's pool (both pools' pages together)."""
PROMPT = list(range(30))


def serve(rid: str, prompt: list[int], chunks: tuple[int, ...], decodes: int) -> tuple[TraceStep, ...]:
    return (TraceStep("admit", {"rid": rid, "prompt": prompt}),
            *(TraceStep("prefill_chunk", {"rid": rid, "chunk": chunk, "token": 1}) for chunk in chunks),
            *[TraceStep("decode", {"rid": rid, "token": 1})] * decodes)


def shared_prefix_trace() -> Trace:
    """a prefills 30 tokens in chunks and decodes; it finishes, its blocks cached and free;
    b, a's prompt and more, takes them back by a prefix hit; c, another prompt, fills
    the pool beside b; both finish, and an eviction drops every cached key."""
    steps = (*serve("a", PROMPT, (8, 8, 8, 6), 5), TraceStep("finish", {"rid": "a", "trim": 0}),
             *serve("b", PROMPT + [99] * 6, (8,), 3), *serve("c", [7] * 20, (8, 8, 4), 2),
             TraceStep("finish", {"rid": "c", "trim": 0}), TraceStep("finish", {"rid": "b", "trim": 0}),
             TraceStep("evict", {"full_tokens": 64, "swa_tokens": 32}))
    return Trace("engine", engine_config_json(VLLM_CONFIG), "vllm", steps, label="two prompts sharing a prefix")


def assert_within_the_pool_and_the_bound(run: Timeline) -> None:
    for point in run.points:
        assert set(point.occupancy.pools) == {"blocks"}, point
        assert sum(point.occupancy.blocks.values()) == run.pool_pages["blocks"], point
        assert point.occupancy.window_span <= point.occupancy.window_bound, point


@needs_vllm
def test_a_conformant_vllm_replay_keeps_its_swa_blocks_within_the_bound_and_draws_a_png(tmp_path):
    """[BLOCK-1, BLOCK-6] On real vLLM: each step's categories add up to the pool's 24 real
    blocks and the SWA blocks held never exceed the bound, which they reach; a's blocks
    are cached and free once it finishes, b's prefix hit takes some back, the eviction
    leaves every block free."""
    trace, vllm = shared_prefix_trace(), load_adapter("vllm")
    assert replay(trace, vllm, compare=False).conforms
    run = timeline(trace, vllm)
    assert run.pool_pages == {"blocks": 24} and panels(run) == ("blocks", SWA_BLOCKS) and run.stop is None
    assert len(run.points) == len(trace.steps) and not any(point.violated for point in run.points)
    assert_within_the_pool_and_the_bound(run)
    assert any(point.occupancy.window_span == point.occupancy.window_bound > 0 for point in run.points)
    blocks = [point.occupancy.blocks for point in run.points]
    a_done = next(i for i, step in enumerate(trace.steps) if step.op == "finish")
    assert blocks[a_done][FULL_TABLES] == blocks[a_done][SWA_TABLES] == 0 and blocks[a_done][CACHED_FREE] > 0
    assert blocks[a_done + 1][CACHED_FREE] < blocks[a_done][CACHED_FREE]  # b's hit
    assert blocks[-1] == {FULL_TABLES: 0, SWA_TABLES: 0, BLOCKS_UNACCOUNTED: 0, CACHED_FREE: 0, FREE: 24}
    assert is_png(draw(run, tmp_path / "vllm.png"))


@needs_vllm
def test_the_busiest_example_of_a_vllm_check_keeps_within_the_pool_and_the_bound(tmp_path):
    """[BLOCK-1, BLOCK-6] A quick check of one engine run on real vLLM passes; at every
    step of the example its picture draws, the categories add up to the pool and the
    SWA blocks held stay within the bound."""
    from hypothesis.stateful import run_state_machine_as_test

    from kvspec.conformance.harness.profiles import profile
    from kvspec.conformance.runs.plan import plan

    vllm = load_adapter("vllm")
    machine = plan(vllm).named("engine P=4 W=7 I=1").machine(vllm)
    machine.reset_counters()
    run_state_machine_as_test(machine, settings=profile("quick"))
    run = timeline(machine.busiest_example("vllm", None, "engine P=4 W=7 I=1"), vllm)
    assert run.points and run.stop is None and not any(point.violated for point in run.points)
    assert_within_the_pool_and_the_bound(run)
    assert is_png(draw(run, tmp_path / "busiest.png"))


class LEAKS_ON_FINISH:
    """vLLM whose finish takes one more reference on the request's last full block (no
    later prefix hit in these traces takes it back) before vLLM frees the request: the
    block keeps a count of 1 and no table holds it."""

    name, policy_version, memory_model = "leaks-on-finish", VLLM_0_33, "block-pool"
    capabilities = ("page_size_gt_1", "prefix_sharing", "chunked_prefill")

    @staticmethod
    def make_engine(config):
        from kvspec.adapters.vllm.engine import VllmEngine

        class LeaksOnFinish(VllmEngine):
            def finish(self, rid, trim=0):
                if rid in self.finished_prefill:
                    self.pool.touch(self.managers[self.groups.index(FULL)].req_to_blocks[rid][-1:])
                return super().finish(rid, trim)

        return partial(LeaksOnFinish, retention=0)(config)


@needs_vllm
def test_a_block_leaked_on_real_vllm_is_drawn_unaccounted_from_the_step_that_leaks_it(tmp_path):
    """[BLOCK-2] Each finish leaks a block: the timeline goes on past the violation, and
    from a's finish on one block (two after c's) is unaccounted, every step marked."""
    trace = shared_prefix_trace()
    run = timeline(trace, validate(LEAKS_ON_FINISH, "leaks-on-finish"))
    assert len(run.points) == len(trace.steps) and run.stop is None
    finishes = [i for i, step in enumerate(trace.steps) if step.op == "finish"]
    unaccounted = [point.occupancy.blocks[BLOCKS_UNACCOUNTED] for point in run.points]
    assert unaccounted == [sum(i >= done for done in finishes) for i in range(len(trace.steps))]
    assert all(("BLOCK-2" in point.violated) == (point.step >= finishes[0]) for point in run.points)
    assert all(sum(point.occupancy.blocks.values()) == 24 for point in run.points)
    assert is_png(draw(run, tmp_path / "leak.png"))


# -- a state pool (spec chapter 09) -------------------------------------------------------------

STATE_TRACE = Trace("engine", engine_config_json(EngineConfig(2, 5, 64, 32, 2, state_slots=5, state_grid=4)),
                    "reference", (TraceStep("admit", {"rid": "a", "prompt": [1, 2, 0, 1, 2, 2, 0, 1, 1, 0]}),
                                  TraceStep("prefill_chunk", {"rid": "a", "chunk": 4, "token": 0}),
                                  TraceStep("prefill_chunk", {"rid": "a", "chunk": 6, "token": 0}),
                                  TraceStep("admit", {"rid": "b", "prompt": [1, 2, 0, 1, 0, 0]}),
                                  TraceStep("abort", {"rid": "a"})))


def test_a_state_pool_gets_a_panel_of_working_states_checkpoints_and_free_slots(tmp_path):
    run = timeline(STATE_TRACE, load_adapter("reference"))
    assert panels(run) == ("full", "swa", "state") and run.pool_pages["state"] == 5
    slots = [point.occupancy.pools["state"] for point in run.points]
    assert all(sum(counts.values()) == 5 and counts[STATE_UNACCOUNTED] == 0 for counts in slots)
    # after the first chunk: a's working state and its locked checkpoint at 4
    assert (slots[1][WORKING], slots[1][CHECKPOINT_LOCKED], slots[1][FREE]) == (1, 1, 3)
    # b hits a's checkpoint at 4 (copy-on-write: a slot of its own); a's abort unlocks what it held
    assert slots[3][WORKING] == 2 and slots[4][WORKING] == 1
    assert is_png(draw(run, tmp_path / "state.png"))


def test_a_leaked_state_slot_is_drawn_unaccounted():
    leaky = timeline(STATE_TRACE, load_adapter("mutant-retract-keeps-state"))  # retract is not in this trace
    assert all(point.occupancy.pools["state"][STATE_UNACCOUNTED] == 0 for point in leaky.points)
    abort_leaks = replace(STATE_TRACE, steps=(*STATE_TRACE.steps[:-1], TraceStep("retract", {"rid": "a"})))
    leaked = timeline(abort_leaks, load_adapter("mutant-retract-keeps-state"))
    assert leaked.points[-1].occupancy.pools["state"][STATE_UNACCOUNTED] == 1
    assert "STATE-1" in leaked.points[-1].violated
