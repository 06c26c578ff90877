"""[the known-divergences list] Every known difference between real SGLang 0.5.23 and
the spec still reproduces, on every adapter it names: when an upstream fix makes one go
away, this fails and the entry goes (and its steering capability comes back).

Needs SGLang installed (adapters/sglang/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_SGLANG=1, which turns a missing SGLang into a failure instead of a skip."""

import importlib.util
import os
from dataclasses import replace

import pytest

from kvspec.adapters.sglang import CAPABILITIES, SGLANG
from kvspec.adapters.sglang.divergences import KNOWN_DIVERGENCES
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.spec.clauses import load_clauses

if os.environ.get("KVSPEC_REQUIRE_SGLANG") != "1" and importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed: pip install --no-deps -r adapters/sglang/requirements.txt",
                allow_module_level=True)

CASES = [(d, adapter) for d in KNOWN_DIVERGENCES for adapter in d.adapters]


@pytest.mark.parametrize("divergence,adapter", CASES, ids=[f"{d.id}-{a}" for d, a in CASES])
def test_the_divergence_still_reproduces(divergence, adapter):
    """Replayed as if SGLang claimed the capability the divergence withholds from it (with
    it, the harness holds it to the clause; without it, it checks what must still hold)."""
    trace = divergence.trace()
    claimed = load_adapter(adapter)
    if divergence.steered_by:
        claimed = replace(claimed, capabilities=claimed.capabilities | {divergence.steered_by})
    result = replay(trace, claimed)
    assert result.reproduces(trace), (f"{divergence.id} ({divergence.title}) no longer reproduces on {adapter}: "
                                      f"{result.verdict()}. If SGLang fixed it, remove the entry.")
    assert set(result.failure.clauses) & set(divergence.clauses)


@pytest.mark.parametrize("divergence", KNOWN_DIVERGENCES, ids=[d.id for d in KNOWN_DIVERGENCES])
def test_the_reference_conforms_on_the_same_steps(divergence):
    """The divergence is SGLang's: the spec's own model takes the same steps without one."""
    assert replay(divergence.trace(), load_adapter("reference")).conforms


def test_every_entry_is_complete_and_steered_capabilities_are_left_out():
    known = set(load_clauses())
    for divergence in KNOWN_DIVERGENCES:
        assert set(divergence.clauses) <= known, divergence.id
        assert divergence.explanation and divergence.upstream and divergence.path.exists(), divergence.id
        if divergence.steered_by:
            assert divergence.steered_by not in CAPABILITIES and divergence.steered_by not in SGLANG.capabilities
    assert len({d.id for d in KNOWN_DIVERGENCES}) == len(KNOWN_DIVERGENCES)
