"""[OBS-4] Partial snapshots: with large pools the harness checks an engine on snapshots
that show free counts and the mapping at held slots only, and on a whole one every
pool_check_period checks. What each kind of snapshot sees, with seeded bugs."""

import pytest

from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.spec.accounting import PartialMapping
from kvspec.spec.invariants import engine_violations
from kvspec.spec.models import TWO_POOL, fixed_observables
from kvspec.spec.snapshot import POOL_CHECK_SLOTS, EngineConfig, pool_check_period
from kvspec.spec.window import Policy

LARGE = 16 * POOL_CHECK_SLOTS  # both pools: a whole snapshot every 32 checks


def large_engine(page_size: int = 1) -> ReferenceEngineAdapter:
    engine = ReferenceEngineAdapter(EngineConfig(page_size, 6, LARGE, LARGE, 4, Policy()))
    engine.admit("a", [1, 2, 3] * 10)
    engine.prefill_chunk("a", 30, 7)
    for token in range(12):
        engine.decode("a", token)
    return engine


def test_the_period_is_one_for_the_suites_pools_and_grows_with_larger_ones():
    # the engine machine's largest pools (page size 16: at most 24 + ... pages) stay far below
    assert pool_check_period(EngineConfig(16, 8, 64 * 16, 16 * 16)) == 1
    assert pool_check_period(EngineConfig(1, 24, 1 << 10, 1 << 10)) == 1
    assert pool_check_period(EngineConfig(1, 24, 1 << 16, 1 << 16)) == 32
    assert pool_check_period(EngineConfig(1, 24, 1 << 20, 1 << 20)) == 512


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_partial_snapshot_is_the_whole_one_less_the_free_lists_and_the_unheld_mapping(page_size):
    engine = large_engine(page_size)
    whole, partial = engine.snapshot(), engine.partial_snapshot()
    assert partial.requests == whole.requests and partial.nodes == whole.nodes and partial.ledgers == whole.ledgers
    for pool in ("full", "swa"):
        shown, hidden = getattr(whole.allocator, pool), getattr(partial.allocator, pool)
        assert hidden.free_pages is None and hidden.free_count == shown.free_count == len(shown.free_pages)
    mapping = partial.allocator.mapping
    assert isinstance(mapping, PartialMapping) and len(mapping) == len(whole.allocator.mapping)
    held = {slot for r in whole.requests for slot in r.row} | {slot for n in whole.nodes for slot in n.full_value}
    assert set(mapping.entries) == held and all(whole.allocator.mapping[slot] == peer for slot, peer in mapping.entries.items())
    assert fixed_observables(partial, "ok") == fixed_observables(whole, "ok")
    assert engine_violations(None, None, whole) == engine_violations(None, None, partial) == []


def test_a_leak_is_seen_on_a_partial_snapshot_by_its_count():
    """[I2] A page dropped from the free list: the free count says so at once."""
    engine = large_engine()
    engine.engine.allocator.full.free_top -= 1  # seeded bug: the top free page vanishes
    assert {v.clause for v in engine_violations(None, None, engine.partial_snapshot())} == {"I2"}


def driven(engine) -> EngineDriver:
    driver = EngineDriver(engine, TWO_POOL, frozenset(TWO_POOL.observables))
    assert driver.period == 32
    return driver


def decode_until_caught(driver: EngineDriver, limit: int) -> tuple[int, tuple[str, ...]]:
    """Decode steps until a check fails: the number of checks taken, the clauses."""
    for _ in range(limit):
        try:
            driver.call("decode", {"rid": "a", "token": 0})
        except InvariantViolation as violation:
            return driver.checks, violation.clauses
    raise AssertionError(f"not caught in {limit} steps")


def test_a_stale_mapping_entry_is_caught_at_the_next_whole_snapshot():
    """[I5] A full slot no one holds that still maps to an SWA slot: only the whole
    mapping shows it, so it is caught at the next whole snapshot, within the period."""
    engine = large_engine()
    driver = driven(engine)
    engine.engine.allocator.mapping[LARGE - 1] = 5  # seeded bug, outside every holder
    checks, clauses = decode_until_caught(driver, 2 * driver.period)
    assert checks == 33 and clauses == ("I5",)  # the first whole snapshot after the one at check 1


def test_a_duplicate_free_page_that_keeps_the_count_is_caught_at_the_next_whole_snapshot():
    """[I1] A free page listed twice in place of another: the count is right, the list is not."""
    engine = large_engine()
    driver = driven(engine)
    pool = engine.engine.allocator.swa
    pool.free_stack[0] = pool.free_stack[1]  # seeded bug: the bottom free page, named twice
    checks, clauses = decode_until_caught(driver, 2 * driver.period)
    assert checks == 33 and "I1" in clauses


def test_an_engine_without_partial_snapshots_is_checked_whole_every_step():
    class WholeOnly:
        def __init__(self, engine):
            self.engine = engine

        def snapshot(self):
            return self.engine.snapshot()

        def __getattr__(self, operation):  # the operations, and no partial_snapshot
            if operation in {"admit", "prefill_chunk", "decode", "finish", "abort", "evict"}:
                return getattr(self.engine, operation)
            raise AttributeError(operation)

    engine = large_engine()
    driver = EngineDriver(WholeOnly(engine), TWO_POOL, frozenset(TWO_POOL.observables))
    assert driver.period == 1
    engine.engine.allocator.mapping[LARGE - 1] = 5
    assert decode_until_caught(driver, 3) == (2, ("I5",))


def test_draining_ends_on_a_whole_snapshot():
    engine = large_engine()
    driver = driven(engine)
    driver.drain()
    assert driver.previous.allocator.full.free_pages is not None
    assert driver.previous.requests == ()
