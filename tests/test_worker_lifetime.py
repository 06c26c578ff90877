"""A worker's lifetime (issue 23, items 6 and 9): its memory is bounded, a leak reported as
a crash of the implementation with its trace; an interrupted check or replay (Ctrl-C,
SIGTERM, or the harness killed outright) keeps the runs that finished, prints no
traceback, and leaves no process behind. The misbehaving adapters are loaded by the
workers as `test_worker_lifetime:NAME`."""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_hostile_input import ENV, edited_trace, engine_adapter, hang, kvspec

from kvspec.conformance.cli import main
from kvspec.conformance.harness.trace import TraceStep, load

# -- 9. a worker's memory is bounded ----------------------------------------------------------------

LEAKED: list = []


def leaking_engine(config):
    """Leaks 50 MB (touched, so resident) at every admission: conformant otherwise."""
    from kvspec.adapters.reference import ReferenceEngineAdapter

    class Engine(ReferenceEngineAdapter):
        def admit(self, rid, prompt):
            LEAKED.append(b"\x01" * (50 << 20))
            return self.engine.admit(rid, prompt)  # (the adapter's operations come by __getattr__, not super())

    return Engine(config)


LEAKING = engine_adapter("leaking", leaking_engine)


def test_a_worker_past_the_memory_limit_is_a_crash_with_its_trace(tmp_path):
    """It used to reach 2.4 GB and be reported ok."""
    result = kvspec("check", "--adapter", "test_worker_lifetime:LEAKING", "--run", "engine P=4 W=6 I=4", "--seed", "1",
                    "--memory-limit", "1.5", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "engine P=4 W=6 I=4: crashed" in result.stdout and "past the memory limit of 1.5 GiB" in result.stdout, \
        result.stdout
    run = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    trace = load(run["trace"] if Path(run["trace"]).is_absolute() else tmp_path / run["trace"])
    # the trace ends with the step that grew it past the limit, even where the leak built up over
    # earlier examples and the parent's poll would have come only after the next one had begun
    assert trace.steps and trace.steps[-1].op == "admit" and trace.violated == ("crashed",), trace.steps


def journal_past_its_limit(path: str, steps: int) -> None:
    from kvspec.conformance.harness.isolation import Journal

    class Heartbeat:
        value = 0.0

    journal = Journal(path, Heartbeat(), memory_limit=None)
    journal("example", {"page_size": 1})
    for number in range(steps):
        journal("step", TraceStep("admit", {"rid": f"r{number}", "prompt": [1]}))
    journal.memory_limit = 1  # this process is past 1 byte: the next event ends it
    journal("example", {"page_size": 2})


def test_a_worker_past_its_memory_limit_ends_itself_before_the_next_example(tmp_path):
    """A leak that builds up over examples: the worker sees it before the next example
    begins, so the journal's last example is the one whose step grew it."""
    import multiprocessing

    from kvspec.conformance.harness.isolation import PAST_MEMORY_LIMIT, last_example

    path = str(tmp_path / "journal.jsonl")
    process = multiprocessing.get_context("fork").Process(target=journal_past_its_limit, args=(path, 3))
    process.start()
    process.join(60)
    config, steps, peak = last_example(path)
    assert process.exitcode == PAST_MEMORY_LIMIT and config == {"page_size": 1} and len(steps) == 3 and peak > 1


def test_the_memory_limit_must_be_a_positive_number(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["check", "--memory-limit", "0"])
    assert exit.value.code == 2 and "argument --memory-limit" in capsys.readouterr().err


# -- 6. interrupt ------------------------------------------------------------------------------------

def session_members(session: int) -> list[int]:
    """The processes of a session (a harness started with start_new_session leads one): its
    workers lead process groups of their own, inside it."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry))
    return members


def process_group_gone(session: int) -> bool:
    """Whether every process the harness led (its session) has ended."""
    return not session_members(session)


def take_ctrl_c() -> None:
    """Run in the child before exec: Ctrl-C's default disposition. A shell that starts the
    test run in the background without job control makes it ignore SIGINT, and an ignored
    signal stays ignored across exec: the harness under test would never see the Ctrl-C
    these tests send (a rehearsal of CI started with `&` failed that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# its own process group that takes Ctrl-C, as a job started from a terminal
AS_A_TERMINAL_JOB = {"start_new_session": True, "preexec_fn": take_ctrl_c}


@pytest.mark.parametrize("signal_number, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_check_writes_the_runs_that_finished_marked_interrupted(tmp_path, signal_number, status):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM to
    the harness alone, once a run has found its violation: it used to print the tracebacks
    of the parent and of every worker and lose every finished run."""
    import xmlschema

    from kvspec.conformance.reports.json_report import validate_json
    from kvspec.conformance.reports.model import SCHEMAS

    command = ["kvspec", "check", "--adapter", "mutant-pd-cursor-unset", "--profile", "deep", "-n", "2", "--seed", "0",
               "--no-shrink", "--run", "engine P=4 W=6 I=4", "--run", "engine P=1 W=3 I=4",
               "--json", "r.json", "--junit", "r.xml"]  # the first fails at once, the second runs for minutes
    process = subprocess.Popen(command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, **AS_A_TERMINAL_JOB)
    watchdog = threading.Timer(180, os.killpg, (process.pid, signal.SIGKILL))  # never wait for the deep run
    watchdog.start()
    lines = []
    for line in process.stdout:  # wait for the violation of the first run
        lines.append(line)
        if line.startswith("[1/2] engine P=4 W=6 I=4: violated"):
            break
    watchdog.cancel()
    if not lines or not lines[-1].startswith("[1/2] engine P=4 W=6 I=4: violated"):
        process.kill()
        pytest.fail("".join(lines) + process.stderr.read())
    time.sleep(1)
    if signal_number == signal.SIGINT:
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    out = "".join(lines) + out
    assert process.returncode == status, out + err
    assert "Traceback" not in out + err and "@seed" not in out + err and "reproduce" not in out + err, out + err
    assert f"interrupted ({signal.Signals(signal_number).name}) with 1 of 2 runs finished" in out, out
    document = json.loads((tmp_path / "r.json").read_text())
    validate_json(document)
    assert document["exit_status"] == status and document["interrupted"] == {
        "signal": signal.Signals(signal_number).name, "unfinished": ["engine P=1 W=3 I=4"]}
    assert [run["label"] for run in document["runs"]] == ["engine P=4 W=6 I=4"]
    assert (tmp_path / document["runs"][0]["trace"]).exists()
    xmlschema.XMLSchema(SCHEMAS / "junit.xsd").validate(tmp_path / "r.xml")
    assert (tmp_path / "r.xml").read_text().count("interrupted (") == 1
    deadline = time.time() + 30
    while not process_group_gone(process.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert process_group_gone(process.pid), "a worker outlived the harness"


def test_a_report_of_an_interrupted_check_is_valid_only_with_its_exit_status():
    from kvspec.conformance.reports.json_report import ReportSchemaError, to_json, validate_json
    from kvspec.conformance.reports.model import CheckReport, utc_now

    report = CheckReport("0.1.0", "reference", "sglang-0.5.23", "quick", 0, utc_now(), 1.0, [], "SIGINT",
                         ["allocator P=1"])
    document = to_json(report)
    validate_json(document)
    assert document["exit_status"] == 130
    with pytest.raises(ReportSchemaError):
        validate_json({**document, "exit_status": 0})
    with pytest.raises(ValueError, match="unfinished runs without an interruption"):
        CheckReport("0.1.0", "reference", "sglang-0.5.23", "quick", 0, utc_now(), 1.0, [], None, ["allocator P=1"])


def hang_in_decode(config):
    from kvspec.adapters.reference import ReferenceEngineAdapter

    class Engine(ReferenceEngineAdapter):
        def decode(self, rid, token):
            Path("in-decode").touch()  # in the job's working directory: the test's tmp_path
            hang()

    return Engine(config)


HANGS_IN_DECODE = engine_adapter("hangs-in-decode", hang_in_decode)
SLOW_TO_PRELOAD = engine_adapter("slow-to-preload", hang_in_decode, preload=("slow_forkserver_import",))


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while not path.exists():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            pytest.fail(f"{path.name} never appeared: " + "".join(process.communicate()))
        time.sleep(0.05)


def interrupted_replay(tmp_path: Path, adapter: str, marker: str) -> tuple[subprocess.Popen, str, str]:
    """`kvspec replay` of a trace on `adapter`, sent Ctrl-C (SIGINT to its whole process
    group, as a terminal sends it) as soon as `marker` appears in its directory."""
    path = edited_trace(tmp_path, lambda steps: None)
    process = subprocess.Popen(["kvspec", "replay", str(path), "--adapter", adapter], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **AS_A_TERMINAL_JOB)
    wait_for(tmp_path / marker, process)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return process, out, err


def test_an_interrupted_replay_says_so_without_a_traceback(tmp_path):
    process, out, err = interrupted_replay(tmp_path, "test_worker_lifetime:HANGS_IN_DECODE", "in-decode")
    assert process.returncode == 130, out + err
    assert "interrupted (SIGINT) with 0 of 1 trace(s) replayed" in out and "Traceback" not in out + err, out + err


def test_ctrl_c_while_the_forkserver_imports_prints_no_traceback_and_leaves_no_process(tmp_path):
    """CI once sent the SIGINT while the forkserver was still importing torch (it ignores
    SIGINT only after its preload): its KeyboardInterrupt traceback was printed. Here the
    preload is made slow on purpose and interrupted in the middle."""
    process, out, err = interrupted_replay(tmp_path, "test_worker_lifetime:SLOW_TO_PRELOAD", "preloading")
    assert process.returncode == 130, out + err
    assert "interrupted (SIGINT)" in out + err and "Traceback" not in out + err, out + err
    deadline = time.time() + 60  # the forkserver ends once its preload has, seeing its parent gone
    while not process_group_gone(process.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert process_group_gone(process.pid), "the forkserver outlived the harness"


def test_no_worker_outlives_a_harness_killed_outright(tmp_path):
    """SIGKILL to the harness alone (no chance to stop its workers): the worker, hung in
    the implementation's decode, ends with it instead of running on as an orphan."""
    path = edited_trace(tmp_path, lambda steps: None)
    process = subprocess.Popen(["kvspec", "replay", str(path), "--adapter", "test_worker_lifetime:HANGS_IN_DECODE"],
                               cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    wait_for(tmp_path / "in-decode", process)
    process.kill()
    process.wait()
    deadline = time.time() + 30
    while not process_group_gone(process.pid) and time.time() < deadline:
        time.sleep(0.2)
    alive = not process_group_gone(process.pid)
    for pid in session_members(process.pid) if alive else ():
        os.kill(pid, signal.SIGKILL)
    assert not alive, "a worker outlived the harness"
