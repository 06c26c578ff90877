"""[the known-divergences list] Every known difference between TokenSpeed's scheduler
0.1.42 and the spec still reproduces on every adapter it names, and what the adapters
steer by is what makes the difference.

Skipped when the package is not installed (`pip install --no-deps -r
adapters/tokenspeed/requirements.txt`), unless KVSPEC_REQUIRE_TOKENSPEED=1."""

import importlib.util
import os

import pytest

if (os.environ.get("KVSPEC_REQUIRE_TOKENSPEED") != "1"
        and importlib.util.find_spec("tokenspeed_scheduler") is None):
    pytest.skip("tokenspeed-scheduler is not installed: pip install --no-deps -r adapters/tokenspeed/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.tokenspeed.divergences import KNOWN_DIVERGENCES
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.spec.clauses import load_clauses

CASES = [(d, adapter) for d in KNOWN_DIVERGENCES for adapter in d.adapters]


@pytest.mark.parametrize("divergence,adapter", CASES, ids=[f"{d.id}-{a}" for d, a in CASES])
def test_the_divergence_still_reproduces(divergence, adapter):
    trace = divergence.trace()
    result = replay(trace, load_adapter(adapter))
    assert result.reproduces(trace), (f"{divergence.id} ({divergence.title}) no longer reproduces on {adapter}: "
                                      f"{result.verdict()}. If TokenSpeed changed it, remove the entry.")
    assert set(result.failure.clauses) & set(divergence.clauses)


@pytest.mark.parametrize("divergence", KNOWN_DIVERGENCES, ids=[d.id for d in KNOWN_DIVERGENCES])
def test_the_adapter_that_presses_on_the_pool_takes_the_same_steps_without_it(divergence):
    """[SCHED-7] What the adapters steer by is what makes the difference: tokenspeed-aborts
    (no snapshot pool), whose runs press on the pool, conforms on the same steps."""
    assert replay(divergence.trace(), load_adapter("tokenspeed-aborts")).conforms


def test_the_adapters_steer_as_the_entries_say():
    """The retracting build gives every request room (no preempts_only_when_needed); the
    aborting one presses on the pool. Both have the state group."""
    assert "preempts_only_when_needed" not in load_adapter("tokenspeed").capabilities
    assert "preempts_only_when_needed" in load_adapter("tokenspeed-aborts").capabilities
    assert all("state_group" in load_adapter(name).capabilities for name in ("tokenspeed", "tokenspeed-aborts"))


def test_every_entry_is_complete():
    known = set(load_clauses())
    for divergence in KNOWN_DIVERGENCES:
        assert set(divergence.clauses) <= known, divergence.id
        assert divergence.explanation and divergence.upstream and divergence.steered_by, divergence.id
        assert divergence.path.exists(), divergence.id
        assert divergence.steps and divergence.tier == "scheduler", divergence.id
    assert len({d.id for d in KNOWN_DIVERGENCES}) == len(KNOWN_DIVERGENCES)
