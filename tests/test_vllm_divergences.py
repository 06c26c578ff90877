"""[the known-divergences list] Every known difference between real vLLM 0.33.0 and the
spec still reproduces, on every adapter it names; an engine-tier one only there: the
engine adapters that a check runs (`vllm`, `vllm-dense`) take the same steps without it.
A scheduler-tier one is vLLM's own scheduling, which no option steers: it names every
scheduler adapter (`vllm-scheduler`, `vllm-scheduler-dense`).

Needs vLLM installed (adapters/vllm/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_VLLM=1, which turns a missing vLLM into a failure instead of a skip."""

import importlib.util
import os

import pytest

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.vllm.divergences import KNOWN_DIVERGENCES
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.spec.clauses import load_clauses

CASES = [(d, adapter) for d in KNOWN_DIVERGENCES for adapter in d.adapters]
ENGINE_TIER = [d for d in KNOWN_DIVERGENCES if d.tier == "engine"]
SCHEDULER_TIER = [d for d in KNOWN_DIVERGENCES if d.tier == "scheduler"]


@pytest.mark.parametrize("divergence,adapter", CASES, ids=[f"{d.id}-{a}" for d, a in CASES])
def test_the_divergence_still_reproduces(divergence, adapter):
    trace = divergence.trace()
    result = replay(trace, load_adapter(adapter))
    assert result.reproduces(trace), (f"{divergence.id} ({divergence.title}) no longer reproduces on {adapter}: "
                                      f"{result.verdict()}. If vLLM changed it, remove the entry.")
    assert set(result.failure.clauses) & set(divergence.clauses)


@pytest.mark.parametrize("divergence", ENGINE_TIER, ids=[d.id for d in ENGINE_TIER])
@pytest.mark.parametrize("adapter", ["vllm", "vllm-dense"])
def test_the_checked_adapters_conform_on_the_same_steps(divergence, adapter):
    """What the entry steers around is what makes the difference: the adapters a check
    runs take the same steps without it."""
    assert replay(divergence.trace(), load_adapter(adapter)).conforms


@pytest.mark.parametrize("divergence", SCHEDULER_TIER, ids=[d.id for d in SCHEDULER_TIER])
def test_a_scheduler_divergence_names_every_scheduler_adapter(divergence):
    """Nothing steers vLLM's own scheduling: every scheduler adapter shows it."""
    assert set(divergence.adapters) == {"vllm-scheduler", "vllm-scheduler-dense"}


def test_every_entry_is_complete():
    known = set(load_clauses())
    for divergence in KNOWN_DIVERGENCES:
        assert set(divergence.clauses) <= known, divergence.id
        assert divergence.explanation and divergence.upstream and divergence.steered_by, divergence.id
        assert divergence.path.exists(), divergence.id
    assert len({d.id for d in KNOWN_DIVERGENCES}) == len(KNOWN_DIVERGENCES)
