"""[I1 .. I16, LIFE-1 .. LIFE-8] Random request lifecycles on the reference engine: the
engine-tier state machine (kvspec.conformance.harness.engine_machine) at page sizes and windows
chosen for their arithmetic, every invariant checked after every step.

  * the versions that promise the window (sglang-0.5.23, design-margin) and the one
    without prefix sharing pass at W % P != 0, W % P == P - 1, P > W, P == 1 and W % P
    == 0, with decode eviction intervals 1, 4 and 128;
  * drop-margin (retention W) breaks the insert boundary [I10] exactly when
    1 <= W % P <= P - 2 (docs/engines/sglang.md §3.9), and max-window-page (retention
    max(W, P), SGLang 0.5.15 - 0.5.22) there once W > P (spec/05-window.md, WIN-2): the
    machine must find the violation where `insert_window_at_risk` says so, and must not
    elsewhere.

Failing runs are not shrunk (only the verdict matters here), so a run that finds its
bug stops at once.
"""

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.harness.engine_machine import engine_machine
from kvspec.conformance.harness.profiles import profile
from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.outcomes import Outcome
from kvspec.spec.pages import floor_page
from kvspec.spec.snapshot import EngineConfig, Step
from kvspec.spec.window import (
    DESIGN_MARGIN,
    DROP_MARGIN,
    MAX_WINDOW_PAGE,
    NO_PREFIX_SHARING,
    SGLANG_0_5_23,
    Policy,
    insert_window_at_risk,
    pd_checkpoint_at_risk,
    swa_tail_len,
)

QUICK = settings(profile("quick"), database=None)
UNTIL_FOUND = settings(QUICK, max_examples=1000, phases=[Phase.explicit, Phase.generate])
"""Up to 1000 examples, stopping at the first failure, not shrinking it."""

CONFIGS = {
    # (page_size, window, decode_eviction_interval): why
    (4, 6, 4): "W % P == 2 == P - 2: retention rounds the window up",
    (4, 7, 128): "W % P == P - 1, the default interval",
    (8, 3, 1): "P > W: retention is a whole page, eviction every step",
    (1, 5, 1): "P == 1: token allocator, no PD pre-allocation",
    (2, 8, 128): "W % P == 0",
}


def run(page_size: int, window: int, policy: Policy, run_settings: settings = QUICK):
    machine = engine_machine(ReferenceEngineAdapter, page_size, window, policy)
    run_state_machine_as_test(machine, settings=run_settings)
    return machine


def failure_text(error: BaseException | None, seen: frozenset = frozenset()) -> str:
    """The messages of an error and its notes, of every error of a group, and of the errors
    it was raised from or while handling (the machine's teardown runs after a failed step
    and may raise on the state that step left), recursively."""
    if error is None or id(error) in seen:
        return ""
    seen = seen | {id(error)}
    parts = [f"{type(error).__name__}: {error}", *getattr(error, "__notes__", [])]
    for inner in (*getattr(error, "exceptions", ()), error.__cause__, error.__context__):
        parts.append(failure_text(inner, seen))
    return "\n".join(part for part in parts if part)


@pytest.mark.parametrize("version", [SGLANG_0_5_23, DESIGN_MARGIN, NO_PREFIX_SHARING])
@pytest.mark.parametrize("page_size, window, interval", sorted(CONFIGS))
def test_random_lifecycles_keep_every_invariant(page_size, window, interval, version):
    machine = run(page_size, window, Policy(version, interval))
    assert machine.examples >= 1 and machine.steps > machine.examples


SHORT_LEAF_BREAKS = [(DROP_MARGIN, 4, 5), (DROP_MARGIN, 4, 6), (DROP_MARGIN, 4, 2), (DROP_MARGIN, 8, 13),
                     (MAX_WINDOW_PAGE, 4, 6), (MAX_WINDOW_PAGE, 8, 13)]
"""1 <= W % P <= P - 2 (and W > P for max-window-page)."""
SHORT_LEAF_KEEPS = [(DROP_MARGIN, 4, 7), (DROP_MARGIN, 4, 8), (DROP_MARGIN, 4, 3), (DROP_MARGIN, 2, 5),
                    (MAX_WINDOW_PAGE, 4, 7), (MAX_WINDOW_PAGE, 4, 2), (MAX_WINDOW_PAGE, 16, 5)]
"""W % P in {0, P - 1} (with P <= 2 every W is one of them), or max-window-page below a page."""


@pytest.mark.parametrize("version, page_size, window", SHORT_LEAF_BREAKS)
def test_a_retention_without_the_page_margin_breaks_the_insert_boundary(version, page_size, window):
    """[I10] A checkpoint's new leaf keeps fewer than min(W, E) live tokens: unmatchable."""
    assert insert_window_at_risk(version, window, page_size)
    with pytest.raises(Exception) as found:
        run(page_size, window, Policy(version, 4), UNTIL_FOUND)
    assert "[I10]" in failure_text(found.value), failure_text(found.value)


@pytest.mark.parametrize("version, page_size, window", SHORT_LEAF_KEEPS)
def test_a_retention_without_the_page_margin_keeps_the_insert_boundary_where_the_window_allows(
        version, page_size, window):
    assert not insert_window_at_risk(version, window, page_size)
    run(page_size, window, Policy(version, 4))


# -- counterexamples the machine found, replayed -------------------------------------------------

def replay(config: EngineConfig, calls: list[tuple]) -> None:
    """Run the calls, checking every invariant after each."""
    engine = TwoPoolEngine(config)
    previous = engine.check_invariants()
    for operation, rid, *arguments in calls:
        outcome = getattr(engine, operation)(rid, *arguments)
        previous = engine.check_invariants(previous, Step(operation, rid, Outcome.OK if outcome is None else Outcome.OUT_OF_MEMORY))


@pytest.mark.parametrize("page_size, window, calls", [
    # shrunk at P=16, W=5, no-prefix-sharing: PD tail [0, 17), the cursor reaches 16, the stop keeps nothing
    (16, 5, [("pd_admit", "r1", [0] * 17, 0)] + [("decode", "r1", 0)] * 7 + [("finish", "r1", 24)]),
    (16, 5, [("pd_admit", "r1", [0] * 38, 0), ("finish", "r1", 22)]),
    # the same at P=8, W=3: the cursor 16 above ceilP(owned) = 8
    (8, 3, [("admit", "r1", [1] * 8), ("prefill_chunk", "r1", 8)] + [("decode", "r1", 0)] * 16 + [("finish", "r1", 16)]),
])
def test_a_stop_below_the_swa_cursor_without_prefix_sharing(page_size, window, calls):
    """[LIFE-5] A stop that trims past the SWA cursor: the trimmed pages below the cursor
    have no SWA KV left and must be freed full-only. (Regression: the over-allocated
    range [ceilP(owned), L) used to be freed whole with the strict free_segment:
    InvalidFree, with the request half released, then a double free at teardown.)"""
    config = EngineConfig(page_size=page_size, window=window, size_full=8 * page_size, size_swa=4 * page_size,
                          max_requests=4, policy=Policy(NO_PREFIX_SHARING, 4 if page_size == 16 else 1))
    replay(config, calls)


def test_a_stop_below_the_swa_cursor_with_prefix_sharing():
    """[LIFE-5] The same with sglang-0.5.23, P=16, W=5: retention 16, the cursor reaches 48
    after 49 decode steps; a stop that keeps 25 tokens inserts nothing new and leaves
    [32, 48) SWA-dead in the over-allocated range."""
    config = EngineConfig(page_size=16, window=5, size_full=160, size_swa=64, max_requests=4,
                          policy=Policy(SGLANG_0_5_23, 4))
    replay(config, [("admit", "r1", list(range(16))), ("prefill_chunk", "r1", 16)]
           + [("decode", "r1", 0)] * 49 + [("finish", "r1", 40)])


def test_a_checkpoint_over_the_pd_tail_is_at_risk_exactly_where_max_window_page_is():
    """[WIN-6, I10] An admission checkpoint [0, floor_page(fill)) over WIN-6's decode-side
    tail (what SGLang does, SGL-11) keeps min(W, E) live tokens for every fill exactly
    where pd_checkpoint_at_risk says it may not."""
    for page_size in (1, 2, 3, 4, 8, 16):
        for window in range(1, 41):
            short = set()
            for fill in range(1, 301):
                end, cursor = floor_page(fill, page_size), fill - swa_tail_len(fill, window, page_size, True)
                if end - cursor < min(window, end):
                    short.add(fill)
            assert bool(short) == pd_checkpoint_at_risk(window, page_size), (page_size, window, sorted(short)[:3])
