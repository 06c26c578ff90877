"""Pictures of a run (conformance/occupancy.py): the occupancy of known snapshots, the
timeline of the README's example on the reference and on mutant-no-chunk-release, and
`--plot` on `kvspec check` and `kvspec replay`."""

import subprocess
import sys
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from test_engine_invariants import PREFILL, engine, with_request

from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.checks import InvariantViolation
from kvspec.conformance.cli import pictures
from kvspec.conformance.occupancy import (
    CALLER,
    EVICTABLE,
    FREE,
    NOT_ATTRIBUTED,
    PRIVATE,
    PROTECTED,
    UNACCOUNTED,
    allocator_occupancy,
    draw,
    engine_occupancy,
    timeline,
    window_bound,
    window_span,
)
from kvspec.conformance.protocol import load_adapter, validate
from kvspec.conformance.replay import build_driver, replay
from kvspec.conformance.trace import Trace, TraceStep, load
from kvspec.spec.window import NO_PREFIX_SHARING, Policy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "long-chunked-prefill.jsonl"
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


# -- the timeline of the README's example -----------------------------------------------------------

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

    from kvspec.conformance.profiles import profile
    from kvspec.conformance.runs import machines

    reference = load_adapter("reference")
    machine = dict(machines(reference))["allocator P=4"]
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
    assert pictures(Path("out/x.png"), ["allocator-p-4"]) == {"allocator-p-4": "out/x.png"}
    assert pictures(Path("out/x.png"), ["allocator-p-4", "engine-p-4-w-6-i-4"]) == {
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
