"""What kvspec relies on in TokenSpeed's scheduler (tokenspeed-scheduler 0.1.42), measured.

One test per fact written down in docs/engines/tokenspeed.md; each drives the real compiled
scheduler (module `tokenspeed_scheduler`, CPU only). Skipped when the package is not
installed (`pip install --no-deps -r adapters/tokenspeed/requirements.txt`), unless
KVSPEC_REQUIRE_TOKENSPEED=1, which turns a missing package into a failure instead of a skip.
"""

import importlib.util
import os

import pytest

if (os.environ.get("KVSPEC_REQUIRE_TOKENSPEED") != "1"
        and importlib.util.find_spec("tokenspeed_scheduler") is None):
    pytest.skip("tokenspeed-scheduler is not installed: "
                "pip install --no-deps -r adapters/tokenspeed/requirements.txt",
                allow_module_level=True)

import tokenspeed_scheduler as ts  # noqa: E402

# chapter 08's window arithmetic: TokenSpeed's sliding group keeps to it (section 4 of the page)
from kvspec.spec.block_pool import held_swa_blocks, released_swa_blocks, swa_block_bound  # noqa: E402

FULL, SWA, STATE = ts.AttnKind.Full, ts.AttnKind.SlidingWindow, ts.AttnKind.State
PAGE = 4
WINDOW = 8          # TokenSpeed's sliding_window_tokens; the spec's window is WINDOW - 1
PROMPT = list(range(100, 140))


def cdiv(a, b):
    return -(-a // b)


def leading_nulls(table):
    n = 0
    while n < len(table) and table[n] == 0:
        n += 1
    return n


def config(groups=None, pages=64, page=PAGE, window=WINDOW, mst=64, granularity=None,
           snapshot=1, **fields):
    if groups is None:
        groups = [("full", FULL), ("swa", SWA)]
    built = []
    for gid, kind in groups:
        if kind == SWA:
            built.append(ts.CacheGroupConfig(gid, page, pages, kind, window))
        elif kind == STATE:
            built.append(ts.CacheGroupConfig(gid, 0, pages, kind))
        else:
            built.append(ts.CacheGroupConfig(gid, page, pages, kind))
    c = ts.SchedulerConfig()
    c.cache_groups = built
    c.num_device_pages = pages
    c.max_scheduled_tokens = mst
    c.max_batch_size = 8
    c.prefix_granularity = page if granularity is None else granularity
    c.num_snapshot_pages = snapshot
    for name, value in fields.items():
        setattr(c, name, value)
    return c


def scheduler(**kw):
    return ts.Scheduler(config(**kw))


def spec(rid, tokens, max_new=4):
    r = ts.RequestSpec()
    r.request_id = rid
    r.tokens = list(tokens)
    r.max_new_tokens = max_new
    return r


def _ev(cls, rid, tokens=None):
    e = cls()
    e.request_id = rid
    if tokens is not None:
        e.tokens = list(tokens)
    return e


def extend(rid, tokens):
    return _ev(ts.ForwardEvent.ExtendResult, rid, tokens)


def finish(rid):
    return _ev(ts.ForwardEvent.Finish, rid)


def abort(rid):
    return _ev(ts.ForwardEvent.Abort, rid)


def event(*events):
    x = ts.ExecutionEvent()
    for e in events:
        x.add_event(e)
    return x


def rows(plan):
    """{request id: (input length, prefix length or None, {group: table})} of a plan."""
    out = {}
    for f in plan.forward:
        prefix = list(f.extend_prefix_lens)
        for i, rid in enumerate(f.request_ids):
            out[rid] = (list(f.input_lengths)[i], prefix[i] if i < len(prefix) else None,
                        {g: v[i] for g, v in f.block_tables.items()})
    return out


def step(s, token=1000, skip_intermediate=False, extra=()):
    """Plan once and report every forwarded request back: an empty ExtendResult for an
    intermediate prefill chunk, one token otherwise."""
    plan = s.next_execution_plan()
    events = list(extra)
    for f in plan.forward:
        prefix, inputs, total = (list(f.extend_prefix_lens), list(f.input_lengths),
                                 list(f.prefill_lengths))
        for i, rid in enumerate(f.request_ids):
            if i < f.num_extends() and prefix[i] + inputs[i] < total[i]:
                if not skip_intermediate:
                    events.append(extend(rid, []))
            else:
                events.append(extend(rid, [token]))
    if events:
        s.advance(event(*events))
    return plan


def run_until_decoding(s, rid="A", **kw):
    while True:
        plan = step(s, **kw)
        if rid in rows(plan) and rows(plan)[rid][1] is None:
            return plan


def stored(s):
    return [e for e in s.drain_kv_events() if e.kind == "BlockStored"]


# 1. Configuration


@pytest.mark.parametrize("field, value, message", [
    ("prefix_granularity", 0, "prefix_granularity must be > 0"),
    ("max_scheduled_tokens", 0, "max_scheduled_tokens must be > 0"),
    ("num_device_pages", 1, "must contain a null page and usable capacity"),
    ("num_snapshot_pages", 0, "must include the null page"),
    ("cache_groups", [], "at least one cache group is required"),
    ("prefix_granularity", 6, "block_granularity must divide the scheduler prefix_granularity"),
])
def test_required_config_fields(field, value, message):
    c = config()
    setattr(c, field, value)
    with pytest.raises(ValueError, match=message):
        ts.Scheduler(c)


def test_group_validation_errors():
    bad = [
        ([ts.CacheGroupConfig("full", 4, 64, FULL), ts.CacheGroupConfig("swa", 4, 64, SWA)],
         "sliding_window_tokens must be > 0"),
        ([ts.CacheGroupConfig("full", 4, 64, FULL, 8)],
         "only a sliding-window group carries sliding_window_tokens"),
        ([ts.CacheGroupConfig("full", 4, 64, FULL), ts.CacheGroupConfig("state", 4, 8, STATE)],
         "block_granularity must be 0"),
    ]
    for groups, message in bad:
        c = config()
        c.cache_groups = groups
        with pytest.raises(ValueError, match=message):
            ts.Scheduler(c)


def test_snapshot_pool_requires_max_retracted_requests():
    with pytest.raises(ValueError, match="requires max_retracted_requests > 0"):
        scheduler(snapshot=16)
    with pytest.raises(ValueError, match="requires a snapshot pool"):
        scheduler(debug_force_retraction_interval=3)
    scheduler(snapshot=16, max_retracted_requests=1)


def test_full_state_and_full_swa_state_build_and_state_table_has_two_slots():
    for groups in ([("full", FULL), ("state", STATE)],
                   [("full", FULL), ("swa", SWA), ("state", STATE)]):
        s = scheduler(groups=groups)
        s.submit_requests([spec("A", PROMPT)])
        (_, _, tables), = rows(s.next_execution_plan()).values()
        assert len(tables["state"]) == 2 and 0 not in tables["state"]


def test_duplicate_group_ids_are_accepted_silently():
    c = config()
    c.cache_groups = [ts.CacheGroupConfig("a", 4, 64, FULL),
                      ts.CacheGroupConfig("a", 4, 64, SWA, 8)]
    s = ts.Scheduler(c)
    s.submit_requests([spec("A", PROMPT)])
    (_, _, tables), = rows(s.next_execution_plan()).values()
    assert list(tables) == ["a"]


def test_group_total_pages_is_only_echoed():
    c = config()
    c.cache_groups = [ts.CacheGroupConfig("full", 4, 100, FULL),
                      ts.CacheGroupConfig("swa", 4, 16, SWA, 8)]
    s = ts.Scheduler(c)
    assert s.cache_group_total_pages("full") == 100
    assert s.cache_group_total_pages("swa") == 16
    assert s.cache_group_available_pages("swa") == 63 == s.available_lcm_blocks()


# 2. Lifecycle


def test_submit_rejects_prompt_plus_max_new_tokens_above_capacity():
    s = scheduler()
    limit = s.max_single_request_tokens()
    s.submit_requests([spec("ok", range(limit - 4), max_new=4)])
    with pytest.raises(ValueError, match="exceeds cache capacity"):
        s.submit_requests([spec("big", range(limit - 3), max_new=4)])
    with pytest.raises(ValueError, match="duplicate request id"):
        s.submit_requests([spec("ok", range(8))])
    with pytest.raises(ValueError, match="must be non-empty"):
        s.submit_requests([spec("empty", [])])


def test_intermediate_chunk_result_must_carry_no_tokens():
    s = scheduler(mst=16)
    s.submit_requests([spec("A", PROMPT)])
    s.next_execution_plan()
    with pytest.raises(RuntimeError, match="intermediate prefill chunk produces no tokens"):
        s.advance(event(extend("A", [1])))


def test_skipping_intermediate_chunk_results_leaks_pages():
    for skip, leaked in ((False, False), (True, True)):
        s = scheduler(mst=16)
        s.submit_requests([spec("A", PROMPT)])
        run_until_decoding(s, skip_intermediate=skip)
        s.advance(event(finish("A")))
        assert (s.active_lcm_blocks() > 0) is leaked
        assert s.clear_cache() is (not leaked)


def test_max_new_tokens_is_not_enforced():
    s = scheduler()
    s.submit_requests([spec("A", PROMPT, max_new=2)])
    for k in range(6):
        step(s, token=1000 + k)
    assert s.decoding_size() == 1 and s.request_token_size("A") == 46
    s.advance(event(finish("A")))
    assert s.decoding_size() == 0 and s.request_token_size("A") == 46
    s.next_execution_plan()               # the record goes at the next plan
    assert s.request_token_size("A") == -1


def test_finish_only_from_decoding_and_unknown_ids_are_ignored():
    s = scheduler(mst=16)
    s.submit_requests([spec("A", PROMPT)])
    with pytest.raises(RuntimeError, match="FSM transition invalid.*Submitted"):
        s.advance(event(finish("A")))
    s.next_execution_plan()
    with pytest.raises(RuntimeError, match="FSM transition invalid.*Prefilling"):
        s.advance(event(finish("A")))
    s.advance(event(finish("nobody"), abort("nobody"), extend("nobody", [1])))


def test_abort_mid_prefill_frees_everything_and_caches_nothing():
    s = scheduler(mst=16, enable_kv_cache_events=True)
    s.submit_requests([spec("A", PROMPT)])
    assert s.can_abort_before_admission("A")
    step(s)
    assert not s.can_abort_before_admission("A")
    s.advance(event(abort("A")))
    assert s.empty_lcm_blocks() == s.available_lcm_blocks() == 63
    assert s.active_lcm_blocks() == 0


def test_abort_in_decode_keeps_pages_cached_like_finish():
    for end in (abort, finish):
        s = scheduler()
        s.submit_requests([spec("A", PROMPT)])
        run_until_decoding(s)
        s.advance(event(end("A")))
        assert s.active_lcm_blocks() == 0 and s.available_lcm_blocks() == 63
        assert s.empty_lcm_blocks() < 63


def test_prefill_and_decode_are_separate_plans_by_default():
    s = scheduler()
    s.submit_requests([spec("A", PROMPT)])
    run_until_decoding(s)
    s.submit_requests([spec("B", range(500, 520))])
    plan = step(s)
    assert list(rows(plan)) == ["B"]
    assert sorted(rows(step(s))) == ["A", "B"]


# 3. Pages


def test_one_shared_pool_distinct_page_ids_page_zero_null():
    s = scheduler()
    assert s.cache_group_available_pages("full") == s.cache_group_available_pages("swa") == 63
    s.submit_requests([spec("A", PROMPT, max_new=4)])
    (_, _, t), = rows(s.next_execution_plan()).values()
    used = t["full"] + t["swa"]
    assert len(set(used)) == len(used) and 0 not in used and max(used) == 22
    for g in ("full", "swa"):
        assert s.cache_group_available_pages(g) == 63 - 22
    assert s.active_lcm_blocks() == 22


def test_cache_blocks_per_lcm_block_scales_group_pages():
    c = config()
    c.cache_groups = [ts.CacheGroupConfig("full", 4, 64, FULL, None, 2),
                      ts.CacheGroupConfig("swa", 4, 64, SWA, 8, 1)]
    s = ts.Scheduler(c)
    assert s.cache_group_available_pages("full") == 126
    assert s.cache_group_available_pages("swa") == 63 == s.available_lcm_blocks()


@pytest.mark.parametrize("page", [1, 4, 8])
@pytest.mark.parametrize("length", [15, 16, 17, 40])
def test_admission_sizes_full_to_prompt_plus_max_new_and_swa_to_chunk_plus_one(page, length):
    for mst in (8, 64):
        s = scheduler(page=page, granularity=16, pages=256, mst=mst)
        s.submit_requests([spec("A", range(length), max_new=4)])
        (_, _, t), = rows(s.next_execution_plan()).values()
        assert len(t["full"]) == cdiv(length + 4, page)
        chunk = min(mst, length)
        assert len(t["swa"]) == cdiv(chunk + (1 if chunk == length else 0), page)


def test_available_pages_count_only_empty_pages():
    s = scheduler()
    s.submit_requests([spec("A", PROMPT)])
    run_until_decoding(s)
    s.advance(event(finish("A")))
    assert s.available_lcm_blocks() == 63 and s.active_lcm_blocks() == 0
    assert s.cache_group_available_pages("full") == s.empty_lcm_blocks() < 63
    assert s.clear_cache()
    assert s.cache_group_available_pages("full") == s.empty_lcm_blocks() == 63


def test_batch_tables_are_padded_with_minus_one():
    s = scheduler()
    s.submit_requests([spec("A", PROMPT)])
    run_until_decoding(s)
    s.submit_requests([spec("B", PROMPT + list(range(200, 208)))])
    step(s)
    t = rows(step(s))["A"][2]
    assert t["full"][-2:] == [-1, -1] and t["swa"][-2:] == [-1, -1]


# 4. The sliding window


@pytest.mark.parametrize("window", [1, 3, 8, 9])
@pytest.mark.parametrize("mst", [8, 16, 64])
def test_window_release_is_the_spec_rule_with_window_minus_one(window, mst):
    """Chapter 08's window release, exact, with the spec's W = sliding_window_tokens - 1, at
    every plan; the final prefill chunk also allocates the first decode token's slot."""
    length = 40
    s = scheduler(window=window, mst=mst, pages=256)
    s.submit_requests([spec("A", range(length), max_new=4)])
    computed = 0
    for _ in range(14):
        plan = s.next_execution_plan()
        inputs, _, t = rows(plan)["A"]
        last_chunk = plan.forward[0].num_extends() > 0 and computed + inputs == length
        slots = computed + inputs + (1 if last_chunk else 0)
        table = tuple(t["swa"])
        nulls = leading_nulls(table)
        assert 0 not in table[nulls:]
        assert nulls == released_swa_blocks(computed, window - 1, PAGE)
        assert len(table) == cdiv(slots, PAGE)
        assert len(table) - nulls == held_swa_blocks(computed, slots, window - 1, PAGE)
        assert len(table) - nulls <= swa_block_bound(window - 1, slots - computed, PAGE)
        assert len(t["full"]) == cdiv(max(length + 4, slots), PAGE)
        computed += inputs
        intermediate = plan.forward[0].num_extends() > 0 and computed < length
        s.advance(event(extend("A", [] if intermediate else [7])))


# 5. Prefix cache


def test_hit_while_first_request_runs_shares_pages():
    s = scheduler()
    s.submit_requests([spec("A", PROMPT)])
    a = rows(run_until_decoding(s))["A"][2]
    s.submit_requests([spec("B", PROMPT + list(range(200, 208)))])
    _, hit, b = rows(step(s))["B"]
    assert hit == 40
    assert b["full"][:10] == a["full"][:10]
    assert b["swa"][:10] == a["swa"][:10] and b["swa"][:8] == [0] * 8


def _hit(prefix_len, groups=None, mst=64, window=WINDOW):
    s = scheduler(groups=groups, mst=mst, window=window)
    s.submit_requests([spec("A", PROMPT)])
    run_until_decoding(s)
    s.advance(event(finish("A")))
    s.submit_requests([spec("B", PROMPT[:prefix_len] + [7] * 8)])
    return rows(s.next_execution_plan())["B"][1]


def test_hybrid_hits_only_where_the_window_was_cached():
    assert [_hit(k) for k in (4, 16, 32, 36, 40)] == [0, 0, 0, 0, 40]
    assert [_hit(k, mst=16) for k in (12, 16, 20, 32, 36, 40)] == [0, 16, 16, 32, 36, 40]
    assert [_hit(k, window=1) for k in (4, 16, 36)] == [4, 16, 36]


def test_full_only_hits_any_page_below_the_last_token():
    full = [("full", FULL)]
    assert [_hit(k, groups=full) for k in (3, 4, 30, 39, 40)] == [0, 4, 28, 36, 40]


def test_identical_resubmission_gets_no_hit_in_hybrid():
    s = scheduler()
    s.submit_requests([spec("A", PROMPT)])
    run_until_decoding(s)
    s.advance(event(finish("A")))
    s.submit_requests([spec("B", PROMPT)])
    assert rows(s.next_execution_plan())["B"][1] == 0


def test_finish_caches_a_partial_tail_and_a_hit_on_it_is_copied():
    s = scheduler()
    prompt = list(range(100, 120))
    s.submit_requests([spec("A", prompt, max_new=16)])
    for k in range(3):
        s.next_execution_plan()
        s.advance(event(extend("A", [1000 + k])))
    s.advance(event(finish("A")))
    assert s.tail_entries() == 1
    s.submit_requests([spec("B", prompt + [1000, 1001, 1002] + [7] * 8)])
    plan = s.next_execution_plan()
    _, hit, t = rows(plan)["B"]
    assert hit == 22                      # KV exists for 22 of the 23 tokens, not page-aligned
    (src, dst), = plan.pages_to_copy["full"]
    assert t["full"][5] == dst and src not in t["full"]


def test_prefill_ending_mid_page_swaps_the_running_tail_page():
    s = scheduler(groups=[("full", FULL)], enable_kv_cache_events=True)
    s.submit_requests([spec("A", range(200, 230), max_new=8)])
    first = rows(step(s))["A"][2]["full"]
    plan = step(s)
    second = rows(plan)["A"][2]["full"]
    (src, dst), = plan.pages_to_copy["full"]
    assert first[7] == src and second[7] == dst and first[:7] == second[:7]
    tails = [len(e.token_ids) for e in stored(s)]
    assert tails[-1] == 2                 # the partial page, 2 of 4 tokens


# 5b. KV events


def test_kv_events_publish_only_window_covered_blocks_in_hybrid():
    s = scheduler(enable_kv_cache_events=True)
    s.submit_requests([spec("A", PROMPT)])
    step(s)
    assert stored(s) == []                # inserted on the next plan, not on advance
    step(s)
    events = stored(s)
    assert [e.token_ids[0] for e in events] == [132, 136]
    assert all(e.block_size == 4 for e in events)
    assert events[1].parent_block_hash == events[0].block_hashes[0]
    assert events[0].parent_block_hash is not None   # its parent was never published


def test_kv_events_full_only_publish_every_block():
    s = scheduler(groups=[("full", FULL)], enable_kv_cache_events=True)
    s.submit_requests([spec("A", PROMPT)])
    step(s)
    step(s)
    events = stored(s)
    assert [e.token_ids[0] for e in events] == list(range(100, 140, 4))
    assert events[0].parent_block_hash is None


def test_eviction_and_clear_cache_emit_block_removed():
    s = scheduler(pages=24, enable_kv_cache_events=True)
    s.submit_requests([spec("A", range(100, 120))])
    run_until_decoding(s)
    step(s)
    s.advance(event(finish("A")))
    kept = {h for e in stored(s) for h in e.block_hashes}
    s.submit_requests([spec("B", range(500, 536), max_new=1)])
    step(s)
    removed = {h for e in s.drain_kv_events() if e.kind == "BlockRemoved" for h in e.block_hashes}
    assert kept and kept <= removed
    step(s)                               # B's prefill is now in the cache, pinned by B
    assert not s.can_clear_cache() and not s.clear_cache()
    s.advance(event(finish("B")))
    b_blocks = {h for e in stored(s) for h in e.block_hashes}
    assert s.can_clear_cache() and s.clear_cache()
    assert {h for e in s.drain_kv_events() for h in e.block_hashes} == b_blocks
    assert s.empty_lcm_blocks() == 23


# 2b. Retraction


def _pressure(snapshot, retracted):
    s = scheduler(pages=24, snapshot=snapshot, max_retracted_requests=retracted)
    s.submit_requests([spec(f"R{i}", [i * 1000 + j for j in range(20)], max_new=1)
                       for i in range(2)])
    for k in range(22):
        plan = step(s, token=5000 + k)
        if plan.aborts or plan.cache:
            return s, plan
    raise AssertionError("no retraction")


def test_pressure_without_snapshot_pool_aborts_image_does_not_fit():
    s, plan = _pressure(1, 0)
    (a,), = [list(plan.aborts)]
    assert a.reason == ts.AbortReason.ImageDoesNotFit
    assert s.decoding_size() == 1 and s.retracted_size() == 0


def test_pressure_with_snapshot_pool_retracts_and_restores():
    s, plan = _pressure(64, 2)
    (op,) = list(plan.cache)
    assert type(op).__name__ == "SnapshotOp" and s.retracted_size() == 1
    assert s.snapshot_pool_free_blocks() < 63
    rid = op.request_ids[0]
    done = ts.Cache.SnapshotDoneEvent()
    done.op_id = op.op_ids[0]
    other = "R1" if rid == "R0" else "R0"
    s.advance(event(done, finish(other)))
    restore = s.next_execution_plan()
    assert [type(c).__name__ for c in restore.cache] == ["RestoreOp"]
    back = ts.Cache.RestoreDoneEvent()
    back.op_id = restore.cache[0].op_ids[0]
    s.advance(event(back))
    assert rid in rows(s.next_execution_plan())
    assert s.retracted_size() == 0 and s.snapshot_pool_free_blocks() == 63


def test_forced_retraction_interval_and_unacknowledged_snapshots():
    for ack in (True, False):
        s = scheduler(snapshot=64, max_retracted_requests=2, debug_force_retraction_interval=3)
        s.submit_requests([spec(f"R{i}", [i * 1000 + j for j in range(20)], max_new=8)
                           for i in range(2)])
        kinds = []
        for k in range(8):
            plan = s.next_execution_plan()
            events = [extend(r, [5000 + k]) for f in plan.forward for r in f.request_ids]
            for op in plan.cache:
                kinds.append((k, type(op).__name__))
                if ack:
                    e = (ts.Cache.SnapshotDoneEvent() if type(op).__name__ == "SnapshotOp"
                         else ts.Cache.RestoreDoneEvent())
                    e.op_id = op.op_ids[0]
                    events.append(e)
            if events:
                s.advance(event(*events))
        if ack:
            assert kinds[:4] == [(2, "SnapshotOp"), (3, "RestoreOp"),
                                 (5, "SnapshotOp"), (6, "RestoreOp")]
        else:
            assert kinds == [(2, "SnapshotOp"), (5, "SnapshotOp")]
            assert s.retracted_size() == 2 and s.decoding_size() == 0


def test_decode_without_a_free_page_is_left_out_of_the_plan():
    s = scheduler(pages=24, snapshot=1)
    s.submit_requests([spec(f"R{i}", [i * 1000 + j for j in range(20)], max_new=1)
                       for i in range(2)])
    sizes = []
    for k in range(20):
        plan = step(s, token=5000 + k)
        sizes.append(len(rows(plan)))
    assert s.decoding_size() == 2 and 1 in sizes[3:]
