"""Each bug of kvspec.adapters.vllm.mutants, patched into real vLLM 0.33.0's KV cache
manager, applies to vLLM's source and is caught by the conformance run that exposes it
(`exposed_by`), for the clause of chapter 08 it names, while unpatched vLLM passes that
run; a patch whose text vLLM does not have is a clear error; and a patch stays inside
its mutant's calls.

Needs vLLM installed (adapters/vllm/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_VLLM=1, which turns a missing vLLM into a failure instead of a skip."""

import importlib.util
import json
import os
import re
import subprocess

import pytest

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.patching import ORIGINAL_CODE, PatchError, active
from kvspec.adapters.vllm.mutants import ALL_MUTANTS, BLOCK_POOL, MANAGERS, MUTANTS, WINDOW_ONE_TOKEN_EARLY, Patch
from kvspec.conformance.harness.checks import InvariantViolation
from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.engine_machine import engine_machine
from kvspec.conformance.harness.profiles import profile
from kvspec.conformance.harness.protocol import AdapterError, load_adapter
from kvspec.conformance.harness.trace import TraceStep
from kvspec.conformance.zoo.zoo import collect, validate_json
from kvspec.spec.block_pool import NULL_BLOCK, SWA
from kvspec.spec.clauses import load_clauses
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import VLLM_0_33, Policy

# The quick profile's steps per example at a fixed seed, without shrinking (the
# assertion is on the clause of the first counterexample, not on a minimal one). At this
# seed every mutant is caught within its first 10 examples (and at seeds 1-9 within 110);
# the 200 leave room for a Hypothesis upgrade that draws differently. Hypothesis draws
# differently for another max_examples, so these are not `kvspec check --profile quick`'s
# examples at the same seed.
SEED = 0
SETTINGS = settings(profile("quick"), max_examples=200, database=None, phases=[Phase.explicit, Phase.generate])


def machine_for(adapter, run: Run):
    policy = Policy(adapter.policy_version, decode_eviction_interval=run.interval)
    machine = engine_machine(adapter.make_engine, run.page_size, run.window, policy, adapter.capabilities,
                             adapter.observables, model=adapter.model)
    machine.reset_counters()
    return seed(SEED)(machine)  # run_state_machine_as_test reads the seed on the class


def failure_text(error: BaseException) -> str:
    members = getattr(error, "exceptions", None)  # an exception group
    return "\n".join(map(failure_text, members)) if members else f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("slug", sorted(MUTANTS))
def test_the_patch_applies_to_vllm_and_only_while_on(slug):
    """Each patch's text is in vLLM 0.33.0 once, and the edit is on only inside `active`."""
    patch = MUTANTS[slug].patch
    function = patch.target()
    assert function.__code__ is ORIGINAL_CODE[function]
    with active((patch,)):
        assert function.__code__ is patch.code() is not ORIGINAL_CODE[function]
    assert function.__code__ is ORIGINAL_CODE[function]


@pytest.mark.parametrize("slug", sorted(MUTANTS))
def test_vllm_mutant_is_caught_for_its_clause(slug):
    """Each mutant's clause, one of [BLOCK-1, BLOCK-2, BLOCK-3, BLOCK-4, BLOCK-5, BLOCK-6,
    BLOCK-7, BLOCK-8, BLOCK-9, BLOCK-10, BLOCK-11], is named by the invariant violation its `exposed_by` run stops at;
    unpatched vLLM passes that run."""
    mutant = MUTANTS[slug]
    machine = machine_for(load_adapter(mutant.name), mutant.exposed_by)
    with pytest.raises(Exception) as info:
        run_state_machine_as_test(machine, settings=SETTINGS)
    text = failure_text(info.value)
    assert text.startswith("InvariantViolation") and f"[{mutant.clause}]" in text, \
        f"{mutant.name} was not caught for {mutant.clause} by {mutant.exposed_by.label}:\n{text}"
    # the control: unpatched vLLM passes the same run at the same seed, for as many examples
    control = machine_for(load_adapter(mutant.base.name), mutant.exposed_by)
    run_state_machine_as_test(control, settings=settings(SETTINGS, max_examples=machine.examples))


def test_every_block_clause_has_a_vllm_mutant():
    """[BLOCK-1, BLOCK-2, BLOCK-3, BLOCK-4, BLOCK-5, BLOCK-6, BLOCK-7, BLOCK-8, BLOCK-9, BLOCK-10, BLOCK-11] Every
    clause of chapter 08 is broken by some bug seeded into vLLM, and the test that catches them
    names exactly those clauses."""
    chapter = {clause_id for clause_id in load_clauses() if clause_id.startswith("BLOCK-")}
    assert {mutant.clause for mutant in MUTANTS.values()} == chapter
    assert set(re.findall(r"BLOCK-\d+", test_vllm_mutant_is_caught_for_its_clause.__doc__)) == chapter


def test_every_vllm_mutant_loads_by_name():
    for slug, mutant in MUTANTS.items():
        loaded = load_adapter(f"vllm-mutant-{slug}")
        assert loaded.name == mutant.name == f"vllm-mutant-{slug}"
        assert loaded.observables == frozenset(mutant.base.observables) and loaded.make_allocator is None


def test_an_unknown_vllm_mutant_is_a_clear_error():
    with pytest.raises(AdapterError, match="unknown mutant of real vLLM 'vllm-mutant-no-such-bug'(.|\n)*"
                                           "vllm-mutant-window-one-token-early"):
        load_adapter("vllm-mutant-no-such-bug")
    with pytest.raises(AdapterError, match="vllm-mutant-no-window-release"):
        load_adapter("no-such-engine")


def test_a_patch_whose_text_vllm_lacks_is_a_clear_error():
    """A vLLM upgrade that moves the code stops the mutant; it never runs unpatched."""
    moved = Patch(MANAGERS, "SlidingWindowManager.get_num_skipped_tokens",
                  "        return num_computed_tokens - self.sliding_window\n", "")
    with pytest.raises(PatchError, match=r"get_num_skipped_tokens: the text to replace occurs 0 times in its "
                                         r"source, not once; vLLM's code moved(.|\n)*self.sliding_window"):
        moved.code()
    twice = Patch(BLOCK_POOL, "BlockPool.touch", "block.ref_cnt", "block.refs")
    with pytest.raises(PatchError, match="occurs [2-9] times"):
        twice.code()
    with pytest.raises(PatchError, match="no_such_method is not a plain function"):
        Patch(BLOCK_POOL, "BlockPool.no_such_method", "x", "y").target()
    with pytest.raises(PatchError, match="has no class NoSuchManager"):
        Patch(MANAGERS, "NoSuchManager.free", "x", "y").target()


def test_a_patch_stays_inside_its_mutant():
    """[BLOCK-5] The window one token short: at P=4, W=6 a 9-token chunk, then an
    allocation with 9 tokens computed, releases the block of position 3, which the next
    token reads. The mutant and unpatched vLLM run in one process, their steps
    interleaved: only the mutant is caught, and vLLM's function has its own code between
    the mutant's calls and after them."""
    config = EngineConfig(page_size=4, window=6, size_full=64, size_swa=32, max_requests=4,
                          policy=Policy(VLLM_0_33, 4))
    steps = [TraceStep("admit", {"rid": "r", "prompt": list(range(12))}),
             TraceStep("prefill_chunk", {"rid": "r", "chunk": 9, "token": 0}),
             TraceStep("prefill_chunk", {"rid": "r", "chunk": 3, "token": 0})]
    function = WINDOW_ONE_TOKEN_EARLY.patch.target()
    mutant_adapter, unpatched_adapter = load_adapter(WINDOW_ONE_TOKEN_EARLY.name), load_adapter("vllm")
    mutant = EngineDriver(mutant_adapter.make_engine(config), mutant_adapter.model, mutant_adapter.observables)
    unpatched = EngineDriver(unpatched_adapter.make_engine(config), unpatched_adapter.model,
                            unpatched_adapter.observables)
    for step in steps[:2]:
        mutant.apply(step)
        assert function.__code__ is ORIGINAL_CODE[function]
        unpatched.apply(step)
    with pytest.raises(InvariantViolation, match=r"\[BLOCK-5\] request r: 1 leading SWA blocks released, but "
                                                 r"after 9 tokens"):
        mutant.apply(steps[2])
    assert function.__code__ is ORIGINAL_CODE[function]
    unpatched.apply(steps[2])
    view = unpatched.previous.block_pool
    assert view.requests[0].tables[view.groups.index(SWA)][0] != NULL_BLOCK  # positions 0..3 stay held


def test_a_bug_seen_when_the_engine_is_built_is_saved_and_reproduced(tmp_path):
    """[BLOCK-3] null-block-in-free-queue breaks the fresh engine: the saved trace has no
    steps, and replaying it reproduces the failure (it is not called nondeterministic)."""
    from kvspec.conformance.runs.plan import plan
    from kvspec.conformance.runs.runner import Job, check_job

    mutant = MUTANTS["null-block-in-free-queue"]
    planned = plan(load_adapter(mutant.name)).of(mutant.exposed_by)
    result = check_job(Job(mutant.name, planned, "quick", 0, str(tmp_path)))
    assert result.verdict == "violated" and "BLOCK-3" in result.clauses
    assert result.trace_steps == 0 and "not deterministic" not in result.message


def test_the_zoo_holds_every_vllm_mutant():
    """`kvspec zoo --implementation vllm` runs the sixteen (fourteen of chapter 08, two of
    its state group), each on its `exposed_by` run."""
    chosen = collect(("vllm",), None)
    assert len(chosen) == len(ALL_MUTANTS) == 16 and len(MUTANTS) == 14
    assert [specimen.adapter for specimen in chosen] == [f"vllm-mutant-{slug}" for slug in sorted(ALL_MUTANTS)]
    for specimen in chosen:
        mutant = ALL_MUTANTS[specimen.slug]
        assert specimen.implementation == "vllm" and specimen.adapter == mutant.name
        assert (specimen.exposed_by, specimen.clause, specimen.invariant_class) == \
            (mutant.exposed_by, mutant.clause, mutant.invariant_class)


def test_kvspec_zoo_catches_a_vllm_mutant(tmp_path):
    """null-block-in-free-queue (seen when the engine is built: the fastest), through the zoo's
    workers: caught for its clause and class, in a valid zoo/2 document. (No clause id is named
    here: the other tests of this file cite the clauses.)"""
    mutant = MUTANTS["null-block-in-free-queue"]
    result = subprocess.run(["kvspec", "zoo", "--implementation", "vllm", "--only", "null-block-in-free-queue",
                             "--json", str(tmp_path / "zoo.json"), "--traces", str(tmp_path / "traces")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 of 1 caught" in result.stdout and f"{mutant.clause} ({mutant.invariant_class})" in result.stdout
    document = json.loads((tmp_path / "zoo.json").read_text())
    validate_json(document)
    [zoo] = document["mutants"]
    assert zoo["implementation"] == "vllm" and zoo["caught"] and mutant.invariant_class in zoo["detected_classes"]
