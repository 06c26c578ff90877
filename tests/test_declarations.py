"""Declarations are validated by raising, never by `assert`: under `python -O` (asserts
dropped) a malformed invariant, mutant, family or adapter still cannot register. And the
capability table (kvspec.conformance.harness.declarations) is the one place that says what
each capability means and turns on."""

import subprocess
import sys
import types

import pytest

from kvspec.conformance.harness.declarations import OPTIONAL_OPERATIONS, Capability, Tier
from kvspec.conformance.harness.protocol import AdapterError, load_adapter, validate
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy

UNREGISTERED = "I" + "99"  # no clause has this id (spelt in two parts so clause coverage reads no citation)

MALFORMED = {
    "an invariant of no class": (
        "from dataclasses import replace\nfrom kvspec.spec.invariants import INVARIANTS\n"
        "replace(INVARIANTS[0], invariant_class='speed')", "InvalidInvariant: unknown invariant class 'speed'"),
    "a mutant of no registered clause": (
        "from kvspec.adapters.mutants.allocator import StaleMappingAllocator\n"
        "from kvspec.adapters.mutants.seeding import Mutant\n"
        "from kvspec.conformance.harness.declarations import Run\n"
        "class BAD(Mutant, slug='bad', allocator=StaleMappingAllocator):\n"
        f"    '''a bug'''\n    clause, invariant_class = '{UNREGISTERED}', 'mapping'\n    exposed_by = Run(page_size=4)",
        f"MalformedDeclaration: mutant 'bad': ('{UNREGISTERED}', 'mapping') is no registered invariant and class"),
    "a mutant without its run": (
        "from kvspec.adapters.mutants.allocator import StaleMappingAllocator\n"
        "from kvspec.adapters.mutants.seeding import Mutant\n"
        "class BAD(Mutant, slug='bad', allocator=StaleMappingAllocator):\n"
        "    '''a bug'''\n    clause, invariant_class, exposed_by = 'I5', 'mapping', 'allocator P=4'",
        "MalformedDeclaration: mutant 'bad': exposed_by must name the Run"),
    "a mutant carried by nothing": (
        "from kvspec.adapters.mutants.seeding import Mutant\n"
        "class BAD(Mutant, slug='bad'):\n    '''a bug'''\n    clause, invariant_class = 'I5', 'mapping'",
        "MalformedDeclaration: mutant 'bad': pass the engine, allocator or scheduler class"),
}


@pytest.mark.parametrize("what", sorted(MALFORMED))
def test_python_o_cannot_register_a_malformed_declaration(what):
    code, raised = MALFORMED[what]
    result = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and raised in result.stderr, result.stderr


def test_every_capability_says_what_it_means_turns_on_and_which_steps_need_it():
    for capability in Capability:
        assert capability.meaning and capability.turns_on and capability.needed_by, capability
        assert set(capability.tiers) <= set(Tier)
        assert capability.refines is None or capability.refines in Capability
    assert Capability("pd_decode") is Capability.PD_DECODE and f"{Capability.PD_DECODE}" == "pd_decode"


def test_an_adapter_declaring_a_capability_the_table_lacks_is_refused_naming_the_known_ones():
    adapter = type("A", (), {"name": "a", "policy_version": "sglang-0.5.23", "capabilities": ("warp_drive",),
                             "make_allocator": staticmethod(lambda *args: None)})
    with pytest.raises(AdapterError, match=r"unknown capabilities \['warp_drive'\]; known: page_size_1, "):
        validate(adapter, "a")


@pytest.mark.parametrize("operation, capability", sorted(OPTIONAL_OPERATIONS.items()))
def test_an_adapter_claiming_an_optional_operations_capability_must_offer_it(operation, capability, monkeypatch):
    """prefill_batch (LIFE-9) and finish_batch (LIFE-10): an engine that lacks the operation is an
    adapter error while its adapter claims the capability, and fine once it does not."""
    reference = load_adapter("reference")

    class Without:
        def __init__(self, engine):
            self.engine = engine

        def __getattr__(self, name):
            if name == operation:
                raise AttributeError(name)
            return getattr(self.engine, name)

    module = types.SimpleNamespace(ADAPTER=types.SimpleNamespace(
        name=f"no-{operation}", policy_version="sglang-0.5.23", capabilities=reference.capabilities,
        make_engine=lambda cfg: Without(reference.make_engine(cfg))))
    monkeypatch.setitem(sys.modules, "without_adapter", module)
    config = EngineConfig(page_size=4, window=8, size_full=256, size_swa=64, max_requests=4, policy=Policy())
    with pytest.raises(AdapterError, match=f"lacks {operation}"):
        load_adapter("without_adapter:ADAPTER").make_engine(config)
    module.ADAPTER.capabilities = tuple(c for c in reference.capabilities if c != capability)
    assert load_adapter("without_adapter:ADAPTER").make_engine(config) is not None
