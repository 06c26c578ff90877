"""[the known-divergences list] Every known difference between TokenSpeed's scheduler
0.1.42 and the spec still reproduces on every adapter it names, and what the adapters
steer by is what makes the difference.

Skipped when the package is not installed (`pip install --no-deps -r
adapters/tokenspeed/requirements.txt`), unless KVSPEC_REQUIRE_TOKENSPEED=1."""

import importlib.util
import os
from dataclasses import replace

import pytest

if (os.environ.get("KVSPEC_REQUIRE_TOKENSPEED") != "1"
        and importlib.util.find_spec("tokenspeed_scheduler") is None):
    pytest.skip("tokenspeed-scheduler is not installed: pip install --no-deps -r adapters/tokenspeed/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.tokenspeed.divergences import KNOWN_DIVERGENCES
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.spec.clauses import load_clauses
from kvspec.spec.scheduler import STATE

CASES = [(d, adapter) for d in KNOWN_DIVERGENCES for adapter in d.adapters]


@pytest.mark.parametrize("divergence,adapter", CASES, ids=[f"{d.id}-{a}" for d, a in CASES])
def test_the_divergence_still_reproduces(divergence, adapter):
    trace = divergence.trace()
    result = replay(trace, load_adapter(adapter))
    assert result.reproduces(trace), (f"{divergence.id} ({divergence.title}) no longer reproduces on {adapter}: "
                                      f"{result.verdict()}. If TokenSpeed changed it, remove the entry.")
    assert set(result.failure.clauses) & set(divergence.clauses)


def test_tokenspeed_1_needs_the_state_group():
    """[SCHED-7] TOKENSPEED-1's steps with full and sliding-window groups alone conform on
    the adapters that press on the pool: the state group's unreserved pages make the
    pressure (and those adapters have no state group)."""
    trace = next(d for d in KNOWN_DIVERGENCES if d.id == "TOKENSPEED-1").trace()
    without_state = replace(trace, config={**trace.config, "groups": [g for g in trace.config["groups"] if g != STATE]},
                            steps=tuple(replace(step, violated=(), message=None) for step in trace.steps))
    for adapter in ("tokenspeed", "tokenspeed-aborts"):
        assert replay(without_state, load_adapter(adapter)).conforms, adapter


def test_the_adapters_steer_as_the_entries_say():
    """The adapters that press on the pool have no state group; the one with a state
    group gives every request room (no preempts_only_when_needed)."""
    for name in ("tokenspeed", "tokenspeed-aborts"):
        capabilities = load_adapter(name).capabilities
        assert "preempts_only_when_needed" in capabilities and "state_group" not in capabilities, name
    capabilities = load_adapter("tokenspeed-state").capabilities
    assert "state_group" in capabilities and "preempts_only_when_needed" not in capabilities


def test_every_entry_is_complete():
    known = set(load_clauses())
    for divergence in KNOWN_DIVERGENCES:
        assert set(divergence.clauses) <= known, divergence.id
        assert divergence.explanation and divergence.upstream and divergence.steered_by, divergence.id
        assert divergence.path.exists(), divergence.id
        assert divergence.steps and divergence.tier == "scheduler", divergence.id
    assert len({d.id for d in KNOWN_DIVERGENCES}) == len(KNOWN_DIVERGENCES)
