"""Incremental checking (conformance/harness/incremental.py) finds the same violations at the
same step as the spec's naive predicates: on the same random runs of the reference and of
its seeded-bug mutants, whole and partial snapshots, and on those snapshots perturbed at
random (a slot, a lock, a page, a mapping entry changed), where a certificate that says
"nothing to find" while the spec's predicate finds something is a wrong verdict. A
certificate seeded to be wrong is caught by the same comparison."""

import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.conformance.harness.checks import Checks, StepFailure
from kvspec.conformance.harness.incremental import Certificates
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.spec.accounting import PartialMapping
from kvspec.spec.registry import violations
from kvspec.spec.snapshot import TwoPoolSnapshot
from kvspec.spec.window import Policy

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from workload import Workload, small_pools  # noqa: E402 - the benchmark's lifecycle workload

OBSERVABLES = {"free_sets", "rows", "tree", "mapping"}
CHECKS = Checks(TwoPoolSnapshot, OBSERVABLES, incremental=False).run
RUNS = [("reference", 1, 6), ("reference", 4, 6), ("reference", 16, 24), ("reference", 2, 5),
        ("mutant-leak-on-release", 4, 7), ("mutant-swa-evict-ignores-locks", 4, 7),
        ("mutant-frontier-into-window", 4, 7), ("mutant-decode-frontier-one-token-late", 1, 3),
        ("mutant-unaligned-cursor", 2, 5), ("mutant-match-short-window", 4, 8), ("mutant-pd-cursor-unset", 4, 6),
        ("mutant-no-chunk-release", 4, 6), ("mutant-decode-eviction-never", 4, 8)]


def steps_of(adapter_name: str, page_size: int, window: int, seed: int = 0, count: int = 250) -> list[tuple]:
    """(previous, step, now) of every check of a workload run, going on past violations."""
    adapter = load_adapter(adapter_name)
    workload = Workload(adapter, small_pools(page_size, window, Policy(adapter.policy_version, 4)), seed, check=True)
    seen, check = [], workload.driver.invariants.violations

    def record(tally, now, previous=None, step=None):
        seen.append((previous, step, now))
        return check(tally, now, previous, step)

    workload.driver.invariants.violations = record
    for _ in range(count):
        try:
            workload.one()
        except StepFailure:
            pass
    return seen


@pytest.fixture(scope="module")
def recorded() -> list[tuple]:
    return [triple for name, page_size, window in RUNS for triple in steps_of(name, page_size, window)]


def partial(snapshot: TwoPoolSnapshot) -> TwoPoolSnapshot:
    """The same snapshot as a partial one shows it [OBS-4]."""
    allocator = snapshot.allocator
    held = {slot for r in snapshot.requests for slot in r.row} | {s for n in snapshot.nodes for s in n.full_value}
    mapping = PartialMapping(len(allocator.mapping), {s: allocator.mapping[s] for s in held
                                                      if 0 <= s < len(allocator.mapping)})
    pools = [replace(pool, free_pages=None, free_count=pool.free_count) for pool in (allocator.full, allocator.swa)]
    return replace(snapshot, allocator=replace(allocator, full=pools[0], swa=pools[1], mapping=mapping))


def mismatches(triples, certificates: Certificates, checks=CHECKS) -> list[str]:
    """Every check and step where a certificate said 'nothing to find' and the spec's
    predicate found something (the one way the two can differ: see incremental.py)."""
    wrong = []
    for index, (previous, step, now) in enumerate(triples):
        for check in checks:
            if check.compares_steps and previous is None:
                continue
            naive = violations([check], now, previous, step)
            if naive and certificates.certifies(check, now, previous, step):
                wrong.append(f"step {index} {step}: {check.clause} {check.name} certified, but {naive[0]}")
    return wrong


def test_on_the_same_runs_incremental_and_naive_checks_find_the_same_violations_at_the_same_step(recorded):
    assert not mismatches(recorded, Certificates())
    found = {v.clause for previous, step, now in recorded for v in violations(CHECKS, now, previous, step)}
    assert {"I2", "I6", "I8", "I9", "I14"} <= found  # the runs do break clauses


def test_so_on_partial_snapshots(recorded):
    assert not mismatches([(None if p is None else partial(p), s, partial(n)) for p, s, n in recorded[::3]],
                          Certificates())


def test_the_certificates_do_the_work_on_a_conforming_run():
    """A certificate that never certifies is never wrong, and never faster: on the reference
    each certifies nearly every step (I14 leaves a split locked node to the spec)."""
    triples = steps_of("reference", 4, 6, count=300)
    certificates, checks = Certificates(), [c for c in CHECKS if c.function in Certificates().by_function]
    for check in checks:
        applicable = [(p, s, n) for p, s, n in triples if p is not None or not check.compares_steps]
        certified = sum(certificates.certifies(check, n, p, s) for p, s, n in applicable)
        assert certified >= 0.9 * len(applicable), (check.clause, check.name, certified, len(applicable))


# -- perturbed snapshots -----------------------------------------------------------------

def perturb(snapshot: TwoPoolSnapshot, rng: random.Random) -> TwoPoolSnapshot:
    """One random change a buggy engine could show."""
    allocator, requests, nodes = snapshot.allocator, list(snapshot.requests), list(snapshot.nodes)
    kind = rng.choice(["row slot", "cursor", "cpl", "lock", "node value", "tombstone", "node start", "mapping",
                       "free page", "drop free page", "pending", "parent", "duplicate node", "last node"])

    def pick(values):
        return rng.randrange(len(values))
    if kind in ("row slot", "cursor", "cpl", "last node") and requests:
        i = pick(requests)
        r = requests[i]
        if kind == "row slot" and r.row:
            j, row = pick(r.row), list(r.row)
            row[j] = rng.choice([row[j] + 1, row[j] - 1, rng.choice(row), 0, -1])
            requests[i] = replace(r, row=tuple(row))
        elif kind == "cursor":
            requests[i] = replace(r, swa_evicted_seqlen=max(0, r.swa_evicted_seqlen + rng.choice([-4, -1, 1, 4])))
        elif kind == "cpl":
            requests[i] = replace(r, cache_protected_len=max(0, r.cache_protected_len + rng.choice([-4, -1, 1, 4])))
        elif nodes:
            requests[i] = replace(r, last_node=rng.choice(nodes).node_id)
    elif kind in ("lock", "node value", "tombstone", "node start", "parent", "duplicate node") and len(nodes) > 1:
        i = 1 + rng.randrange(len(nodes) - 1)
        n = nodes[i]
        if kind == "lock":
            n = replace(n, full_lock_ref=n.full_lock_ref + rng.choice([-1, 1]) if rng.random() < .5 else n.full_lock_ref,
                        swa_lock_ref=max(-1, n.swa_lock_ref + rng.choice([-1, 1])))
        elif kind == "node value" and n.full_value:
            j, value = pick(n.full_value), list(n.full_value)
            value[j] = rng.choice([value[j] + 1, value[j] - 1, rng.choice(value)])
            n = replace(n, full_value=tuple(value))
        elif kind == "tombstone":
            n = replace(n, swa_value=None if n.swa_value is not None else n.full_value)
        elif kind == "node start":
            n = replace(n, start=max(0, n.start + rng.choice([-4, -1, 1, 4])))
        elif kind == "parent":
            n = replace(n, parent=rng.choice(nodes).node_id)
        elif kind == "duplicate node":
            nodes.append(replace(n, key=n.key[::-1]))
        nodes[i] = n
    elif kind == "mapping" and isinstance(allocator.mapping, tuple):
        mapping = list(allocator.mapping)
        j = rng.randrange(len(mapping) - 1)
        mapping[j] = rng.choice([0, mapping[j] + 1, rng.choice(mapping), 1])
        allocator = replace(allocator, mapping=tuple(mapping))
    elif kind in ("free page", "drop free page", "pending"):
        pool = rng.choice(["full", "swa"])
        state = getattr(allocator, pool)
        free = list(state.free_pages or ())
        if kind == "free page":
            free.append(rng.randrange(0, state.num_pages + 2))
        elif free:
            page = free.pop(rng.randrange(len(free)))
            if kind == "pending":
                state = replace(state, pending_pages=(*state.pending_pages, page))
        state = replace(state, free_pages=tuple(free))
        allocator = replace(allocator, **{pool: state})
    return replace(snapshot, allocator=allocator, requests=tuple(requests), nodes=tuple(nodes))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_perturbed_snapshot_is_never_certified_where_the_spec_finds_a_violation(recorded, data):
    index = data.draw(st.integers(0, len(recorded) - 1))
    previous, step, now = recorded[index]
    rng = random.Random(data.draw(st.integers(0, 2 ** 32)))
    for _ in range(data.draw(st.integers(1, 3))):
        now = perturb(now, rng)
    if data.draw(st.booleans()):
        now = partial(now)
    assert not mismatches([(previous, step, now)], Certificates())


def seeded(function_clause: str, certificate) -> Certificates:
    certificates = Certificates()
    function = next(c.function for c in CHECKS if c.clause == function_clause and c.function in certificates.by_function)
    certificates.by_function = {**certificates.by_function, function: certificate}
    return certificates


def with_full_pool(snapshot: TwoPoolSnapshot, free_pages: tuple) -> TwoPoolSnapshot:
    full = replace(snapshot.allocator.full, free_pages=free_pages)
    return replace(snapshot, allocator=replace(snapshot.allocator, full=full))


def test_a_seeded_wrong_certificate_is_caught(recorded):
    """Two certificates seeded to be wrong: one that certifies conservation whatever the
    counts, and an ownership certificate that forgets the free list (a held page also
    free). The comparison catches both on snapshots with such a leak or double use;
    the real certificates pass the same snapshots."""
    leaks = [(p, s, with_full_pool(n, n.allocator.full.free_pages[1:]))
             for p, s, n in recorded[:60] if n.allocator.full.free_pages]
    always = seeded("I2", lambda now: True)
    assert mismatches(leaks, always) and not mismatches(leaks, Certificates())

    def forgets_the_free_list(now):
        held = always.held(now)
        return len(held.full_pages) == held.full_page_count and len(held.swa_pages) == held.swa_page_count
    forgetful = seeded("I4", forgets_the_free_list)
    doubles = [(p, s, with_full_pool(n, (*n.allocator.full.free_pages, n.requests[0].row[-1] // n.config.page_size)))
               for p, s, n in recorded[:60] if n.allocator.full.free_pages and n.requests and n.requests[0].row
               and n.requests[0].kv_allocated_len > n.requests[0].cache_protected_len]
    assert doubles and mismatches(doubles, forgetful) and not mismatches(doubles, Certificates())
