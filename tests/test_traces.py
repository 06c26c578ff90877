"""Traces (conformance/harness/trace.py): the JSON Lines format, its schema, and a loader that
turns every malformed file into a TraceError naming the line and the fault, never a
traceback from inside, and never runs anything a file contains."""

import json
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
