"""Hostile input, round 2 (issue 36): what a trace, a corpus or its header says wrong by
itself is the trace's fault (exit 2, the line named), never the implementation's or the
adapter's; JSON is read the one way every language reads it; the harness's work is
bounded by what it reads. The replay's own verdicts and the checks are in
test_hostile_round2_replay.py.

Each test names the defect of the probe report it keeps (D3, D9, ...). Errors found
before any worker starts are checked through `main()` in this process."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from kvspec.conformance.cli import main
from kvspec.conformance.harness import trace as trace_module
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay, with_expectations
from kvspec.conformance.harness.trace import Trace, TraceError, engine_config_json, parse
from kvspec.conformance.runs import tree
from kvspec.conformance.runs.tree import INDEX, corpus
from kvspec.conformance.runs.vectors import walkthroughs
from kvspec.spec.models import BLOCK_POOL, TWO_POOL, TWO_POOL_STATE, model_for
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import VLLM_0_33, Policy

DECODE_AND_FINISH = "walkthrough-4.4-decode-and-finish"
NAMES = ("walkthrough-4.3-chunked-prefill", "walkthrough-5-pd-decode-with-cached-prefix-12")


def vector(name: str = DECODE_AND_FINISH) -> Trace:
    """A worked example with the reference's expectations, as the corpus holds it."""
    return with_expectations(walkthroughs()[name], load_adapter("reference"))


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def write_corpus(directory: Path, names=NAMES) -> Path:
    """A corpus as `kvspec vectors` writes one: the vectors and an index with each file's
    step count and SHA-256."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in names:
        path = vector(name).save(directory / f"{name}.jsonl")
        entries.append({"file": path.name, "steps": len(vector(name).steps),
                        "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    (directory / INDEX).write_text(json.dumps({"kvspec_vectors": 1, "seed": 0, "vectors": entries}))
    return directory


# -- D3: a number written with a fraction or an exponent --------------------------------------------

@pytest.mark.parametrize("old, new, field", [
    ('"chunk":16,', '"chunk":16.0,', "chunk"), ('"trim":0}', '"trim":0.0}', "trim"),
    ('"page_size":4,', '"page_size":4.0,', "page_size"), ('"size_full":128,', '"size_full":1.28e2,', "size_full"),
])
def test_an_integral_number_written_as_a_float_is_the_integer_it_is(old, new, field):
    """JSON Schema counts 16.0 as an integer, so the schema that other languages replay
    against accepts it; it used to reach the implementation as a float (the reference
    crashed on `16.0` as a slice index, exit 1; `4.0` as a page size blamed the adapter,
    exit 2). Read as the integer, the trace is the vector it was, and conforms."""
    trace = parse(edited(vector().dumps(), old, new))
    values = [trace.config[field]] if field in trace.config else [s.args[field] for s in trace.steps if field in s.args]
    assert values and all(type(value) is int for value in values), values
    assert trace == vector()
    assert replay(trace, load_adapter("reference"), judge_trace=True).conforms


@pytest.mark.parametrize("old, new, field", [
    ('"chunk":16,', '"chunk":16.0000000000000000001,', "chunk"), ('"trim":0}', '"trim":1e-400}', "trim"),
    ('"chunk":16,', '"chunk":16.5,', "chunk"), ('"chunk":16,', '"chunk":1e400,', "chunk"),
])
def test_a_number_that_is_no_integer_stays_refused_even_where_a_float_would_round_to_one(old, new, field):
    """16.0000000000000000001 and 1e-400 are no integers, but as Python floats they are
    16.0 and 0.0, which the schema accepts (they used to pass as floats): they must not
    pass as the integer they round to. 16.5 and 1e400 were refused and still are."""
    with pytest.raises(TraceError, match=f"line (3|19): args/{field}"):
        parse(edited(vector().dumps(), old, new))


def test_an_integral_float_trace_replays_through_the_command(tmp_path, capsys):
    path = tmp_path / "float-chunk.jsonl"
    path.write_text(edited(vector().dumps(), '"chunk":16,', '"chunk":16.0,'))
    status, out, err = run_main(capsys, "replay", str(path))
    assert status == 0 and "conforms: all 19 steps" in out, out + err


# -- D29: a key twice in one object ----------------------------------------------------------------

@pytest.mark.parametrize("old, new, line, key", [
    ('{"op":"prefill_chunk"', '{"op":"abort","op":"prefill_chunk"', 3, "op"),
    ('"chunk":16,', '"chunk":16,"chunk":15,', 3, "chunk"),
    ('"tier":"engine"', '"tier":"allocator","tier":"engine"', 1, "tier"),
])
def test_a_key_twice_in_a_trace_line_is_refused_naming_the_line_and_the_key(old, new, line, key):
    """Python's json kept the last one silently (the trace replayed as 15, or conformed);
    parsers of other languages keep the first or refuse: one trace, two meanings."""
    with pytest.raises(TraceError, match=f"line {line}: key '{key}' appears twice"):
        parse(edited(vector().dumps(), old, new))


def test_a_key_twice_in_an_index_is_refused(tmp_path, capsys):
    directory = write_corpus(tmp_path / "corpus")
    index = directory / INDEX
    index.write_text(edited(index.read_text(), '{"kvspec_vectors": 1,', '{"kvspec_vectors": 2, "kvspec_vectors": 1,'))
    status, out, err = run_main(capsys, "replay", str(directory))
    assert status == 2 and "index.json: key 'kvspec_vectors' appears twice" in err, out + err


# -- D9, D10, D32: what a trace shows wrong by itself ---------------------------------------------

SCHEDULER_HEADER = {"kvspec_trace": 1, "kvspec_version": "0", "tier": "scheduler", "adapter": "reference",
                    "config": {"page_size": 4, "window": 7, "pages": 24, "groups": ["full", "swa"],
                               "max_batch_size": 2, "max_scheduled_tokens": 8}}


def scheduler_trace(outputs: int, max_new_tokens: int) -> str:
    submit = {"op": "submit", "args": {"rid": "a", "prompt": [1, 1, 1, 1], "max_new_tokens": max_new_tokens,
                                       "outputs": [5] * outputs}}
    return "\n".join(json.dumps(line) for line in (SCHEDULER_HEADER, submit, {"op": "drain", "args": {}}))


def test_a_submission_with_more_outputs_than_its_max_new_tokens_is_a_trace_error():
    """[SCHED-4] D9: the driver returned outputs past the limit, and the reference
    scheduler was reported breaking SCHED-4 (exit 1). The schema says "no more than
    max_new_tokens" but cannot check it."""
    with pytest.raises(TraceError, match="line 2: request 'a' has 10 outputs, more than its max_new_tokens 1"):
        parse(scheduler_trace(10, 1))
    assert replay(parse(scheduler_trace(3, 3)), load_adapter("reference")).conforms  # as many as allowed


def test_expectations_of_another_memory_model_than_the_headers_are_a_trace_error():
    """[OBS-3] D10: a header naming vllm-0.33 (the shared block pool) over two-pool
    expectations was reported as the implementation's OBS-3 (free_full_pages expected
    32, observed None). The same header with the block pool's expectations is fine."""
    text = vector().dumps().replace('"version":"sglang-0.5.23"', '"version":"vllm-0.33"')
    with pytest.raises(TraceError, match="line 2: expect names free_full_pages, free_swa_pages, which the block-pool "
                                         "memory model of the header's policy version vllm-0.33 does not fix"):
        parse(text)
    config = {**vector().config, "policy": {**vector().config["policy"], "version": VLLM_0_33}}
    own = with_expectations(Trace("engine", config, "reference", walkthroughs()[DECODE_AND_FINISH].steps),
                            load_adapter("reference"))
    assert "free_blocks" in own.steps[0].expect and parse(own.dumps()) == own


@pytest.mark.parametrize("model, config", [
    (TWO_POOL, EngineConfig(4, 8, 128, 64, 8)),
    (BLOCK_POOL, EngineConfig(4, 8, 128, 64, 8, Policy(VLLM_0_33, 4))),
    (TWO_POOL_STATE, EngineConfig(4, 8, 128, 64, 2, state_slots=5, state_grid=4)),
])
def test_a_models_fixed_observables_are_the_keys_it_declares(model, config):
    """What line_problem allows a trace to expect is what the model's fixed_observables gives."""
    reference = load_adapter("reference").for_version(config.policy.version)
    snapshot = reference.make_engine(config).snapshot()
    assert model_for(reference.model, config) is model
    assert tuple(model.fixed_observables(snapshot, "ok")) == model.fixed


@pytest.mark.parametrize("changes, expected", [
    ({"max_requests": 2**31 - 1}, "(max_requests + 1) x (size_full + page_size) = "),
    ({"size_swa": 2**31 - 4}, "size_full + size_swa + "),
    ({"state_slots": 2**31 - 1, "state_grid": 4}, "+ state_slots = "),
    ({"state_slots": 17, "state_grid": 1}, "state_grid must be a multiple of the page size 4 (STATE-3; got 1)"),
])
def test_a_configuration_no_engine_builds_or_the_spec_rejects_is_a_trace_error(changes, expected, tmp_path, capsys):
    """D32: max_requests 2**31-1 (a request table of 2^38 slots) and a checkpoint grid of
    one token at page size 4 (STATE-3 forbids it) were reported as the adapter's error
    ("adapter 'reference': make_engine(...) raised ..."), and an adapter that does not
    validate would have been driven with them."""
    header, *steps = vector().dumps().splitlines()
    header = json.loads(header)
    header["config"].update(changes)
    path = tmp_path / "config.jsonl"
    path.write_text("\n".join([json.dumps(header), *steps]))
    status, out, err = run_main(capsys, "replay", str(path))
    assert status == 2 and "config.jsonl line 1 (header): invalid config" in err and expected in err, out + err
    assert "adapter 'reference'" not in err


def test_the_state_grid_a_trace_may_name_is_the_one_the_reference_builds():
    """STATE-3 at parse time and in the reference are one rule (spec.state.validate_state_grid)."""
    config = engine_config_json(EngineConfig(4, 8, 128, 64, 2, state_slots=5, state_grid=8))
    assert parse(Trace("engine", config, "reference", ()).dumps()).config["state_grid"] == 8


# -- D21: a vector named through a link ---------------------------------------------------------------

@pytest.mark.parametrize("link_name", ["v.jsonl", f"{NAMES[0]}.jsonl"])
def test_a_vector_named_through_a_link_is_checked_against_the_index_beside_the_file(tmp_path, capsys, link_name):
    """corpus() looked for index.json beside the link, not beside the file it leads to:
    an altered vector replayed through a link was replayed unchecked."""
    directory = write_corpus(tmp_path / "v")
    altered = directory / f"{NAMES[0]}.jsonl"
    altered.write_text(edited(altered.read_text(), '"chunk":16', '"chunk":15'))
    (tmp_path / "link").mkdir()
    link = tmp_path / "link" / link_name
    os.symlink(os.path.relpath(altered, link.parent), link)
    status, out, err = run_main(capsys, "replay", str(link))
    assert status == 2 and f"{NAMES[0]}.jsonl was altered" in err, out + err


# -- D23: bounds on what the harness reads --------------------------------------------------------------

EVICT = '{"op":"evict","args":{"full_tokens":0,"swa_tokens":0}}\n'


def test_a_trace_of_more_steps_than_the_bound_is_refused_before_its_steps_are_parsed(monkeypatch):
    """The 64 MiB bound let one file hold a million steps: 220 s and 1.4 GB in the harness
    before the first step ran. Refused before any line is parsed as JSON."""
    header, bound = vector().dumps().split("\n")[0] + "\n", trace_module.MAX_STEPS
    parsed = []
    monkeypatch.setattr(trace_module, "read_json", lambda text: parsed.append(text) or json.loads(text))
    with pytest.raises(TraceError, match=f"{bound + 1} steps, more than the {bound} kvspec reads of one trace"):
        parse(header + EVICT * (bound + 1))
    assert not parsed


def test_a_trace_of_as_many_steps_as_the_bound_is_read():
    """A long decode (the probe's 100,000 steps) fits: its repeated lines are validated once."""
    header, bound = vector().dumps().split("\n")[0] + "\n", trace_module.MAX_STEPS
    assert len(parse(header + EVICT * bound).steps) == bound


@pytest.mark.parametrize("bound, value, expected", [
    ("MAX_CORPUS_STEPS", 10, "its traces hold more than 10 steps"),
    ("MAX_CORPUS_BYTES", 2000, "its traces hold more than 2000 bytes"),
])
def test_a_corpus_beyond_its_bounds_is_refused_before_any_trace_is_parsed(tmp_path, monkeypatch, bound, value,
                                                                          expected):
    """A corpus was read and parsed whole before the first trace ran: ten files at the
    per-file bound held about 14 GB. The two vectors here hold 11 steps and 2.5 KB."""
    directory = write_corpus(tmp_path / "corpus")
    monkeypatch.setattr(tree, bound, value)
    monkeypatch.setattr(tree, "load", lambda *args: pytest.fail("a trace was parsed"))
    with pytest.raises(TraceError, match=expected):
        corpus(directory)
