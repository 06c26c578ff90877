"""The scenarios of tests/test_tokenspeed_builds.py, run one per process (one process
imports one `tokenspeed_scheduler`):

    python tests/tokenspeed_scenarios.py SCENARIO --build pinned|seeded

prints, as JSON, what the scenario observed through TokenSpeed's raw API (what an adapter
sees: the plans' rows and tables, the pool's counts, aborts) and which module it drove.
`--build seeded` activates kvspec's patched build first; KVSPEC_TOKENSPEED_BUG, in the
environment, chooses the seeded bug (none when unset). Setup as in
tests/test_tokenspeed_semantics.py: groups `full` and `swa`, 4-token pages,
sliding_window_tokens 8 (the spec's W = 7), 64 device pages, prompt of 40 tokens.
"""

import argparse
import json
import sys

PAGE, WINDOW_TOKENS = 4, 8
W = WINDOW_TOKENS - 1
PROMPT = list(range(100, 140))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--build", choices=("pinned", "seeded"), required=True)
    args = parser.parse_args()
    if args.build == "seeded":
        from kvspec.adapters.tokenspeed import builds
        builds.activate()
    global ts
    import tokenspeed_scheduler as ts
    observed = SCENARIOS[args.scenario]()
    active = getattr(ts._ext, "kvspec_active_bug", None)
    print(json.dumps({"module": ts.__file__, "active_bug": active() if active else None, **observed}))


# -- driving the scheduler ------------------------------------------------------------------------


def scheduler(pages=64, mst=64, snapshot=1, **fields):
    config = ts.SchedulerConfig()
    config.cache_groups = [ts.CacheGroupConfig("full", PAGE, pages, ts.AttnKind.Full),
                           ts.CacheGroupConfig("swa", PAGE, pages, ts.AttnKind.SlidingWindow, WINDOW_TOKENS)]
    config.num_device_pages = pages
    config.max_scheduled_tokens = mst
    config.max_batch_size = 8
    config.prefix_granularity = PAGE
    config.num_snapshot_pages = snapshot
    for name, value in fields.items():
        setattr(config, name, value)
    return ts.Scheduler(config)


def spec(rid, tokens, max_new=4):
    request = ts.RequestSpec()
    request.request_id, request.tokens, request.max_new_tokens = rid, list(tokens), max_new
    return request


def event(kind, rid, tokens=None):
    one = kind()
    one.request_id = rid
    if tokens is not None:
        one.tokens = list(tokens)
    bundle = ts.ExecutionEvent()
    bundle.add_event(one)
    return bundle


def rows(plan):
    """{rid: (input length, extend prefix or None for a decode row, {group: table})}, padding dropped."""
    out = {}
    for batch in plan.forward:
        prefixes = list(batch.extend_prefix_lens)
        for i, rid in enumerate(batch.request_ids):
            out[rid] = (list(batch.input_lengths)[i], prefixes[i] if i < batch.num_extends() else None,
                        {g: [p for p in tables[i] if p != -1] for g, tables in batch.block_tables.items()})
    return out


def step(s, token=1000):
    """One plan, every forwarded row answered (an empty result for a prefill chunk short of
    the prompt's end). Returns the plan and each row's start (the tokens computed before it)."""
    plan = s.next_execution_plan()
    starts = {}
    for batch in plan.forward:
        prefixes, inputs = list(batch.extend_prefix_lens), list(batch.input_lengths)
        prompts = list(batch.prefill_lengths)
        for i, rid in enumerate(batch.request_ids):
            prefill = i < batch.num_extends()
            starts[rid] = prefixes[i] if prefill else s.request_token_size(rid) - 1
            short = prefill and prefixes[i] + inputs[i] < prompts[i]
            s.advance(event(ts.ForwardEvent.ExtendResult, rid, [] if short else [token]))
    return plan, starts


def until_decoding(s, rid):
    while True:
        plan, _ = step(s)
        if rid in rows(plan) and rows(plan)[rid][1] is None:
            return


def window_holes(start, tokens, table):
    """The entries a row reads (its tokens and the W before them) that are null."""
    first = max(0, start - W) // PAGE
    return [entry for entry in range(first, (start + tokens - 1) // PAGE + 1) if table[entry] == 0]


def leading_nulls(table):
    n = 0
    while n < len(table) and table[n] == 0:
        n += 1
    return n


# -- the scenarios --------------------------------------------------------------------------------


def window():
    """One request, 40-token prompt then 16 decode steps: every row's sliding table against
    the window (SCHED-3: no null where it reads; SCHED-4: exactly floor((start - W) / P)
    leading nulls)."""
    s = scheduler(pages=256)
    s.submit_requests([spec("A", PROMPT, max_new=4)])
    holes, release = [], []
    for _ in range(18):
        plan, starts = step(s)
        tokens, _, tables = rows(plan)["A"]
        start, table = starts["A"], tables["swa"]
        if found := window_holes(start, tokens, table):
            holes.append([start, found])
        due = max(0, start - W) // PAGE
        if leading_nulls(table) != due:
            release.append([start, leading_nulls(table), due])
    return {"holes": holes, "release": release}


def hit():
    """A (40 tokens, one chunk) decodes and finishes; B shares its first 36 tokens. The hit
    B gets, and the entries of B's sliding table its first row reads that are null."""
    s = scheduler()
    s.submit_requests([spec("A", PROMPT)])
    until_decoding(s, "A")
    s.advance(event(ts.ForwardEvent.Finish, "A"))
    s.submit_requests([spec("B", PROMPT[:36] + [7] * 8)])
    plan, starts = step(s)
    tokens, prefix, tables = rows(plan)["B"]
    return {"hit": prefix, "swa": tables["swa"], "holes": window_holes(starts["B"], tokens, tables["swa"])}


def chunked_finish():
    """A 40-token prompt in 16-token chunks, decoded, finished; then one more plan. What the
    pool holds with no request left (SCHED-6)."""
    s = scheduler(mst=16)
    s.submit_requests([spec("A", PROMPT)])
    until_decoding(s, "A")
    s.advance(event(ts.ForwardEvent.Finish, "A"))
    s.next_execution_plan()
    running = s.waiting_size() + s.prefilling_size() + s.decoding_size() + s.retracted_size()
    return {"running": running, "held": s.active_lcm_blocks(), "available": s.available_lcm_blocks(),
            "pages": 63, "clear_cache": s.clear_cache()}


def accounting():
    """A 40-token prompt in 16-token chunks, then decode, then finish: available + active
    after every plan (SCHED-5: always the 63 real pages)."""
    s = scheduler(mst=16)
    s.submit_requests([spec("A", PROMPT, max_new=8)])
    sums = []
    for _ in range(8):
        step(s)
        sums.append(s.available_lcm_blocks() + s.active_lcm_blocks())
    s.advance(event(ts.ForwardEvent.Finish, "A"))
    s.next_execution_plan()
    sums.append(s.available_lcm_blocks() + s.active_lcm_blocks())
    return {"sums": sums, "pages": 63}


def pressure():
    """Two 20-token requests decode past max_new_tokens on 24 pages, with no snapshot pool,
    until the scheduler aborts one: the plans that left a decoding request out while a page
    was empty, and the empty pages before each plan that aborted (SCHED-7, SCHED-8)."""
    s = scheduler(pages=24)
    s.submit_requests([spec(f"R{i}", [i * 1000 + j for j in range(20)], max_new=1) for i in range(2)])
    starved, aborts = [], []
    for k in range(30):
        empty, decoding = s.empty_lcm_blocks(), s.decoding_size()
        plan, _ = step(s, token=5000 + k)
        if decoding == 2 and len(rows(plan)) < 2 and empty > 0:
            starved.append([k, empty])
        if plan.aborts:
            aborts.append([k, empty, [abort.request_id for abort in plan.aborts]])
            break
    return {"starved_with_a_page_empty": starved, "aborts": aborts}


SCENARIOS = {"window": window, "hit": hit, "chunked-finish": chunked_finish, "accounting": accounting,
             "pressure": pressure}

if __name__ == "__main__":
    sys.exit(main())
