"""vLLM 0.33.0's own v1 scheduler, built without a model and stepped with tokens the test
chooses (adapters/vllm/scheduler_probe.py): chunked prefill, a stop token, max_tokens,
an abort, a prefix hit, preemption under block pressure and a Mamba group, over the
hybrid block pool (a full-attention and a sliding-window group).

Needs vLLM installed (adapters/vllm/requirements.txt); KVSPEC_REQUIRE_VLLM=1 turns a
missing vLLM into a failure instead of a skip."""

import importlib.util
import os

import pytest

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.vllm.scheduler_probe import build_scheduler, make_request, step

PAGE, WINDOW = 4, 8


def outputs(engine_core_outputs) -> dict[str, tuple[list[int], str | None]]:
    """Request id -> (the tokens it got this step, why it finished or None)."""
    return {o.request_id: (o.new_token_ids, None if o.finish_reason is None else o.finish_reason.name)
            for eco in engine_core_outputs.values() for o in eco.outputs}


def free(scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def run_until_idle(scheduler, limit: int = 500) -> list:
    """Steps until no request is left; returns every step's scheduler output."""
    steps = []
    while scheduler.requests and len(steps) < limit:
        steps.append(step(scheduler, {})[0])
    assert not scheduler.requests
    return steps


def test_chunked_prefill_then_a_stop_token_frees_every_block():
    s = build_scheduler(PAGE, WINDOW, num_blocks=20, max_num_batched_tokens=16, max_num_seqs=4)
    assert free(s) == 19  # block 0 is the null block
    s.add_request(make_request(s, "a", range(100, 130), max_tokens=50, stop_token_ids=[999]))

    out, eco = step(s, {"a": [5]})  # first chunk: 16 of 30 prompt tokens, nothing sampled
    assert out.num_scheduled_tokens == {"a": 16} and outputs(eco) == {}
    assert s.kv_cache_manager.get_block_ids("a") == ([1, 2, 3, 4], [5, 6, 7, 8])

    out, eco = step(s, {"a": [5]})  # the rest of the prompt, which samples
    assert out.num_scheduled_tokens == {"a": 14} and outputs(eco) == {"a": ([5], None)}
    full, swa = s.kv_cache_manager.get_block_ids("a")
    assert len(full) == len(swa) == 8 and swa[:2] == [0, 0]  # blocks that left the window are the null block

    assert outputs(step(s, {"a": [6]})[1]) == {"a": ([6], None)}
    assert outputs(step(s, {"a": [999]})[1]) == {"a": ([999], "STOP")}
    assert "a" not in s.requests and free(s) == 19


def test_a_shared_prompt_hits_the_prefix_cache():
    s = build_scheduler(PAGE, WINDOW, num_blocks=40, max_num_batched_tokens=64, max_num_seqs=4)
    prompt = list(range(100, 132))
    s.add_request(make_request(s, "first", prompt, max_tokens=1))
    run_until_idle(s)
    s.add_request(make_request(s, "second", prompt + [7, 8, 9], max_tokens=1))
    out, eco = step(s, {})
    assert [(r.req_id, r.num_computed_tokens) for r in out.scheduled_new_reqs] == [("second", 32)]
    stats = eco[0].scheduler_stats.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (1, 35, 32)


def test_max_tokens_and_an_abort():
    from vllm.v1.request import RequestStatus

    s = build_scheduler(PAGE, WINDOW, num_blocks=20, max_num_batched_tokens=16, max_num_seqs=4)
    s.add_request(make_request(s, "short", [1, 2, 3], max_tokens=2))
    s.add_request(make_request(s, "long", [4, 5, 6], max_tokens=100))
    assert outputs(step(s, {"short": [10], "long": [20]})[1]) == {"short": ([10], None), "long": ([20], None)}
    assert outputs(step(s, {"short": [11], "long": [21]})[1]) == {"short": ([11], "LENGTH"), "long": ([21], None)}
    assert [r.request_id for r in s.finish_requests("long", RequestStatus.FINISHED_ABORTED)] == ["long"]
    assert not s.requests and free(s) == 19
    assert step(s, {})[0].finished_req_ids == {"short", "long"}  # the workers hear of both on the next step


def test_block_pressure_preempts_and_the_request_resumes():
    s = build_scheduler(PAGE, WINDOW, num_blocks=20, max_num_batched_tokens=16, max_num_seqs=4)
    for rid in "xyz":
        s.add_request(make_request(s, rid, [ord(rid)] * 14, max_tokens=40))
    steps = run_until_idle(s)
    preempted = {i: out.preempted_req_ids for i, out in enumerate(steps) if out.preempted_req_ids}
    assert preempted
    for i, rids in preempted.items():
        # The V2 model runner (vLLM's default) gets a resumed request again as a new one.
        later = [r.req_id for out in steps[i + 1:] for r in out.scheduled_new_reqs]
        assert rids <= set(later)
    assert free(s) == 19


def test_a_mamba_group_in_align_mode_clips_prefill_chunks():
    s = build_scheduler(PAGE, WINDOW, num_blocks=40, max_num_batched_tokens=16, max_num_seqs=4, mamba=True)
    assert [type(m).__name__ for m in s.kv_cache_manager.coordinator.single_type_managers] == [
        "FullAttentionManager", "SlidingWindowManager", "MambaManager"]
    s.add_request(make_request(s, "m", range(100, 130), max_tokens=2))
    chunks = [out.num_scheduled_tokens.get("m") for out in run_until_idle(s)]
    assert chunks[:3] == [16, 12, 2]  # 28 is the last state block boundary before the prompt's end


def test_more_than_one_token_a_step_is_refused_before_scheduling():
    s = build_scheduler(PAGE, WINDOW, num_blocks=20, max_num_batched_tokens=16, max_num_seqs=4)
    s.add_request(make_request(s, "a", [1, 2, 3], max_tokens=4))
    with pytest.raises(ValueError, match="one sampled token"):
        step(s, {"a": [1, 2]})
    assert s.requests["a"].num_computed_tokens == 0
