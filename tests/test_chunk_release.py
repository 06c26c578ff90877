"""The policy's chunk_release (spec WIN-4): an engine whose chunked prefill keeps every
chunk's SWA is checked against a policy that says so, and every other clause still holds.

The trace: one 24-token prompt prefilled in chunks of 8 at P = 1, W = 3, then decoded. With
chunk release each checkpoint releases what slid out of the window; without, the prompt's
SWA stays live in the tree. The bug zoo's `no-chunk-release` mutant is the reference
without the release: a bug under the default policy (I9), the policy itself without it.
"""

from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.trace import Trace, TraceStep, engine_config_json, parse
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy, validate_window_config

PROMPT = list(range(1, 25))
STEPS = (TraceStep("admit", {"rid": "r1", "prompt": PROMPT}),
         *(TraceStep("prefill_chunk", {"rid": "r1", "chunk": 8, "token": 0}) for _ in range(3)),
         *(TraceStep("decode", {"rid": "r1", "token": 0}) for _ in range(6)))


def trace(chunk_release: bool, adapter: str = "reference") -> Trace:
    config = EngineConfig(1, 3, 64, 64, 4, Policy("sglang-0.5.23", 4, chunk_release))
    return Trace("engine", engine_config_json(config), adapter, STEPS)


def test_without_chunk_release_the_prompt_keeps_its_swa_and_conforms():
    reference = load_adapter("reference")
    kept, released = (replay(trace(flag), reference, compare=False) for flag in (False, True))
    assert kept.conforms and released.conforms
    swa_free = [result.observed[3]["free_swa_pages"] for result in (kept, released)]  # after the last chunk
    assert swa_free[0] < swa_free[1], "the policy is not vacuous: without release the chunks' SWA stays held"


def test_the_same_engine_breaks_i9_under_the_default_policy():
    mutant = load_adapter("mutant-no-chunk-release")
    assert replay(trace(False, mutant.name), mutant, compare=False).conforms
    failed = replay(trace(True, mutant.name), mutant, compare=False)
    assert not failed.conforms and "I9" in failed.failure.clauses


def test_a_trace_writes_chunk_release_only_when_off():
    assert "chunk_release" not in trace(True).config["policy"]
    assert trace(False).config["policy"]["chunk_release"] is False
    assert parse(trace(False).dumps()).engine_config().policy.chunk_release is False


def test_a_chunk_release_that_is_no_boolean_is_refused_clearly():
    problems = validate_window_config(3, 1, Policy("sglang-0.5.23", 4, "no"))
    assert problems == ["chunk_release must be true or false (got 'no')"]


def test_sglang_members_declare_the_release_their_knobs_give():
    from kvspec.adapters.sglang.releases.catalog import MEMBERS

    declared = {slug: MEMBERS.members[slug].chunk_release for slug in
                ("0.5.14", "0.5.14-python", "0.5.14-python+chunk-release", "0.5.17", "0.5.18",
                 "0.5.18+no-chunk-release", "0.5.23", "0.5.23-python+no-chunk-release")}
    assert declared == {"0.5.14": False, "0.5.14-python": False, "0.5.14-python+chunk-release": True,
                        "0.5.17": False, "0.5.18": True, "0.5.18+no-chunk-release": False, "0.5.23": True,
                        "0.5.23-python+no-chunk-release": False}
