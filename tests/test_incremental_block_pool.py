"""Incremental checking of chapter 08 (conformance/harness/incremental_block_pool.py): on the
same runs of real vLLM 0.33.0, in both retention modes and patched with each of its seeded
bugs, and on their views perturbed at random, a block-pool certificate never says "nothing
to find" where the spec's predicate finds something; a certificate seeded to be wrong is
caught by the same comparison.

Needs vLLM installed (adapters/vllm/requirements.txt); CI sets KVSPEC_REQUIRE_VLLM=1."""

import importlib.util
import os
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

import test_incremental  # noqa: E402 - the same recorded workload runs and comparison
from test_incremental import steps_of  # noqa: E402

from kvspec.conformance.harness.checks import Checks  # noqa: E402
from kvspec.conformance.harness.incremental import Certificates  # noqa: E402
from kvspec.spec.block_pool import NULL_BLOCK, Block, BlockPoolSnapshot  # noqa: E402
from kvspec.spec.registry import violations  # noqa: E402

CHECKS = Checks(BlockPoolSnapshot, {"rows", "block_pool", "kv_events"}, incremental=False).run
RUNS = [("vllm", 1, 6), ("vllm", 4, 6), ("vllm-dense", 2, 5), ("vllm", 16, 24),
        ("vllm-mutant-hit-left-in-free-queue", 2, 5), ("vllm-mutant-hit-without-reference", 2, 5),
        ("vllm-mutant-window-release-without-free", 2, 5), ("vllm-mutant-null-block-freed", 2, 5),
        ("vllm-mutant-evicted-key-stays-mapped", 4, 6), ("vllm-mutant-no-removed-event", 4, 6),
        ("vllm-mutant-free-forgets-a-group", 4, 6), ("vllm-mutant-table-one-block-short", 4, 6),
        ("vllm-mutant-no-window-release", 2, 5)]


@pytest.fixture(scope="module")
def recorded() -> list[tuple]:
    return [triple for name, page_size, window in RUNS for triple in steps_of(name, page_size, window, count=150)]


def mismatches(triples, certificates: Certificates) -> list[str]:
    return test_incremental.mismatches(triples, certificates, CHECKS)


def test_on_the_same_runs_incremental_and_naive_checks_find_the_same_violations(recorded):
    assert not mismatches(recorded, Certificates())
    found = {v.clause for previous, step, now in recorded for v in violations(CHECKS, now, previous, step)}
    assert {"BLOCK-1", "BLOCK-2", "BLOCK-7", "BLOCK-8"} <= found, found  # the mutants break them


def test_the_certificates_do_the_work_on_a_conforming_run():
    triples = steps_of("vllm", 2, 5, count=200)
    certificates = Certificates()
    for check in (c for c in CHECKS if c.function in certificates.by_function):
        certified = sum(certificates.certifies(check, n, p, s) for p, s, n in triples)
        assert certified == len(triples), (check.clause, check.name, certified, len(triples))


def perturb(snapshot: BlockPoolSnapshot, rng: random.Random) -> BlockPoolSnapshot:
    """One random change a buggy block pool could show."""
    view = snapshot.block_pool
    blocks, queue, cache, requests = list(view.blocks), list(view.free_queue), list(view.cache_map), list(view.requests)
    kind = rng.choice(["ref", "queue add", "queue drop", "hash", "unhash", "entry drop", "entry add", "replayed",
                       "table entry", "table null", "block id"])
    i = rng.randrange(len(blocks))
    if kind == "ref":
        blocks[i] = replace(blocks[i], ref_cnt=blocks[i].ref_cnt + rng.choice([-1, 1]))
    elif kind == "queue add":
        queue.append(rng.choice([i, NULL_BLOCK, len(blocks)] + queue[:1]))
    elif kind == "queue drop" and queue:
        queue.pop(rng.randrange(len(queue)))
    elif kind == "hash" and cache:
        h, g, _ = rng.choice(cache)
        blocks[i] = replace(blocks[i], block_hash=(h, rng.choice([g, 1 - g])))
    elif kind == "unhash":
        blocks[i] = replace(blocks[i], block_hash=None)
    elif kind == "entry drop" and cache:
        cache.pop(rng.randrange(len(cache)))
    elif kind == "entry add":
        cache.append((rng.choice(cache)[0] if cache else 7, rng.choice([0, 1]), rng.choice([i, NULL_BLOCK])))
    elif kind == "replayed" and view.replayed_map:
        replayed = list(view.replayed_map)
        j = rng.randrange(len(replayed))
        h, g, count = replayed[j]
        replayed[j] = (h, g, count + rng.choice([-1, 1]))
        view = replace(view, replayed_map=tuple(replayed))
    elif kind in ("table entry", "table null") and requests:
        j = rng.randrange(len(requests))
        tables = [list(t) for t in requests[j].tables]
        group = rng.randrange(len(tables))
        if tables[group]:
            k = rng.randrange(len(tables[group]))
            tables[group][k] = NULL_BLOCK if kind == "table null" else rng.choice([i, len(blocks), tables[group][k] + 1])
            requests[j] = replace(requests[j], tables=tuple(map(tuple, tables)))
    elif kind == "block id":
        blocks[i] = Block(blocks[i].block_id + 1, blocks[i].ref_cnt, blocks[i].block_hash)
    view = replace(view, blocks=tuple(blocks), free_queue=tuple(queue), cache_map=tuple(cache), requests=tuple(requests))
    return replace(snapshot, block_pool=view)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_perturbed_view_is_never_certified_where_the_spec_finds_a_violation(recorded, data):
    previous, step, now = recorded[data.draw(st.integers(0, len(recorded) - 1))]
    rng = random.Random(data.draw(st.integers(0, 2 ** 32)))
    for _ in range(data.draw(st.integers(1, 3))):
        now = perturb(now, rng)
    assert not mismatches([(previous, step, now)], Certificates())


def test_a_seeded_wrong_certificate_is_caught(recorded):
    """A reference-count certificate that forgets blocks held by no table (it compares only
    the blocks the tables name) is caught where a block keeps a count nobody holds."""
    certificates = Certificates()
    function = next(c.function for c in CHECKS if c.clause == "BLOCK-2")

    def forgetful(now):
        view = now.block_pool
        counted = {}
        for request in view.requests:
            for table in request.tables:
                for block in table:
                    if block != NULL_BLOCK:
                        counted[block] = counted.get(block, 0) + 1
        return all(view.blocks[block].ref_cnt == count for block, count in counted.items())
    certificates.by_function = {**certificates.by_function, function: forgetful}
    leaked = []
    for previous, step, now in recorded[:80]:
        view = now.block_pool
        held = {b for r in view.requests for t in r.tables for b in t}
        spare = next((b for b in view.blocks[1:] if b.block_id not in held), None)
        if spare is not None:
            blocks = tuple(replace(b, ref_cnt=b.ref_cnt + 1) if b is spare else b for b in view.blocks)
            leaked.append((previous, step, replace(now, block_pool=replace(view, blocks=blocks))))
    assert leaked and mismatches(leaked, certificates) and not mismatches(leaked, Certificates())
