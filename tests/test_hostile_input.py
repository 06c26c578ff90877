"""Hostile input and a hostile implementation (issue 23): every probe a hostile but fair
user tried, kept as a test. Bad input (a trace, an index, an option, an adapter module)
exits 2 with a message naming what is wrong and how to fix it, never a traceback; a
failure of the implementation exits 1 with its trace; `kvspec replay` reads nothing
outside the corpus and at most a bound per file.

Errors found before any worker starts are checked through `main()` in this process
(a traceback there would fail the test as an exception); what needs workers runs the
`kvspec` command. A worker's memory bound and interrupts (items 6 and 9) are in
test_worker_lifetime.py."""

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from kvspec.conformance.cli import main
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import with_expectations
from kvspec.conformance.harness.trace import Trace, TraceError, TraceStep, load, parse
from kvspec.conformance.runs.tree import INDEX
from kvspec.conformance.runs.vectors import walkthroughs

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
NAMES = ("walkthrough-4.3-chunked-prefill", "walkthrough-5-pd-decode-with-cached-prefix-12")


def kvspec(*args: str, cwd: Path, timeout: float = 300, **options) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=timeout,
                          **options)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def write_corpus(directory: Path, traces: dict[str, Trace] | None = None) -> Path:
    """A small corpus as `kvspec vectors` writes one: traces with the reference's
    expectations and an index with each file's step count and SHA-256."""
    import hashlib

    directory.mkdir(parents=True, exist_ok=True)
    reference = load_adapter("reference")
    traces = traces or {name: walkthroughs()[name] for name in NAMES}
    entries = []
    for name, trace in traces.items():
        path = with_expectations(trace, reference).save(directory / f"{name}.jsonl")
        entries.append({"file": path.name, "steps": len(load(path).steps),
                        "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    (directory / INDEX).write_text(json.dumps({"kvspec_vectors": 1, "seed": 0, "vectors": entries}))
    return directory


def edit_index(directory: Path, edit) -> Path:
    index = json.loads((directory / INDEX).read_text())
    edit(index)
    (directory / INDEX).write_text(json.dumps(index))
    return directory


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus")


# -- 1. the index and the files of a corpus ------------------------------------------------------

@pytest.mark.parametrize("name", ["/dev/zero", "../outside.jsonl", "../../etc/passwd", "sub/x.jsonl", ".hidden.jsonl",
                                  7, None])
def test_an_index_entry_outside_the_corpus_or_not_a_name_is_refused_unread(corpus, capsys, name):
    (corpus.parent / "outside.jsonl").write_text("never read")
    edit_index(corpus, lambda index: index["vectors"][0].update(file=name))
    status, _, err = run_main(capsys, "replay", str(corpus))
    assert status == 2 and "not a kvspec vector index" in err and "vectors/0/file" in err, err


def limit_address_space():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def test_a_link_in_the_corpus_is_not_followed(corpus):
    """A listed vector that is a link to /dev/zero (or anywhere outside) is refused, not
    read: reading /dev/zero whole grew the process until the kernel killed it (here its
    address space is capped, so a regression fails this test, not the machine)."""
    victim = corpus / f"{NAMES[0]}.jsonl"
    victim.unlink()
    victim.symlink_to("/dev/zero")
    result = kvspec("replay", str(corpus), cwd=corpus.parent, timeout=120, preexec_fn=limit_address_space)
    assert result.returncode == 2 and "is a symbolic link, not a file" in result.stderr, result.stderr


def test_a_fifo_or_a_directory_in_place_of_a_vector_is_refused_without_blocking(corpus):
    fifo = corpus / f"{NAMES[0]}.jsonl"
    content = fifo.read_bytes()
    fifo.unlink()
    os.mkfifo(fifo)
    (corpus / f"{NAMES[1]}.jsonl").unlink()
    (corpus / f"{NAMES[1]}.jsonl").mkdir()
    result = kvspec("replay", str(corpus), cwd=corpus.parent, timeout=120)  # a FIFO opened for reading blocks
    assert result.returncode == 2 and "is a FIFO, not a file" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    result = kvspec("replay", str(fifo), cwd=corpus.parent, timeout=120)  # named alone, too
    assert result.returncode == 2 and "is a FIFO, not a file" in result.stderr, result.stderr
    fifo.unlink()
    fifo.write_bytes(content)
    result = kvspec("replay", str(corpus), cwd=corpus.parent, timeout=120)
    assert result.returncode == 2 and "is a directory, not a file" in result.stderr, result.stderr


def test_a_file_over_the_bound_is_refused_unread(corpus, capsys, monkeypatch):
    from kvspec.conformance.harness import trace

    monkeypatch.setattr(trace, "MAX_FILE", 100)
    monkeypatch.setattr(trace.read_bounded, "__defaults__", (100, "trace"))
    status, _, err = run_main(capsys, "replay", str(corpus / f"{NAMES[0]}.jsonl"))
    assert status == 2 and "longer than 100 bytes" in err, err


@pytest.mark.parametrize("edit, expected", [
    (lambda index: index["vectors"][0].pop("sha256"), "'sha256' is a required property"),
    (lambda index: index["vectors"][0].update(sha256="x" * 64), "does not match"),
    (lambda index: index["vectors"][0].update(steps="5"), "is not of type 'integer'"),
    (lambda index: index.update(kvspec_vectors=3), "3 is not one of [1, 2]"),
    (lambda index: index.pop("kvspec_vectors"), "'kvspec_vectors' is a required property"),
    (lambda index: index.update(vectors={"a": 1}), "is not of type 'array'"),
    (lambda index: index["vectors"].append(dict(index["vectors"][0])), "is listed twice"),
])
def test_a_malformed_index_is_an_error_naming_the_fault(corpus, capsys, edit, expected):
    edit_index(corpus, edit)
    status, _, err = run_main(capsys, "replay", str(corpus))
    assert status == 2 and expected in err and "kvspec vectors --out" in err, err


@pytest.mark.parametrize("content, expected", [
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b'{"kvspec_vectors": 1, "vectors": [' + b"1" * 5000 + b"]}", "not JSON"),
])
def test_an_index_that_is_not_utf8_or_too_deep_is_an_error(corpus, capsys, content, expected):
    (corpus / INDEX).write_bytes(content)
    status, _, err = run_main(capsys, "replay", str(corpus))
    assert status == 2 and expected in err, err


def test_the_step_counts_of_the_index_are_checked(corpus, capsys):
    edit_index(corpus, lambda index: index["vectors"][0].update(steps=index["vectors"][0]["steps"] + 1))
    status, _, err = run_main(capsys, "replay", str(corpus))
    assert status == 2 and "steps, the index lists" in err, err


def test_a_vector_replayed_alone_is_checked_against_its_index(corpus, capsys):
    vector = corpus / f"{NAMES[0]}.jsonl"
    vector.write_text(vector.read_text().replace('"chunk":16', '"chunk":15', 1))
    status, _, err = run_main(capsys, "replay", str(vector))
    assert status == 2 and "was altered" in err, err


# -- 4 and 8. what a trace line holds -------------------------------------------------------------

def lines_of(trace: Trace) -> list[dict]:
    return [json.loads(line) for line in trace.dumps().split("\n") if line]


def test_an_integer_of_thousands_of_digits_is_a_trace_error():
    documents = lines_of(walkthroughs()[NAMES[0]])
    text = "\n".join(json.dumps(d) for d in documents).replace('"chunk": 16', '"chunk": ' + "9" * 5000, 1)
    with pytest.raises(TraceError, match="line 3: not JSON"):
        parse(text)


@pytest.mark.parametrize("field, value", [("page_size", 10**30), ("size_full", 2**63), ("window", 2**40)])
def test_a_configuration_beyond_what_an_engine_holds_is_a_trace_error(field, value, tmp_path, capsys):
    """10**30 as a page size used to reach the adapter (torch's C++ frames in
    the message, the trace's fault blamed on the adapter)."""
    header, *steps = lines_of(walkthroughs()[NAMES[0]])
    header["config"][field] = value
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in (header, *steps)))
    status, _, err = run_main(capsys, "replay", str(path))
    assert status == 2 and f"config/{field}" in err and "huge.jsonl line 1" in err, err


def test_a_line_separator_inside_a_json_string_is_valid_json_lines():
    """U+2028 and U+2029 are valid inside a JSON string (json.dumps writes them raw with
    ensure_ascii=False); only "\\n" ends a JSON Lines line."""
    trace = Trace("engine", walkthroughs()[NAMES[0]].config, "reference", walkthroughs()[NAMES[0]].steps,
                  description="a\u2028b\u2029c\x85d")
    text = trace.dumps().replace("\\u2028", "\u2028").replace("\\u2029", "\u2029").replace("\\u0085", "\x85")
    assert "\u2028" in text and "\u2029" in text
    assert parse(text).description == "a\u2028b\u2029c\x85d"
    assert parse(text.replace("\n", "\r\n")) == parse(text)


# -- adapters that misbehave, loaded by the workers as `test_hostile_input:NAME` ------------------

def engine_adapter(name: str, engine, **attributes):
    from kvspec.adapters.reference import ADAPTER as REFERENCE

    return type(name, (), {"name": name, "policy_version": REFERENCE.policy_version,
                           "capabilities": REFERENCE.capabilities, "make_engine": staticmethod(engine),
                           **attributes})


def hang(*args):

    threading.Event().wait()


def abort(*args):
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test's directory
    os.abort()


HANGS_BUILDING = engine_adapter("hangs-building", hang)
ABORTS_BUILDING = engine_adapter("aborts-building", abort)


# -- 2. building the implementation runs in a worker ----------------------------------------------

@pytest.mark.parametrize("adapter, verdict", [("HANGS_BUILDING", "hung"), ("ABORTS_BUILDING", "crashed")])
def test_an_adapter_that_hangs_or_aborts_while_building_is_a_failure_with_a_report(adapter, verdict, tmp_path):
    """make_engine used to run first in the harness's own process: a hang there hung
    `kvspec check` whatever --step-timeout, an abort killed it with no output."""
    result = kvspec("check", "--adapter", f"test_hostile_input:{adapter}", "--run", "engine P=4 W=6 I=4",
                    "--step-timeout", "3", "--json", "r.json", cwd=tmp_path, timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"engine P=4 W=6 I=4: {verdict}" in result.stdout and "building the implementation" in result.stdout
    assert json.loads((tmp_path / "r.json").read_text())["runs"][0]["verdict"] == verdict


def test_a_replay_that_hangs_while_building_is_a_hang(corpus):
    result = kvspec("replay", str(corpus / f"{NAMES[0]}.jsonl"), "--adapter", "test_hostile_input:HANGS_BUILDING",
                    "--step-timeout", "3", cwd=corpus.parent, timeout=240)
    assert result.returncode == 1 and "hung" in result.stdout, result.stdout + result.stderr


# -- 3. a trace the lifecycle forbids is a bad trace, not a failure of the implementation ---------

DECODE_AND_FINISH = "walkthrough-4.4-decode-and-finish"


def edited_trace(tmp_path: Path, edit, name: str = DECODE_AND_FINISH) -> Path:
    """A vector with the reference's expectations, one step edited, saved alone (no index)."""
    trace = with_expectations(walkthroughs()[name], load_adapter("reference"))
    steps = list(trace.steps)
    edit(steps)
    return Trace(trace.tier, trace.config, trace.adapter, tuple(steps)).save(tmp_path / "edited.jsonl")


@pytest.mark.parametrize("edit, why", [
    (lambda steps: steps.__setitem__(5, TraceStep("decode", {"rid": "ghost", "token": 9})),
     "request 'ghost' was never admitted"),
    (lambda steps: steps.insert(1, steps[0]), "request 'r' is already running"),
    (lambda steps: steps.insert(1, TraceStep("admit", {"rid": "r", "prompt": [1, 2]})),
     "request 'r' is already running"),
    (lambda steps: steps.__setitem__(17, TraceStep("finish", {"rid": "r", "trim": 1000})), "trim 1000 must lie"),
    (lambda steps: steps.__setitem__(2, TraceStep("decode", {"rid": "r", "token": 9})), "is still in prefill"),
    (lambda steps: steps.__setitem__(4, TraceStep("decode", {"rid": "r", "token": 9}, refuse=True)),
     "marked refused, but the lifecycle allows it"),
])
def test_a_step_the_lifecycle_forbids_is_a_trace_error_naming_the_step(tmp_path, capsys, edit, why):
    """[LIFE-1] It used to be reported as the implementation refusing a step "although
    the lifecycle allows it", exit 1."""
    path = edited_trace(tmp_path, edit)
    status, out, err = run_main(capsys, "replay", str(path))
    assert status == 2 and why in err and "edited.jsonl: step " in err and "the trace is at fault" in err, out + err


def test_an_allocator_step_naming_a_sequence_never_made_is_a_trace_error(tmp_path, capsys):
    config = {"page_size": 4, "size_full": 32, "size_swa": 32}
    path = Trace("allocator", config, "reference", (TraceStep("new_sequence", {"length": 5}),
                                                    TraceStep("free_sequence", {"sequence": 3, "set_shaped": False}))
                 ).save(tmp_path / "edited.jsonl")
    status, out, err = run_main(capsys, "replay", str(path))
    assert status == 2 and "step 1 (line 3: free_sequence" in err and "names sequence 3" in err, out + err


class RefusesDecode:
    """An engine that refuses every decode: the implementation's fault, the trace's not."""

    def __init__(self, config):
        from kvspec.adapters.reference import ReferenceEngineAdapter

        self.inner = ReferenceEngineAdapter(config)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode(self, rid, token):
        from kvspec.spec.outcomes import InvalidRequest

        raise InvalidRequest("no decoding today")


REFUSES_DECODE = engine_adapter("refuses-decode", RefusesDecode)


def test_an_implementation_that_refuses_a_step_the_lifecycle_allows_still_fails(tmp_path):
    path = edited_trace(tmp_path, lambda steps: None)
    result = kvspec("replay", str(path), "--adapter", "test_hostile_input:REFUSES_DECODE", cwd=tmp_path)
    assert result.returncode == 1 and "[LIFE-1] decode was refused although the lifecycle allows it" in result.stdout, \
        result.stdout + result.stderr


# -- 4. what the user names: an adapter module, an output path ------------------------------------

@pytest.mark.parametrize("source, expected", [("def broken(:\n", "raised SyntaxError"),
                                              ("raise RuntimeError('boom at import')\n", "boom at import")])
def test_an_adapter_module_that_cannot_import_is_an_adapter_error(tmp_path, capsys, monkeypatch, source, expected):
    (tmp_path / "hostile_module.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for command in (["check", "--run", "engine P=4 W=6 I=4"], ["replay", str(edited_trace(tmp_path, lambda s: None))]):
        status, _, err = run_main(capsys, *command, "--adapter", "hostile_module:ADAPTER")
        assert status == 2 and "importing module 'hostile_module'" in err and expected in err, err


@pytest.mark.parametrize("arguments, expected", [
    (["check", "--traces", "a-file"], "argument --traces: a-file exists and is not a directory"),
    (["check", "--json", "."], "argument --json: . is a directory"),
    (["check", "--junit", "a-file/r.xml"], "argument --junit: a-file/r.xml: a-file is not a directory"),
    (["vectors", "--out", "a-file"], "argument --out: a-file exists and is not a directory"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, arguments, expected):
    """--traces naming a file used to lose the violation found (the worker died saving
    it); --json naming a directory lost the report after the whole run."""
    (tmp_path / "a-file").write_text("")
    result = kvspec(*arguments, "--run", "allocator P=4", cwd=tmp_path) if arguments[0] == "check" else \
        kvspec(*arguments, cwd=tmp_path)
    assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "kvspec check: adapter" not in result.stdout  # refused before anything ran


# -- 7. option values -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
@pytest.mark.parametrize("command", ["check", "replay"])
def test_a_step_timeout_that_is_not_a_finite_positive_number_is_a_usage_error(command, value, capsys):
    """--step-timeout 0 declared a conformant run hung; nan turned hang detection off."""
    with pytest.raises(SystemExit) as exit:
        main([command, *(["x.jsonl"] if command == "replay" else []), "--step-timeout", value])
    assert exit.value.code == 2 and "argument --step-timeout" in capsys.readouterr().err


def test_a_replay_that_skips_every_trace_says_so_and_exits_2_unless_allowed(tmp_path, capsys):
    path = edited_trace(tmp_path, lambda steps: None)
    status, out, err = run_main(capsys, "replay", str(path), "--adapter", "sample_adapters:LEAKY")
    assert status == 2 and "nothing was replayed" in err and "--allow-skipped" in err, out + err
    assert "skip edited.jsonl: adapter lacks the engine tier" in out
    status, out, err = run_main(capsys, "replay", str(path), "--adapter", "sample_adapters:LEAKY", "--allow-skipped")
    assert status == 0, out + err


# -- 5. a snapshot of the wrong shape --------------------------------------------------------------

def malformed(snapshot, how: str):
    from dataclasses import replace

    if how == "a dict":
        return {"requests": []}
    if how == "None":
        return None
    if how == "nodes None":
        return replace(snapshot, nodes=None)
    if how == "a pool as text":
        return replace(snapshot, allocator=replace(snapshot.allocator, full="x"))
    if how == "free pages as text":
        return replace(snapshot, full=replace(snapshot.full, free_pages=tuple(map(str, snapshot.full.free_pages))))
    raise ValueError(how)


def misshapen_engine(how: str):
    from kvspec.adapters.reference import ReferenceEngineAdapter

    class Engine(ReferenceEngineAdapter):
        def snapshot(self):
            return malformed(super().snapshot(), how)

    return engine_adapter(f"snapshot-{how}", Engine)


def misshapen_allocator(how: str):
    from kvspec.adapters.reference import ADAPTER as REFERENCE
    from kvspec.adapters.reference import ReferenceAllocatorAdapter

    class Allocator(ReferenceAllocatorAdapter):
        def state(self):
            return malformed(super().state(), how)

    return type(f"state-{how}", (), {"name": f"state-{how}", "policy_version": REFERENCE.policy_version,
                                     "capabilities": REFERENCE.capabilities, "make_allocator": staticmethod(Allocator)})


SNAPSHOT_A_DICT = misshapen_engine("a dict")
SNAPSHOT_NONE = misshapen_engine("None")
SNAPSHOT_NODES_NONE = misshapen_engine("nodes None")
SNAPSHOT_POOL_AS_TEXT = misshapen_engine("a pool as text")
STATE_FREE_PAGES_AS_TEXT = misshapen_allocator("free pages as text")


@pytest.mark.parametrize("adapter, run, expected", [
    ("SNAPSHOT_A_DICT", "engine P=4 W=6 I=4", "snapshot() returned a dict"),
    ("SNAPSHOT_NONE", "engine P=4 W=6 I=4", "snapshot() returned a NoneType"),
    ("SNAPSHOT_NODES_NONE", "engine P=4 W=6 I=4", "TwoPoolSnapshot.nodes is None, not tuple[NodeView, ...]"),
    ("SNAPSHOT_POOL_AS_TEXT", "engine P=4 W=6 I=4", "TwoPoolSnapshot.allocator.full is a str ('x'), not a PoolState"),
    ("STATE_FREE_PAGES_AS_TEXT", "allocator P=4", "AllocatorView.state.full.free_pages[0] is a str ('1'), not an int"),
])
def test_a_snapshot_of_the_wrong_shape_names_the_field_as_a_failure_of_the_implementation(adapter, run, expected,
                                                                                          tmp_path):
    """It used to end in about 80 lines of the harness's traceback and "process died"."""
    result = kvspec("check", "--adapter", f"test_hostile_input:{adapter}", "--run", run, "--seed", "1",
                    "--no-shrink", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{run}: crashed" in result.stdout and "[OBS-1]" in result.stdout and expected in result.stdout, \
        result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "process" not in result.stdout
    assert list((tmp_path / "kvspec-traces").glob("*.jsonl"))
