"""Each bug of kvspec.adapters.sglang.mutants, patched into real SGLang 0.5.23, applies to
SGLang's source and is caught by the conformance run that exposes it (`exposed_by`), for
the clause it names, while unpatched SGLang passes that run; a patch whose text SGLang
no longer has is a clear error; and a patch stays inside its mutant's calls.

Needs SGLang installed (adapters/sglang/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_SGLANG=1, which turns a missing SGLang into a failure instead of a skip."""

import importlib.util
import os
import re

import pytest

if os.environ.get("KVSPEC_REQUIRE_SGLANG") != "1" and importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed: pip install --no-deps -r adapters/sglang/requirements.txt",
                allow_module_level=True)

from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.mutants import MUTANTS as REFERENCE_MUTANTS
from kvspec.adapters.sglang.mutants import (
    COMMON,
    MISSING_PAGE_MARGIN,
    MUTANTS,
    NOT_PATCHED,
    ORIGINAL_CODE,
    Patch,
    PatchError,
    active,
)
from kvspec.conformance.harness.allocator_machine import allocator_machine
from kvspec.conformance.harness.checks import ImplementationCrash, InvariantViolation
from kvspec.conformance.harness.declarations import CRASH, Run
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.engine_machine import engine_machine
from kvspec.conformance.harness.profiles import profile
from kvspec.conformance.harness.protocol import AdapterError, load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.trace import Trace, TraceStep, engine_config_json
from kvspec.spec.models import TWO_POOL
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import TWO_POOL_VERSIONS, Policy

# The ci profile at kvspec zoo's seed, without shrinking (shrinking real SGLang takes
# minutes; the assertion is on the clause of the first counterexample, which the zoo
# accepts too, not on a minimal reproduction). At this seed every mutant is caught within
# its first 250 examples.
SEED = 0
SETTINGS = settings(profile("ci"), max_examples=300, database=None, phases=[Phase.explicit, Phase.generate])


def machine_for(adapter, run: Run):
    if run.tier == "allocator":
        machine = allocator_machine(adapter.make_allocator, run.page_size, adapter.capabilities, adapter.observables)
    else:
        policy = Policy(adapter.policy_version, decode_eviction_interval=run.interval)
        machine = engine_machine(adapter.make_engine, run.page_size, run.window, policy, adapter.capabilities,
                                 adapter.observables, model=adapter.model, state_grid=run.state_grid)
    machine.reset_counters()
    return seed(SEED)(machine)  # run_state_machine_as_test reads the seed on the class


def failure_text(error: BaseException) -> str:
    members = getattr(error, "exceptions", None)  # an exception group
    return "\n".join(map(failure_text, members)) if members else f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("slug", sorted(MUTANTS))
def test_the_patch_applies_to_sglang(slug):
    patch = MUTANTS[slug].patch
    function = patch.target()
    with active((patch,)):
        assert function.__code__ is patch.code() is not ORIGINAL_CODE[function]
    assert function.__code__ is ORIGINAL_CODE[function]


@pytest.mark.parametrize("slug", sorted(MUTANTS))
def test_sglang_mutant_is_caught_for_its_clause(slug):
    mutant = MUTANTS[slug]
    machine = machine_for(load_adapter(mutant.name), mutant.exposed_by)
    with pytest.raises(Exception) as info:
        run_state_machine_as_test(machine, settings=SETTINGS)
    text = failure_text(info.value)
    # a crash showing the declared message: the only manifestation of a CRASH mutant (an
    # assertion of SGLang's own comes first), or the same bug's other one
    crashed = text.startswith("ImplementationCrash") and bool(mutant.crash_message) and mutant.crash_message in text
    if mutant.invariant_class == CRASH:
        assert crashed and f"[{mutant.clause}]" in text, text
    else:
        assert crashed or (text.startswith("InvariantViolation") and f"[{mutant.clause}]" in text), \
            f"{mutant.name} was caught, but not for {mutant.clause}:\n{text}"
    # the control: unpatched SGLang passes the same run at the same seed, for as many examples
    control = machine_for(load_adapter("sglang-python"), mutant.exposed_by)
    run_state_machine_as_test(control, settings=settings(SETTINGS, max_examples=machine.examples))


def test_every_sglang_mutant_is_a_bug_of_the_zoo():
    """Same slugs as the reference mutants of SGLang's memory model, the two-pool engine and
    allocator (the shared block pool's are vLLM's, the scheduler tier's the reference
    scheduler's); a slug without a patch says why."""
    two_pool = {slug for slug, mutant in REFERENCE_MUTANTS.items()
                if mutant.policy_versions == TWO_POOL_VERSIONS and not mutant.exposed_by.scheduler}
    assert len(two_pool) < len(REFERENCE_MUTANTS)  # the other models' mutants are in the zoo too
    assert not set(MUTANTS) & set(NOT_PATCHED)
    assert set(MUTANTS) | set(NOT_PATCHED) >= two_pool
    for slug, mutant in MUTANTS.items():
        assert mutant.name == f"sglang-mutant-{slug}" and load_adapter(mutant.name).name == mutant.name


def engine(page_size: int, window: int, interval: int, size_full: int, size_swa: int) -> dict:
    return engine_config_json(EngineConfig(page_size, window, size_full, size_swa, 4,
                                           Policy("sglang-0.5.23", interval)))


def decodes(count: int) -> list[TraceStep]:
    return [TraceStep("decode", {"rid": "r1", "token": 0})] * count


# What `kvspec check` shrinks these mutants' counterexamples to (release-dead-range-as-full: a
# shorter one of the same shape): the last step runs into an assertion of SGLang's own.
SHRUNK_TO_A_CRASH = {
    "unaligned-cursor": ("engine", engine(4, 7, 1, 56, 12), [  # cursor 9 - 8 = 1
        TraceStep("admit", {"rid": "r1", "prompt": [0] * 26}),
        TraceStep("prefill_chunk", {"rid": "r1", "chunk": 10, "token": 0})], "must be page-aligned"),
    "release-dead-range-as-full": ("engine", engine(4, 7, 1, 64, 64), [  # dead range [4, 8)
        TraceStep("admit", {"rid": "r1", "prompt": [0] * 5}),
        TraceStep("prefill_chunk", {"rid": "r1", "chunk": 5, "token": 0}), *decodes(16),
        TraceStep("abort", {"rid": "r1"})], "abort raised AssertionError"),
    "tail-full-page-count": ("allocator", {"page_size": 4, "size_full": 12, "size_swa": 8}, [
        TraceStep("new_sequence", {"length": 1}),
        TraceStep("fork", {"parent": 0, "prefix_pages": 0, "length": 5, "tail": 1})], r"\[ALLOC-5\]"),
    "one-pool-available": ("allocator", {"page_size": 4, "size_full": 8, "size_swa": 4}, [
        TraceStep("new_sequence", {"length": 5})], r"\[ALLOC-5\]"),
}


@pytest.mark.parametrize("slug", sorted(SHRUNK_TO_A_CRASH))
def test_a_mutant_that_shrinks_to_an_assertion_of_sglangs_own(slug):
    """The mutants whose docstrings say kvspec check shrinks them to a crash: the short
    counterexample crashes the mutant at its last step, and unpatched SGLang passes it."""
    tier, config, steps, message = SHRUNK_TO_A_CRASH[slug]
    trace = Trace(tier, config, MUTANTS[slug].name, tuple(steps))
    assert replay(trace, load_adapter("sglang-python"), compare=False).conforms
    result = replay(trace, load_adapter(MUTANTS[slug].name), compare=False)
    assert isinstance(result.failure, ImplementationCrash) and result.stopped_at == len(steps) - 1, result.verdict()
    assert re.search(message, str(result.failure)), result.verdict()


def test_an_unknown_sglang_mutant_is_a_clear_error():
    with pytest.raises(AdapterError, match="sglang-mutant-missing-page-margin"):
        load_adapter("sglang-mutant-no-such-bug")
    with pytest.raises(AdapterError, match="SGL-6"):
        load_adapter("sglang-mutant-non-atomic-decode")
    with pytest.raises(AdapterError, match="sglang-mutant-stale-mapping"):
        load_adapter("no-such-engine")


def test_a_patch_whose_text_is_missing_is_a_clear_error():
    """An SGLang upgrade that moves the code stops the mutant; it never runs unpatched."""
    moved = Patch(COMMON, "free_kv_row_segments", "        allocator.free_everything(swa_dead)\n", "")
    with pytest.raises(PatchError, match=r"free_kv_row_segments: the text to replace occurs 0 times(.|\n)*"
                                         r"allocator.free_everything\(swa_dead\)"):
        moved.code()
    twice = Patch(COMMON, "free_kv_row_segments", "swa_dead", "swa_gone")
    with pytest.raises(PatchError, match="occurs [2-9] times"):
        twice.code()
    with pytest.raises(PatchError, match="no_such_function is not a plain function"):
        Patch(COMMON, "no_such_function", "x", "y").target()


def test_a_patch_stays_inside_its_mutant():
    """The bug the old SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN reintroduces: at P=4, W=5 a
    10-token chunk leaves 4 < W live SWA tokens in its leaf (I10). The mutant and unpatched
    SGLang run in one process, their steps interleaved: only the mutant is caught, and
    SGLang's function has its own code between the mutant's calls and after them."""
    config = EngineConfig(page_size=4, window=5, size_full=64, size_swa=32, max_requests=4,
                          policy=Policy("sglang-0.5.23", 4))
    steps = [TraceStep("admit", {"rid": "r", "prompt": list(range(11))}),
             TraceStep("prefill_chunk", {"rid": "r", "chunk": 10, "token": 0})]
    function = MISSING_PAGE_MARGIN.patch.target()
    mutant = EngineDriver(load_adapter(MISSING_PAGE_MARGIN.name).make_engine(config), TWO_POOL, frozenset(TWO_POOL.observables))
    unpatched = EngineDriver(load_adapter("sglang-python").make_engine(config), TWO_POOL,
                            frozenset(TWO_POOL.observables))
    mutant.apply(steps[0])
    unpatched.apply(steps[0])
    assert function.__code__ is ORIGINAL_CODE[function]
    with pytest.raises(InvariantViolation, match="I10"):
        mutant.apply(steps[1])
    assert function.__code__ is ORIGINAL_CODE[function]
    unpatched.apply(steps[1])
