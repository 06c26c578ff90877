"""[LIFE-6, WIN-6] The sglang adapters' pd_admit drives SGLang 0.5.23's own PD-decode
pre-allocation (`DecodePreallocQueue._match_prefix_and_lock`, `_pre_alloc`,
`alloc_for_decode_prealloc`, with the decode-side radix cache on): the cursor, the row
and the SWA tail are what the spec says, and the request decodes and finishes with every
invariant checked after each step.

Needs SGLang installed (adapters/sglang/requirements.txt); KVSPEC_REQUIRE_SGLANG=1 turns
a missing SGLang into a failure instead of a skip."""

import importlib.util
import os
import subprocess

import pytest

if os.environ.get("KVSPEC_REQUIRE_SGLANG") != "1" and importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed: pip install --no-deps -r adapters/sglang/requirements.txt",
                allow_module_level=True)

from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.trace import TraceStep
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy, swa_tail_len

P, W = 4, 8
ADAPTERS = ["sglang", "sglang-python"]


def driver(adapter: str, size_full: int = 64 * P, size_swa: int = 32 * P, window: int = W,
           reads_tree: bool = True) -> EngineDriver:
    loaded = load_adapter(adapter)
    config = EngineConfig(page_size=P, window=window, size_full=size_full, size_swa=size_swa, max_requests=4,
                          policy=Policy("sglang-0.5.23", 1))
    observables = frozenset(loaded.observables) - (set() if reads_tree else {"tree"})
    return EngineDriver(loaded.make_engine(config), loaded.model, observables)


def view(d: EngineDriver, rid: str):
    return next(r for r in d.previous.requests if r.rid == rid)


def swa_slot(d: EngineDriver, full_slot: int) -> int:
    return d.previous.allocator.mapping[full_slot]


def step(d: EngineDriver, op: str, **args) -> None:
    d.apply(TraceStep(op, args))  # raises on any invariant violation or adapter crash


def assert_pd_admitted(d: EngineDriver, rid: str, prompt: list[int]) -> int:
    """The request's row, cursor and SWA tail after pd_admit; returns the cursor."""
    fill = len(prompt)
    tail = swa_tail_len(fill, W, P, prefix_sharing=True)
    request = view(d, rid)
    assert request.finished_prefill and request.decode_steps == 0
    assert request.kv_allocated_len == request.kv_committed_len == fill
    assert request.seq_len == fill + 1  # the prompt and the prefill server's first output
    assert len(request.row) == fill
    assert request.swa_evicted_seqlen == fill - tail
    cursor = request.swa_evicted_seqlen
    assert cursor % P == 0
    assert all(swa_slot(d, slot) != 0 for slot in request.row[cursor:]), "the tail has SWA KV"
    return cursor


def decode_and_finish(d: EngineDriver, rid: str, steps: int) -> None:
    for _ in range(steps):
        step(d, "decode", rid=rid, token=1)
    assert view(d, rid).decode_steps == steps
    step(d, "finish", rid=rid, trim=0)
    assert all(r.rid != rid for r in d.previous.requests)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_pd_request_without_a_cached_prefix_gets_full_kv_and_only_the_swa_tail(adapter):
    d = driver(adapter)
    prompt = [2, 0, 1] * 10
    full_free, swa_free = d.previous.allocator.full.free_count, d.previous.allocator.swa.free_count
    step(d, "pd_admit", rid="a", prompt=prompt, first_output=2)
    cursor = assert_pd_admitted(d, "a", prompt)
    assert cursor == 20  # WIN-6's example, with the decode-side prefix cache: floor_page(30 - 1 - 8)
    request = view(d, "a")
    assert all(swa_slot(d, slot) == 0 for slot in request.row[:cursor]), "the head has no SWA KV"
    assert full_free - d.previous.allocator.full.free_count == 8  # ceil(30 / 4) pages
    assert swa_free - d.previous.allocator.swa.free_count == 3  # ceil(10 / 4) pages
    decode_and_finish(d, "a", 2 * W)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_pd_request_matches_a_cached_prefix_clear_of_its_tail(adapter):
    """A prefilled, finished request leaves [0, 24) in the tree with a full window of
    live SWA; a PD request extending it matches up to the match cap fill - tail = 24 and
    reuses those slots, and its own KV starts there."""
    d = driver(adapter)
    stem = [0, 1, 2, 2, 1, 0] * 4
    step(d, "admit", rid="a", prompt=stem)
    step(d, "prefill_chunk", rid="a", chunk=len(stem), token=0)
    cached = view(d, "a").row
    step(d, "finish", rid="a", trim=0)
    prompt = stem + [1, 1, 1, 2, 2, 2, 0, 0, 1]
    fill = len(prompt)
    cap = fill - swa_tail_len(fill, W, P, prefix_sharing=True)
    assert cap == 24
    step(d, "pd_admit", rid="b", prompt=prompt, first_output=1)
    cursor = assert_pd_admitted(d, "b", prompt)
    row = view(d, "b").row
    assert row[:cap] == cached[:cap], "the cached prefix is matched up to the cap"
    assert not set(row[cap:]) & set(cached), "beyond the cap the KV is the request's own"
    assert cursor == cap
    decode_and_finish(d, "b", 2 * W)
    # and a PD request whose match would reach into its tail is capped below it
    step(d, "pd_admit", rid="c", prompt=stem + [2], first_output=0)
    cursor = assert_pd_admitted(d, "c", stem + [2])
    assert cursor == 16 and view(d, "c").row[:cursor] == cached[:cursor]
    decode_and_finish(d, "c", 3)


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("short", ["full", "swa"])
def test_a_pd_request_that_does_not_fit_is_out_of_memory_and_changes_nothing(adapter, short):
    """SGLang's own budget refuses a pre-allocation that does not fit, before allocating
    (its allocation asserts it cannot fail): the request is absent, nothing changed (I15).
    A first request holds 5 full pages and 3 SWA pages; the second needs 6 full pages
    with 5 free, or 3 SWA pages with 1 free."""
    size_full, size_swa, prompt = (10 * P, 8 * P, [2] * 24) if short == "full" else (64 * P, 4 * P, [2] * 12)
    d = driver(adapter, size_full=size_full, size_swa=size_swa)
    step(d, "pd_admit", rid="a", prompt=[1] * 20, first_output=0)
    assert_pd_admitted(d, "a", [1] * 20)
    before = d.previous
    d.apply(TraceStep("pd_admit", {"rid": "b", "prompt": prompt, "first_output": 0}))
    assert tuple(r.rid for r in d.previous.requests) == ("a",)
    assert d.previous.allocator == before.allocator
    step(d, "abort", rid="a")
    step(d, "pd_admit", rid="b", prompt=prompt, first_output=0)  # now it fits
    assert_pd_admitted(d, "b", prompt)
    decode_and_finish(d, "b", 3)


SHORT_LEAF = (6, [2, 0, 1] * 5)
"""W = 6 and a 15-token prompt: SGLang's admission checkpoint leaves a leaf short of a window."""


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("window, prompt, cursor, matched", [(*SHORT_LEAF, 8, 0), (8, [2, 0, 1] * 10, 20, 28)])
def test_the_admission_checkpoint_is_matchable_only_when_the_tail_covers_a_window(adapter, window, prompt, cursor,
                                                                                  matched):
    """SGL-11 (docs/engines/sglang-findings.md, pd-tail-not-rounded), as 0.5.23 behaves on
    both trees: the tail starts at floor_page(fill - 1 - max(W, P)) and the admission
    checkpoints [0, floor_page(fill)). At W = 8 (a page multiple) the leaf keeps 8 live SWA
    tokens and the same prompt, admitted again after the first finished, matches all 28.
    At W = 6, a 15-token prompt: cursor 8, checkpoint [0, 12), the leaf [8, 12) keeps 4 live
    tokens below its tombstoned head, and the same prompt matches nothing (WIN-7). The
    driver here reads no tree, so that I10 (next test) does not stop the behaviour shown.
    A release that rounds the tail fails this test."""
    d = driver(adapter, window=window, reads_tree=False)
    step(d, "pd_admit", rid="a", prompt=prompt, first_output=2)
    request = view(d, "a")
    assert request.swa_evicted_seqlen == cursor
    assert request.cache_protected_len == len(prompt) // P * P  # the admission's checkpoint
    step(d, "finish", rid="a", trim=0)
    step(d, "admit", rid="b", prompt=prompt + [2, 1])
    assert view(d, "b").cache_protected_len == matched


def test_the_short_admission_checkpoint_breaks_i10_on_the_python_tree():
    """SGL-11: where the tree can be seen, I10 flags the admission's leaf at once."""
    window, prompt = SHORT_LEAF
    with pytest.raises(InvariantViolation) as found:
        step(driver("sglang-python", window=window), "pd_admit", rid="a", prompt=prompt, first_output=2)
    assert "[I10] request a: new leaf with live SWA [8, 12), fewer than min(W, E) = 6" in str(found.value)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_quick_check_with_pd_decode_passes(adapter, tmp_path):
    result = subprocess.run(["kvspec", "check", "--adapter", adapter, "--profile", "quick", "--seed", "3",
                             "--run", "engine P=4 W=8 I=1", "--traces", str(tmp_path / "traces")],
                            check=False, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 ok" in result.stdout
