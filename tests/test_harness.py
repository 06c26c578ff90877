"""The conformance harness end to end, through the `kvspec` command as users run it:
reports that validate, failures saved as traces that replay reproduces, crashes and
hangs survived, skipped checks reported as skipped, conformance vectors, and the
differential comparison with the reference (OBS-3)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import xmlschema
from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.adapters.mutants import MUTANTS
from kvspec.conformance.harness.engine_machine import engine_machine
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.reports.json_report import validate_json
from kvspec.conformance.reports.model import SCHEMAS
from kvspec.conformance.runs.tree import CONFORMANCE, INDEX, TREE
from kvspec.conformance.runs.tree import corpus as tree_corpus
from kvspec.spec.window import Policy

TESTS = Path(__file__).resolve().parent


def kvspec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], capture_output=True, text=True, cwd=cwd,
                          env={**__import__("os").environ, "PYTHONPATH": str(TESTS)})


def test_a_check_writes_a_json_and_a_junit_report_that_validate(tmp_path):
    result = kvspec("check", "--adapter", "reference", "--profile", "quick", "--seed", "1", "-n", "2",
                    "--run", "allocator P=4", "--run", "engine P=4 W=6", "--json", "r.json", "--junit", "r.xml",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads((tmp_path / "r.json").read_text())
    validate_json(document)
    assert [run["label"] for run in document["runs"]] == ["allocator P=4", "engine P=4 W=6 I=4"]
    assert all(run["steps"] > 100 for run in document["runs"])
    xmlschema.XMLSchema(SCHEMAS / "junit.xsd").validate(tmp_path / "r.xml")
    # the per-class table: every class checked, none violated, none skipped
    assert "window-liveness" in result.stdout and "why skipped" in result.stdout


def test_checks_an_adapter_cannot_observe_are_reported_skipped_not_passed(tmp_path):
    """[OBS-1] An engine that cannot show its tree: the checks that read it are skipped."""
    result = kvspec("check", "--adapter", "sample_adapters:NO_TREE_DUMP", "--run", "engine P=4 W=6", "--seed", "1",
                    "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "adapter lacks observable tree" in result.stdout
    classes = json.loads((tmp_path / "r.json").read_text())["runs"][0]["tallies"]
    assert classes["locks"]["checked"] == 0 and classes["locks"]["skipped"] > 0
    # window liveness judges positions below cache_protected_len against the tree: skipped too
    assert classes["window-liveness"]["checked"] == 0 and classes["window-liveness"]["skipped"] > 0
    assert classes["atomicity"]["checked"] > 0 and classes["atomicity"]["skipped"] == 0


@pytest.mark.parametrize("adapter, verdict", [("CRASHING", "crashed"), ("HANGING", "hung")])
def test_a_crash_or_a_hang_is_a_failure_with_a_trace_and_the_harness_goes_on(adapter, verdict, tmp_path):
    result = kvspec("check", "--adapter", f"sample_adapters:{adapter}", "--run", "engine P=4 W=6",
                    "--run", "engine P=16", "--step-timeout", "5", "-n", "2", "--seed", "1", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count(f": {verdict}") == 2, result.stdout  # both runs reported: the harness survived
    traces = sorted((tmp_path / "kvspec-traces").glob("*.jsonl"))
    assert len(traces) == 2
    replayed = kvspec("replay", str(traces[0]), "--adapter", f"sample_adapters:{adapter}", "--step-timeout", "5",
                      cwd=tmp_path)
    assert replayed.returncode == 1 and f"reproduced: {verdict}" in replayed.stdout, replayed.stdout
    on_reference = kvspec("replay", str(traces[0]), "--adapter", "reference", cwd=tmp_path)
    assert on_reference.returncode == 0, on_reference.stdout


def test_a_divergence_no_invariant_sees_is_caught_against_the_reference():
    """GreedyEvictionEngine evicts twice what it is asked: every invariant holds, so a
    plain run passes; with the reference as a shadow the free counts differ (OBS-3)."""
    from sample_adapters import GreedyEvictionAdapter

    quick = settings(max_examples=200, stateful_step_count=30, database=None, deadline=None,
                     phases=[Phase.generate])
    policy = Policy(decode_eviction_interval=4)
    plain = engine_machine(GreedyEvictionAdapter, 4, 6, policy)
    run_state_machine_as_test(seed(1)(plain), settings=quick)
    against_reference = engine_machine(GreedyEvictionAdapter, 4, 6, policy, shadow=load_adapter("reference"))
    with pytest.raises(AssertionError, match=r"\[OBS-3\].*differ: free_(full|swa)_pages"):
        run_state_machine_as_test(seed(1)(against_reference), settings=quick)


def test_which_free_page_an_allocation_returns_is_never_compared(tmp_path):
    """[MODEL-5] An implementation that hands out the highest free page first gets other
    slot ids than the reference for the same calls, yet conforms and agrees with the
    reference on everything the spec fixes (OBS-3)."""
    from sample_adapters import HighestPagesFirstAllocatorAdapter

    from kvspec.adapters.reference import ReferenceAllocatorAdapter

    slots = [adapter(16, 16, 4).alloc_extend([0], [4], [-1])
             for adapter in (HighestPagesFirstAllocatorAdapter, ReferenceAllocatorAdapter)]
    assert slots[0] != slots[1]
    result = kvspec("check", "--adapter", "sample_adapters:HIGHEST_PAGES_FIRST", "--differential", "--seed", "0",
                    "--run", "allocator P=4", "--run", "engine P=4 W=6 I=4", "--traces", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok, ") == 2, result.stdout


@pytest.mark.parametrize("run_label", ["allocator P=4", "engine P=4 W=6 I=4"])
def test_a_failure_of_the_adapter_compared_against_is_its_own_and_replays_on_it(run_label, tmp_path):
    """Differential mode checks the other adapter's invariants too. Where it fails itself
    (here a seeded bug compared against the reference: a stale mapping, which no
    observable of OBS-3 shows), the report says it is that adapter's finding, names it for
    the replay, and the saved trace reproduces there. (CI met this with SGLang's Python
    core compared against its Rust core: the trace was replayed on the Rust core, so it
    was reported as not reproducing.)"""
    result = kvspec("check", "--adapter", "reference", "--differential", "mutant-stale-mapping", "--profile",
                    "quick", "--seed", "0", "--run", run_label, "--shrink-seconds", "2", "--json", "r.json",
                    "--traces", "t", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the adapter compared against, mutant-stale-mapping, failed itself" in result.stdout, result.stdout
    assert "not deterministic" not in result.stdout and "--adapter mutant-stale-mapping" in result.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    validate_json(report)
    run = report["runs"][0]
    assert run["verdict"] == "crashed" and run["clauses"] == ["I5"] and run["replay_adapter"] == "mutant-stale-mapping"
    replayed = kvspec("replay", run["trace"], "--adapter", "mutant-stale-mapping", cwd=tmp_path)
    assert replayed.returncode == 1 and "[I5]" in replayed.stdout, replayed.stdout + replayed.stderr


def test_shrinking_stops_at_the_budget_and_the_report_says_so(tmp_path):
    """--shrink-seconds bounds shrinking; the run says how long it took to find the
    counterexample and how long it shrank, and that it stopped at the budget. (The
    mutant's counterexample shrinks for 20-60 s unbounded: 0.5 s cannot finish it. The
    quick profile finds it at most seeds, not all: seed 1 is one where it does, with the
    engine machine's rules as they are; benchmarks/results/quick-detection.md counts them.)"""
    result = kvspec("check", "--adapter", "mutant-leak-on-release", "--run", "engine P=4 W=7 I=1", "--profile",
                    "quick", "--seed", "1", "--shrink-seconds", "0.5", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "then shrunk for" in result.stdout and "stopped at its 0.5 s budget)" in result.stdout, result.stdout
    run = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    assert run["shrink_stopped_at_budget"] and run["shrink_budget_seconds"] == 0.5 and run["shrink_seconds"] >= 0.5
    assert run["first_failure_seconds"] > 0


def test_the_shrink_budget_defaults_to_the_profiles():
    from kvspec.conformance.harness.profiles import shrink_budget
    assert [shrink_budget(name) for name in ("quick", "ci", "deep")] == [30, 60, 300]
    with pytest.raises(ValueError, match="unknown profile"):
        shrink_budget("fast")


@pytest.mark.parametrize("slug", ["stale-mapping", "leak-on-release", "release-dead-range-as-full"])
def test_a_seeded_bug_exits_1_with_a_trace_that_replay_reproduces(slug, tmp_path):
    # One mutant per kind (allocator tier, engine tier, a crash): every mutant is run this
    # way, shrunk, by `kvspec zoo` in CI; tests/test_mutants.py checks each one's clause.
    mutant = MUTANTS[slug]
    # unshrunk: the first counterexample comes within a second, shrinking it takes 30-60 s
    # (the shrunk path is tested with LEAKY in test_cli.py)
    result = kvspec("check", "--adapter", f"mutant-{slug}", "--run", mutant.exposed_by.label, "--profile", "ci",
                    "--seed", "0", "--no-shrink", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "kept unshrunk)" in result.stdout and "then shrunk" not in result.stdout
    run = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    if mutant.invariant_class == "crash":  # no invariant sees it first: the step fails inside
        assert run["verdict"] == "crashed" and mutant.crash_message in run["message"], run["message"]
    else:
        assert mutant.clause in run["clauses"], run["message"]
    replayed = kvspec("replay", run["trace"], "--adapter", f"mutant-{slug}", cwd=tmp_path)
    assert replayed.returncode == 1 and "reproduced:" in replayed.stdout, replayed.stdout
    assert kvspec("replay", run["trace"], "--adapter", "reference", cwd=tmp_path).returncode == 0


# -- conformance vectors ----------------------------------------------------------------------

def test_the_committed_vectors_are_current(corpus):
    """vectors/conformance/ is what `kvspec vectors --out vectors/` writes now (its index
    names each file with its SHA-256), and the tree's one index lists every trace of the
    tree as it is: regenerate it after a change of the reference or the vectors, and
    index it again after a regression, divergence, test or example trace changes."""
    committed = json.loads((TREE / INDEX).read_text())
    written = json.loads((corpus / INDEX).read_text())
    conformance = [entry for entry in committed["vectors"] if entry["file"].startswith(f"{CONFORMANCE}/")]
    assert (committed["kvspec_vectors"], committed["seed"], conformance) == \
        (written["kvspec_vectors"], written["seed"], written["vectors"]), \
        "vectors/conformance/ is stale: run `kvspec vectors --out vectors/`"
    assert len(tree_corpus(TREE)) == len(committed["vectors"])  # every trace listed, as it is


def test_the_vectors_cover_the_walkthroughs_every_policy_and_both_tiers(corpus):
    names = {path.stem for path in corpus.rglob("*.jsonl")}
    assert {"walkthrough-4.3-chunked-prefill", "walkthrough-5-pd-decode-with-cached-prefix-12"} <= names
    for version in ("sglang-0.5.23", "design-margin", "drop-margin", "no-prefix-sharing"):
        assert any(name.startswith(f"lifecycle-{version}-P16") or name.startswith(f"lifecycle-{version}-P4")
                   for name in names), version
    assert {"allocator-P1-1", "allocator-P16-1"} <= names
    assert {"state-P1-W3-I4-G1-1", "state-P2-W5-I1-G4-1", "state-P4-W6-I4-G8-1"} <= names  # chapter 09
    index = json.loads((corpus / "index.json").read_text())
    assert len(index["vectors"]) == len(names)


def test_the_reference_replays_every_vector_in_full(corpus, tmp_path):
    result = kvspec("replay", str(corpus), "--adapter", "reference", "-n", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    total = len(list(corpus.rglob("*.jsonl")))
    assert f"{total} of {total} trace(s) replayed in full" in result.stdout


def test_a_sub_tree_replays_against_the_index_at_the_root(corpus, tmp_path):
    """`kvspec replay vectors/conformance/engine/block-pool/` replays that part of the tree,
    checked against the root's index (an altered vector there is found), and names each
    trace by its path under the directory it replays."""
    block_pool = corpus / CONFORMANCE / "engine" / "block-pool"
    result = kvspec("replay", str(block_pool), "--adapter", "reference", "-n", "2", cwd=tmp_path)
    total = len(list(block_pool.rglob("*.jsonl")))
    assert result.returncode == 0 and f"{total} of {total} trace(s) replayed in full" in result.stdout, result.stdout
    assert "ok   vllm-0.33-dense/walkthrough-vllm-7-scripted.jsonl: conforms" in result.stdout
    copy = tampered(corpus, tmp_path / "a")
    vector = copy / CONFORMANCE / "engine" / "block-pool" / "vllm-0.33-dense" / "walkthrough-vllm-7-scripted.jsonl"
    vector.write_text(vector.read_text() + "\n")  # the same trace, other bytes
    result = kvspec("replay", str(vector.parent), "--adapter", "reference", cwd=tmp_path)
    altered = "conformance/engine/block-pool/vllm-0.33-dense/walkthrough-vllm-7-scripted.jsonl was altered"
    assert result.returncode == 2 and altered in result.stderr, result.stderr


def test_an_implementation_that_diverges_fails_the_vectors(corpus, tmp_path):
    result = kvspec("replay", str(corpus), "--adapter", "sample_adapters:GREEDY_EVICTION", "-n", "2", cwd=tmp_path)
    assert result.returncode == 1 and "[OBS-3]" in result.stdout, result.stdout


def tampered(corpus: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    return copy


def test_a_vector_altered_missing_or_unlisted_is_an_error(corpus, tmp_path):
    altered = tampered(corpus, tmp_path / "a")
    vector = altered / CONFORMANCE / "engine" / "two-pool" / "sglang-0.5.23" / "walkthrough-4.3-chunked-prefill.jsonl"
    vector.write_text(vector.read_text().replace('"chunk":16', '"chunk":15', 1))
    missing = tampered(corpus, tmp_path / "m")
    (missing / CONFORMANCE / "allocator" / "allocator-P1-1.jsonl").unlink()
    unlisted = tampered(corpus, tmp_path / "u")
    (unlisted / "regressions").mkdir()
    shutil.copy(unlisted / CONFORMANCE / "allocator" / "allocator-P1-1.jsonl", unlisted / "regressions" / "extra.jsonl")
    for directory, problem in ((altered, "was altered"), (missing, "is listed but missing"),
                               (unlisted, "regressions/extra.jsonl is not listed")):
        result = kvspec("replay", str(directory), "--adapter", "reference", cwd=tmp_path)
        assert result.returncode == 2 and problem in result.stderr, result.stderr


def test_usage_errors_exit_2_with_a_message(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kvspec_trace": 1}\n')
    result = kvspec("replay", str(bad), "--adapter", "reference", cwd=tmp_path)
    assert result.returncode == 2 and "bad.jsonl line 1 (header)" in result.stderr
    result = kvspec("check", "--run", "no such run", cwd=tmp_path)
    assert result.returncode == 2 and "the runs are: allocator P=1" in result.stderr
    assert kvspec("check", "-n", "0", cwd=tmp_path).returncode == 2
    assert kvspec("replay", str(tmp_path / "nowhere"), cwd=tmp_path).returncode == 2


def test_output_piped_into_a_reader_that_stops_is_no_traceback(tmp_path):
    result = subprocess.run("kvspec check --adapter reference --run 'allocator P=4' --seed 0 | head -1", shell=True,
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.stdout.startswith("kvspec check: adapter reference") and result.stdout.count("\n") == 1
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


def test_freeing_a_sequence_removes_it_by_position_not_by_value():
    """Two empty sequences are equal; freeing the second must keep the first (the same
    object), or two drivers of a differential run, whose rows differ, drift apart."""
    from kvspec.conformance.harness.allocator_driver import AllocatorDriver, Sequence
    from kvspec.conformance.harness.trace import TraceStep
    from kvspec.spec.models import TWO_POOL

    driver = AllocatorDriver(load_adapter("reference").make_allocator(16, 16, 1), 1, frozenset(TWO_POOL.observables))
    driver.sequences += [Sequence([]), Sequence([])]  # what a sequence freed from the front to its end leaves
    first = driver.sequences[0]
    assert driver.sequences[0] == driver.sequences[1]
    driver.apply(TraceStep("free_sequence", {"sequence": 1, "set_shaped": False}))
    assert len(driver.sequences) == 1 and driver.sequences[0] is first
