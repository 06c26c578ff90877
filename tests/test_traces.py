"""Traces (conformance/harness/trace.py): the JSON Lines format, its schema, and a loader that
turns every malformed file into a TraceError naming the line and the fault, never a
traceback from inside, and never runs anything a file contains."""

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from kvspec.conformance.harness.trace import OPERATIONS, SCHEMA, Trace, TraceError, TraceStep, load, parse
from kvspec.conformance.runs.vectors import walkthroughs

ALLOCATOR = Trace("allocator", {"page_size": 4, "size_full": 16, "size_swa": 8}, "reference", (
    TraceStep("new_sequence", {"length": 5}, expect={"outcome": "ok", "free_full_pages": 2, "free_swa_pages": 0}),
    TraceStep("fork", {"parent": 0, "prefix_pages": 1, "length": 3, "tail": None}),
    TraceStep("free_padding_page", {}, violated=("ALLOC-6",), message="accepted"),
), seed=7, label="allocator P=4")
ENGINE = walkthroughs()["walkthrough-4.4-decode-and-finish"]


def test_the_schema_is_a_valid_draft_2020_12_schema_with_a_versioned_id():
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$id"].endswith("/trace/1")


@pytest.mark.parametrize("trace", [ALLOCATOR, ENGINE], ids=["allocator", "engine"])
def test_a_trace_survives_a_round_trip(trace, tmp_path):
    assert parse(trace.dumps()) == trace
    assert load(trace.save(tmp_path / "t.jsonl")) == trace


def test_the_schema_knows_every_operation_of_both_drivers():
    from kvspec.conformance.harness.allocator_driver import AllocatorDriver
    from kvspec.conformance.harness.protocol import PARAMETERS

    assert all(callable(getattr(AllocatorDriver, op)) for op in OPERATIONS["allocator"])
    assert set(OPERATIONS["engine"]) == {*PARAMETERS, "drain"}


def lines(trace: Trace) -> list[dict]:
    return [json.loads(line) for line in trace.dumps().splitlines()]


def text(documents: list) -> str:
    return "\n".join(json.dumps(d) for d in documents)


def with_header(**changes) -> str:
    header, *steps = lines(ALLOCATOR)
    return text([{**header, **changes}, *steps])


def with_step(index: int, step: dict) -> str:
    documents = lines(ALLOCATOR)
    documents[index] = step
    return text(documents)


MALFORMED = {
    # name: (trace text, what the error must say)
    "empty": ("", "empty"),
    "not JSON": ('{"kvspec_trace": 1,', "line 1: not JSON"),
    "not a header": ('{"op": "drain", "args": {}}', "not a kvspec trace header"),
    "a header that is a list": ("[1, 2]", "not a kvspec trace header"),
    "a future format": (with_header(kvspec_trace=2), "trace format version 2"),
    "an unknown tier": (with_header(tier="gpu"), "'gpu' is not one of"),
    "a missing config field": (with_header(config={"page_size": 4, "size_full": 16}), "'size_swa' is a required"),
    "page size 0": (with_header(config={"page_size": 0, "size_full": 16, "size_swa": 8}), "config/page_size"),
    "sizes not page multiples": (with_header(config={"page_size": 4, "size_full": 18, "size_swa": 8}),
                                 "invalid config: size_full"),
    "an unknown operation": (with_step(1, {"op": "rm_rf", "args": {}}), "line 2: unknown allocator operation 'rm_rf'"),
    "an engine operation in an allocator trace": (with_step(1, {"op": "admit", "args": {"rid": "r", "prompt": [1]}}),
                                                  "unknown allocator operation 'admit'"),
    "a negative length": (with_step(1, {"op": "new_sequence", "args": {"length": -1}}), "line 2: args/length"),
    "a missing argument": (with_step(1, {"op": "decode", "args": {}}), "'sequence' is a required property"),
    "an extra argument": (with_step(1, {"op": "decode", "args": {"sequence": 0, "slots": [3]}}), "'slots' was unexpected"),
    "a string for a number": (with_step(1, {"op": "decode", "args": {"sequence": "0"}}), "is not of type 'integer'"),
    "an unknown step field": (with_step(1, {"op": "drain", "args": {}, "eval": "1"}), "'eval' was unexpected"),
    "a bad outcome": (with_step(1, {"op": "drain", "args": {}, "expect": {"outcome": "maybe"}}), "line 2: expect/outcome"),
    "a bad clause id": (with_step(1, {"op": "drain", "args": {}, "violated": ["i8; rm"]}), "violated/0"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_trace_gets_a_clear_error(name):
    trace_text, expected = MALFORMED[name]
    with pytest.raises(TraceError) as error:
        parse(trace_text, "bad.jsonl")
    assert expected in str(error.value) and "bad.jsonl" in str(error.value)


def test_an_engine_trace_with_an_unknown_policy_or_window_0_is_refused():
    header, *steps = lines(ENGINE)
    for config, expected in (({**header["config"], "policy": {"version": "vllm", "decode_eviction_interval": 1}},
                              "unknown policy version 'vllm'"),
                             ({**header["config"], "window": 0}, "config/window")):
        with pytest.raises(TraceError, match=expected):
            parse(text([{**header, "config": config}, *steps]))


def test_unreadable_files_get_clear_errors(tmp_path):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not UTF-8"):
        load(binary)
    with pytest.raises(TraceError, match="cannot read trace"):
        load(tmp_path / "missing.jsonl")


MARKER = Path("/tmp/kvspec-trace-loader-executed-code")
PAYLOADS = [f"__import__('pathlib').Path('{MARKER}').touch()", "!!python/object/apply:os.system ['touch x']",
            "${{7*7}}", "'; DROP TABLE traces; --"]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzzed_traces_load_or_raise_trace_error_and_never_run_code(data):
    """Mutations of valid traces (a field replaced by random JSON or a code-looking
    string, a line dropped, duplicated or cut) and random text: the loader returns a
    Trace or raises TraceError, nothing else, and no payload is ever executed."""
    documents = lines(data.draw(st.sampled_from([ALLOCATOR, ENGINE])))
    values = st.recursive(st.none() | st.booleans() | st.integers(-2, 2**70) | st.text(max_size=8)
                          | st.sampled_from(PAYLOADS), lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
    index = data.draw(st.integers(0, len(documents) - 1))
    mutation = data.draw(st.sampled_from(["replace field", "replace arg", "drop line", "duplicate", "cut", "random"]))
    document = documents[index]
    if mutation == "replace field":
        document[data.draw(st.sampled_from(sorted(document)))] = data.draw(values)
    elif mutation == "replace arg" and isinstance(document.get("args"), dict) and document["args"]:
        document["args"][data.draw(st.sampled_from(sorted(document["args"])))] = data.draw(values)
    elif mutation == "drop line":
        del documents[index]
    elif mutation == "duplicate":
        documents.insert(index, document)
    trace_text = text(documents)
    if mutation == "cut":
        trace_text = trace_text[:data.draw(st.integers(0, len(trace_text)))]
    elif mutation == "random":
        trace_text = data.draw(st.text(max_size=200))
    try:
        parsed = parse(trace_text)
    except TraceError:
        pass
    else:
        assert isinstance(parsed, Trace) and all(step.op in OPERATIONS[parsed.tier] for step in parsed.steps)
    assert not MARKER.exists()


def one_version_adapter(**declared):
    from kvspec.adapters.reference import ReferenceEngineAdapter
    return type("ONE_VERSION", (), {"name": "one-version", "policy_version": "sglang-0.5.23",
                                    "capabilities": ("page_size_1", "page_size_gt_1"),
                                    "make_engine": ReferenceEngineAdapter, **declared})


def test_a_trace_of_a_policy_version_the_adapter_does_not_implement_is_skipped():
    """An adapter implements its policy_version alone unless it declares policy_versions;
    the reference declares every two-pool version. (SGLang's adapter refused to build an
    engine of another version, so a replay of the whole corpus stopped at the first one.)"""
    from kvspec.conformance.harness.protocol import load_adapter, validate
    from kvspec.conformance.harness.replay import unmet_requirements

    other = Trace("engine", {"page_size": 4, "window": 6, "size_full": 64, "size_swa": 32, "max_requests": 4,
                             "policy": {"version": "design-margin", "decode_eviction_interval": 4}}, "x",
                  (TraceStep("admit", {"rid": "r1", "prompt": [1, 2, 3]}),))
    assert unmet_requirements(other, validate(one_version_adapter(), "x")) == [
        "policy version design-margin (it implements sglang-0.5.23)"]
    both = validate(one_version_adapter(policy_versions=("sglang-0.5.23", "design-margin")), "x")
    assert unmet_requirements(other, both) == [] and both.policy_versions == ("sglang-0.5.23", "design-margin")
    assert unmet_requirements(other, load_adapter("reference")) == []
    assert unmet_requirements(other, load_adapter("mutant-leak-on-release")) == []


@pytest.mark.parametrize("versions, says", [(("design-margin",), "must include its policy_version 'sglang-0.5.23'"),
                                            (("sglang-0.5.23", "vllm-0.32"), "are no policy versions")])
def test_bad_policy_versions_are_a_clear_adapter_error(versions, says):
    from kvspec.conformance.harness.protocol import AdapterError, validate

    with pytest.raises(AdapterError, match=says):
        validate(one_version_adapter(policy_versions=versions), "x")


def test_an_allocator_trace_with_a_misuse_needs_refuses_misuse():
    from kvspec.adapters.reference import ReferenceAllocatorAdapter
    from kvspec.conformance.harness.protocol import validate
    from kvspec.conformance.harness.replay import unmet_requirements

    trace = Trace("allocator", {"page_size": 4, "size_full": 16, "size_swa": 12}, "x",
                  (TraceStep("free_padding_page", {}),))
    lacking = validate(type("NO_MISUSE", (), {"name": "n", "policy_version": "sglang-0.5.23",
                                              "capabilities": ("page_size_gt_1",),
                                              "make_allocator": ReferenceAllocatorAdapter}), "x")
    assert unmet_requirements(trace, lacking) == ["capability refuses_misuse"]


# -- front matter: clauses, needs, violates -----------------------------------------------------

def test_front_matter_survives_a_round_trip_and_a_trace_without_it_writes_as_before():
    annotated = Trace(ENGINE.tier, ENGINE.config, ENGINE.adapter, ENGINE.steps, clauses=("I9", "LIFE-3"),
                      needs=("page_size_gt_1",), violates=("I9", "crashed"))
    assert parse(annotated.dumps()) == annotated
    assert parse(ENGINE.dumps()).needs is None and not {"clauses", "needs", "violates"} & set(ENGINE.header())


@pytest.mark.parametrize("field, value, says", [
    ("clauses", ["I9", "NOPE-99"], "clauses names NOPE-99, which the spec has no clause of"),
    ("violates", ["XYZ-77"], "violates names XYZ-77, which is neither a clause of the spec nor crashed nor hung"),
    ("needs", ["page_size_gt_1", "time_travel"], "needs names time_travel, which is no capability kvspec knows"),
    ("needs", ["Page-Size"], "line 1 (header): needs/0: 'Page-Size' does not match"),
    ("clauses", ["I9", "I9"], "line 1 (header): clauses: ['I9', 'I9'] has non-unique elements"),
])
def test_front_matter_naming_what_does_not_exist_is_a_trace_error_naming_the_line(field, value, says):
    """[the capability table] A clause id the spec's chapters do not have, a capability
    kvspec.conformance.harness.declarations.Capability does not list: refused on parse."""
    header, *steps = ENGINE.dumps().splitlines()
    header = {**json.loads(header), field: value}
    with pytest.raises(TraceError, match=re.escape(says)) as refused:
        parse("\n".join([json.dumps(header), *steps]), "t.jsonl")
    assert str(refused.value).startswith("t.jsonl line 1 (header): ")


def test_every_capability_is_derived_from_steps_or_said_why_not():
    """needs.derived_needs has a rule for every capability of the table but those
    NOT_FROM_STEPS names, with its reason."""
    from kvspec.conformance.harness.declarations import Capability
    from kvspec.conformance.harness.needs import NOT_FROM_STEPS, derived_needs

    page_1 = {"page_size": 1, "size_full": 16, "size_swa": 12}
    misuse = Trace("allocator", page_1, "x", (TraceStep("free_group_begin", {}), TraceStep("free_padding_page", {}),
                                              TraceStep("free_full_with_live_peer", {"sequence": 0, "position": 0}),
                                              TraceStep("free_swa_of_released", {"sequence": 0}),
                                              TraceStep("fork", {"parent": 0, "prefix_pages": 0, "length": 2,
                                                                 "tail": 1})))
    state = Trace("engine", {**ENGINE.config, "state_slots": 5, "state_grid": 4}, "x",
                  (TraceStep("finish", {"rid": "r", "trim": 1}), TraceStep("pd_admit", {"rid": "s", "prompt": [1],
                                                                                      "first_output": 2}),
                   TraceStep("prefill_batch", {"chunks": [{"rid": "s", "chunk": 1, "token": 1}]}),
                   TraceStep("finish_batch", {"finishes": [{"rid": "s", "trim": 0}]}), TraceStep("flush", {}),
                   TraceStep("match", {"prompt": [1]})))
    state = Trace("engine", {**state.config, "window": 6, "layout": ["full"]}, "x", state.steps)  # W > P, W % P = 2: at risk
    scheduler = Trace("scheduler", {"page_size": 4, "window": 7, "pages": 2, "groups": ["full", "swa", "state"],
                                    "max_batch_size": 2, "max_scheduled_tokens": 8}, "x",
                      (TraceStep("submit", {"rid": "a", "prompt": [1] * 16, "max_new_tokens": 4, "outputs": [1]}),))
    derived = {*derived_needs(misuse), *derived_needs(state), *derived_needs(scheduler)}
    assert derived | set(NOT_FROM_STEPS) == set(Capability) and not derived & set(NOT_FROM_STEPS)


def test_a_header_that_says_it_needs_a_capability_is_skipped_without_it_though_its_steps_would_not():
    """Replay reads `needs` from the header: a trace whose steps need nothing beyond the
    page size, whose header says it needs atomic_alloc_decode (as a divergence of a
    failed alloc_decode means what it records only with it), is skipped by an adapter
    without it; the same trace without `needs` has them derived, and replays."""
    from dataclasses import replace

    from kvspec.conformance.harness.protocol import load_adapter
    from kvspec.conformance.harness.replay import unmet_requirements

    reference = load_adapter("reference")
    lacking = replace(reference, capabilities=reference.capabilities - {"atomic_alloc_decode"})
    said = parse(Trace(ENGINE.tier, ENGINE.config, ENGINE.adapter, ENGINE.steps,
                       needs=("page_size_gt_1", "atomic_alloc_decode")).dumps())
    assert unmet_requirements(said, lacking) == ["capability atomic_alloc_decode"]
    assert unmet_requirements(said, reference) == []
    hand_written = parse(ENGINE.dumps())
    assert hand_written.needs is None and unmet_requirements(hand_written, lacking) == []
    without_page_size = replace(reference, capabilities=reference.capabilities - {"page_size_gt_1"})
    assert unmet_requirements(hand_written, without_page_size) == ["capability page_size_gt_1"]  # derived


def test_a_skip_by_the_header_is_reported_as_a_skip_by_the_command(tmp_path, capsys):
    """`kvspec replay` skips, and says why, a vector whose header needs what the adapter
    lacks (the minimal allocator of docs/writing-an-adapter.md has no swa_tail), though
    the same vector without `needs` replays in full."""
    import shutil

    from kvspec.conformance.cli import main
    from kvspec.conformance.runs.tree import TREE

    vector = TREE / "conformance" / "allocator" / "allocator-P1-1.jsonl"
    header, *steps = vector.read_text().splitlines()
    path = tmp_path / "needs-swa-tail.jsonl"
    path.write_text("\n".join([json.dumps({**json.loads(header), "needs": ["page_size_1", "swa_tail"]}), *steps]))
    minimal = ["--adapter", "docs.examples.minimal_allocator:ADAPTER", "--allow-skipped"]
    assert main(["replay", str(path), *minimal]) == 0
    out = capsys.readouterr().out
    assert "skip needs-swa-tail.jsonl: adapter lacks capability swa_tail" in out and "0 of 0 trace(s)" in out
    shutil.copy(vector, path)
    assert main(["replay", str(path), *minimal]) == 0
    assert "ok   needs-swa-tail.jsonl: conforms" in capsys.readouterr().out


def test_the_front_matter_kvspec_writes_is_what_its_steps_need_and_what_ran():
    """[OBS-3] with_front_matter: needs from the steps, clauses from the reference's tally
    (every I-clause of the two-pool model is checked after a step; OBS-3 for the expect
    lines; LIFE-1 for a refused step), violates as given."""
    from kvspec.conformance.harness.front_matter import with_front_matter
    from kvspec.conformance.harness.needs import derived_needs
    from kvspec.conformance.harness.protocol import load_adapter
    from kvspec.conformance.harness.replay import with_expectations

    reference = load_adapter("reference")
    trace = with_front_matter(with_expectations(ENGINE, reference), reference, violates=("I9",))
    assert trace.needs == derived_needs(ENGINE) == ("page_size_gt_1",)
    assert {"OBS-3", *(f"I{n}" for n in range(1, 17))} <= set(trace.clauses) and "LIFE-1" not in trace.clauses
    assert trace.violates == ("I9",) and parse(trace.dumps()) == trace
    refused = Trace(ENGINE.tier, ENGINE.config, "x", (TraceStep("decode", {"rid": "r", "token": 1}, refuse=True),))
    assert "LIFE-1" in with_front_matter(refused, reference).clauses
    assert with_front_matter(refused, None).clauses == ()
