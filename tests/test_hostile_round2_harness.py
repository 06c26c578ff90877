"""Hostile input, round 2 (issue 36): the harness's own edges. A CI gate never passes on
nothing, the implementation is never blamed for what it did not do, a counterexample is
what happened, and nothing is left behind or lost. Each test is one defect of the probe
report (D1 .. D36, by its number), failing on b701bb5 and passing since; the trace-level
ones are in test_hostile_round2_traces.py and test_hostile_round2_replay.py.

The adapters are this folder's own (hostile_adapters.py), loaded by `module:attribute`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_hostile_input import ENV, run_main
from test_worker_lifetime import AS_A_TERMINAL_JOB, session_members

from kvspec.conformance.harness.trace import load

ENGINE_RUN = ("--run", "engine P=4 W=6 I=4", "--seed", "1")
ALLOCATOR_RUN = ("--run", "allocator P=4", "--seed", "1")
V44 = (Path(__file__).resolve().parent.parent / "vectors" / "conformance" / "engine" / "two-pool" / "sglang-0.5.23"
       / "walkthrough-4.4-decode-and-finish.jsonl")
MUTANT = ("--adapter", "mutant-stale-mapping", "--run", "allocator P=4", "--seed", "1", "--no-shrink")


def kvspec(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], capture_output=True, text=True, cwd=cwd, env=env or ENV, timeout=timeout)


def module(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / f"{name}.py").write_text(text)
    return name


def running(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def no_traceback(result) -> bool:
    return "Traceback" not in result.stdout + result.stderr


# -- a CI gate never passes on nothing -------------------------------------------------------------

@pytest.mark.parametrize("text, says", [
    ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
    ("import sys\nsys.exit(3)\n", "called sys.exit(3)"),
    ("import argparse\nargparse.ArgumentParser().parse_args(['--port'])\n", "called sys.exit(2)"),
    ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
])
@pytest.mark.parametrize("command", ["check", "replay"])
def test_d2_an_adapter_module_that_exits_at_import_is_an_adapter_error_never_exit_0(tmp_path, text, says, command):
    name = module(tmp_path, "exits_at_import", text)
    args = ("check", *ENGINE_RUN, "--json", "r.json") if command == "check" else ("replay", str(V44))
    result = kvspec(*args, "--adapter", f"{name}:ADAPTER", cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr, result.stdout + result.stderr
    assert no_traceback(result) and not (tmp_path / "r.json").exists()


def test_d2_the_pytest_plugin_calls_it_a_usage_error(tmp_path):
    module(tmp_path, "exits_at_import", "import sys\nsys.exit(0)\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "--kvspec-adapter=exits_at_import:ADAPTER", "-q"],
                            cwd=tmp_path, env={**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ENV['PYTHONPATH']}"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "called sys.exit(0)" in result.stderr and "INTERNALERROR" not in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["check", "replay"])
def test_d1_a_helper_thread_the_implementation_never_joins_does_not_hang_kvspec(tmp_path, command):
    args = ("check", *ENGINE_RUN, "--json", "r.json") if command == "check" else ("replay", str(V44))
    result = kvspec(*args, "--adapter", "hostile_adapters:THREAD_OUTLIVES", "--step-timeout", "5", cwd=tmp_path,
                    timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    if command == "check":
        assert json.loads((tmp_path / "r.json").read_text())["verdicts"]["ok"] == 1


# -- nothing left behind ---------------------------------------------------------------------------

def test_d7_processes_the_implementation_starts_end_with_its_worker(tmp_path):
    children = tmp_path / "children"
    process = subprocess.Popen(["kvspec", "check", "--adapter", "hostile_adapters:SPAWNS_CHILD", *ENGINE_RUN],
                               cwd=tmp_path, env={**ENV, "KVSPEC_TEST_CHILDREN": str(children)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = process.communicate(timeout=300)  # stdout piped: it ends only when no child holds the pipe
    assert process.returncode == 0, out + err
    pids = [int(pid) for pid in children.read_text().split()]
    assert len(pids) > 10
    deadline = time.time() + 10
    while any(map(running, pids)) and time.time() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in pids if running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"{len(alive)} helper processes outlived kvspec"
    while session_members(process.pid) and time.time() < deadline:  # a forkserver ends once it reads its EOF
        time.sleep(0.1)
    assert not session_members(process.pid)


def test_d36_a_check_writes_nothing_into_the_current_folder_but_what_it_is_told(tmp_path):
    result = kvspec("check", *ALLOCATOR_RUN, cwd=tmp_path, env={k: v for k, v in ENV.items()
                                                                 if k != "HYPOTHESIS_STORAGE_DIRECTORY"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / ".hypothesis").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


# -- the implementation is never blamed for what it did not do -------------------------------------

@pytest.mark.parametrize("plot", ["a-directory.png", "/proc/kvspec-plot.png"])
def test_d4_a_picture_that_cannot_be_written_is_a_usage_error_before_the_run(tmp_path, plot):
    (tmp_path / "a-directory.png").mkdir()
    result = kvspec("check", *ALLOCATOR_RUN, "--plot", plot, cwd=tmp_path)
    assert result.returncode == 2 and "--plot" in result.stderr and "crashed" not in result.stdout, \
        result.stdout + result.stderr
    assert not (tmp_path / "kvspec-traces").exists()


def test_d4_a_picture_that_fails_at_drawing_is_said_and_the_verdict_stands(tmp_path):
    """A folder made at the picture's name after the options were read: the run stays ok."""
    from kvspec.conformance.harness.declarations import Run
    from kvspec.conformance.harness.protocol import load_adapter
    from kvspec.conformance.runs.plan import plan
    from kvspec.conformance.runs.runner import Job, check_job

    (tmp_path / "x.png").mkdir()
    planned = plan(load_adapter("reference")).of(Run(4))
    result = check_job(Job("reference", planned, "quick", 1, str(tmp_path), picture=str(tmp_path / "x.png")))
    assert result.verdict == "ok" and "no picture: drawing" in result.message and result.picture is None


def test_d17_an_adapter_error_in_one_run_keeps_every_other_runs_verdict_and_the_report(tmp_path):
    result = kvspec("check", "--adapter", "hostile_adapters:FAILS_AT_PAGE_16", "--run", "engine P=4 W=6 I=4",
                    "--run", "engine P=16 W=5 I=4", "--seed", "1", "-n", "2", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 2 and "page size 16 is not supported" in result.stderr, result.stdout + result.stderr
    verdicts = {run["label"]: run["verdict"] for run in json.loads((tmp_path / "r.json").read_text())["runs"]}
    assert verdicts == {"engine P=4 W=6 I=4": "ok", "engine P=16 W=5 I=4": "error"}


@pytest.mark.parametrize("adapter, raised", [("GENERATOR_EXIT", "GeneratorExit: not an Exception"),
                                             ("KEYBOARD_INTERRUPT", "KeyboardInterrupt: raised by the implementation")])
def test_d26_a_base_exception_from_the_implementation_is_a_crash_that_names_it(tmp_path, adapter, raised):
    result = kvspec("check", "--adapter", f"hostile_adapters:{adapter}", *ENGINE_RUN, "--no-shrink", cwd=tmp_path)
    assert result.returncode == 1 and "crashed" in result.stdout and raised in result.stdout, \
        result.stdout + result.stderr
    assert no_traceback(result)


# -- a counterexample is what happened -------------------------------------------------------------

def test_d5_an_engine_that_extends_the_prompt_it_was_given_gets_the_trace_of_what_was_asked(tmp_path):
    result = kvspec("check", "--adapter", "hostile_adapters:KEEPS_PROMPT", *ENGINE_RUN, "--no-shrink", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    (trace,) = (tmp_path / "kvspec-traces").glob("*.jsonl")
    assert not any(999999 in (step.args.get("prompt") or []) for step in load(trace).steps)
    assert "not deterministic" not in result.stdout


def test_d31_an_implementation_that_changes_folder_does_not_move_the_trace(tmp_path):
    result = kvspec("check", "--adapter", "hostile_adapters:CHDIR_THEN_LEAK", *ENGINE_RUN, "--no-shrink",
                    cwd=tmp_path, env={**ENV, "KVSPEC_TEST_ELSEWHERE": str(tmp_path / "elsewhere")})
    assert result.returncode == 1, result.stdout + result.stderr
    printed = next(line.split(": ", 1)[1] for line in result.stdout.splitlines() if "trace (" in line)
    assert (tmp_path / printed).is_file() and not (tmp_path / "elsewhere" / "kvspec-traces").exists()


def test_d20_two_checks_sharing_a_traces_folder_never_overwrite_each_other(tmp_path):
    first = subprocess.Popen(["kvspec", "check", *MUTANT, "--traces", "shared"], cwd=tmp_path, env=ENV,
                             stdout=subprocess.PIPE, text=True)
    second = kvspec("check", *MUTANT[:-3], "--seed", "101", "--no-shrink", "--traces", "shared", cwd=tmp_path)
    out, _ = first.communicate(timeout=300)
    for output in (out, second.stdout):
        line = next(line for line in output.splitlines() if "trace (" in line)
        steps, path = int(line.split("(")[1].split()[0]), line.split(": ", 1)[1]
        assert len(load(tmp_path / path).steps) == steps, output


# -- output paths: checked before the run, links never followed ------------------------------------

@pytest.mark.parametrize("option, path", [
    ("--json", "/dev/full"), ("--junit", "/dev/full"), ("--json", "/proc/self/kvspec-report.json"),
    ("--json", "dangling.json"), ("--traces", "/proc/kvspec-traces"), ("--traces", "a-file"),
    ("--example-database", "a-file"), ("--example-database", "/proc/kvspec-db"),
])
def test_d11_d12_d35_an_output_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, monkeypatch, option, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "missing" / "r.json")
    with pytest.raises(SystemExit) as stopped:
        run_main(capsys, "check", *ALLOCATOR_RUN, option, path)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and option in err, err


def test_d11_a_directory_at_the_traces_name_keeps_the_violation_and_the_report(tmp_path):
    (tmp_path / "kvspec-traces" / "mutant-stale-mapping-allocator-p-4.jsonl").mkdir(parents=True)
    result = kvspec("check", *MUTANT, "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 1 and no_traceback(result), result.stdout + result.stderr
    run = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    assert run["verdict"] == "violated" and run["clauses"] and run["trace"].endswith("-allocator-p-4-2.jsonl")
    assert len(load(run["trace"]).steps) == run["trace_steps"]


def test_d11_a_traces_folder_that_became_unwritable_keeps_the_violation_and_the_report(tmp_path):
    """Checked before the run; gone since (here: a file where the folder was): the verdict stands."""
    from kvspec.conformance.harness.declarations import Run
    from kvspec.conformance.harness.protocol import load_adapter
    from kvspec.conformance.runs.plan import plan
    from kvspec.conformance.runs.runner import Job, check_job

    (tmp_path / "traces").write_text("a file")
    planned = plan(load_adapter("mutant-stale-mapping")).of(Run(4))
    result = check_job(Job("mutant-stale-mapping", planned, "quick", 1, str(tmp_path / "traces"), shrink=False))
    assert result.verdict == "violated" and result.trace is None and "the trace could not be saved" in result.message


def test_d30_json_and_junit_on_one_file_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        run_main(capsys, "check", *ALLOCATOR_RUN, "--json", "same.out", "--junit", "same.out")
    assert stopped.value.code == 2 and "name the same file" in capsys.readouterr().err


@pytest.mark.parametrize("args", [("zoo", "--only", "mutant-stale-mapping", "--json", "."),
                                  ("zoo", "--only", "mutant-stale-mapping", "--json", "/dev/full"),
                                  ("zoo", "--only", "mutant-stale-mapping", "--traces", "/proc/zoo-traces"),
                                  ("spec", "--out", "a-file"), ("spec", "--out", "/proc/kvspec-spec"),
                                  ("vectors", "--out", "/proc/kvspec-vectors"),
                                  ("diff-helpers", "--helper", "pages.ceil_page", "--json", "/proc/x.json")])
def test_d13_every_commands_outputs_are_checked_before_it_runs(tmp_path, capsys, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as stopped:
        run_main(capsys, *args)
    assert stopped.value.code == 2 and args[-2] in capsys.readouterr().err


def test_d18_a_link_planted_at_a_traces_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "kvspec-traces").mkdir()
    (tmp_path / "kvspec-traces" / "mutant-stale-mapping-allocator-p-4.jsonl").symlink_to(victim)
    result = kvspec("check", *MUTANT, cwd=tmp_path)
    assert result.returncode == 1 and "not deterministic" not in result.stdout, result.stdout
    assert victim.read_text() == "precious"
    assert "mutant-stale-mapping-allocator-p-4-2.jsonl" in result.stdout


def test_d18_vectors_out_replaces_a_planted_link(tmp_path):
    from kvspec.conformance.harness.trace import Trace, TraceStep

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "v.jsonl").symlink_to(victim)
    Trace("allocator", {"page_size": 4, "size_full": 16, "size_swa": 8}, "x", (TraceStep("drain"),)).save(
        tmp_path / "out" / "v.jsonl")
    assert victim.read_text() == "precious" and load(tmp_path / "out" / "v.jsonl").steps[0].op == "drain"


# -- adapters that end in tracebacks or hangs ------------------------------------------------------

@pytest.mark.parametrize("adapter, says", [
    ("WRONG_CAPABILITIES", "capabilities must be a collection of names"),
    ("WRONG_POLICY_VERSIONS", "policy_versions must be a collection of names"),
    ("WRONG_OBSERVABLES", "observables must be a collection of names"),
    ("WRONG_VERSION_CAPABILITIES", "version_capabilities must be a mapping"),
    ("WRONG_VERSION_CAPABILITIES_LIST", "version_capabilities must be a mapping"),
    ("WRONG_PRELOAD", "preload must be a collection of names"),
    ("WRONG_MEMORY_MODEL", "memory_model must be one of"),
    ("WRONG_POLICY_VERSION", "policy_version must be one of"),
    ("WRONG_NAME", "name must be a non-empty string"),
    ("WRONG_NAME_INT", "name must be a non-empty string"),
    ("RAISING_PROPERTY", "capabilities: reading it raised RuntimeError"),
])
def test_d14_a_declaration_of_the_wrong_type_is_an_adapter_error_naming_it(tmp_path, adapter, says):
    result = kvspec("check", "--adapter", f"hostile_adapters:{adapter}", *ENGINE_RUN, "--json", "r.json",
                    cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr, result.stdout + result.stderr
    assert no_traceback(result)


@pytest.mark.parametrize("adapter, says", [
    ("PRELOAD_RAISES", "preload module 'hostile_preload_raises' cannot be imported: importing it raised "
                       "RuntimeError: preload module raised at import"),
    ("PRELOAD_EXITS", "died while importing hostile_preload_exits"),
])
def test_d15_a_preload_module_that_raises_or_exits_is_an_adapter_error(tmp_path, adapter, says):
    result = kvspec("check", "--adapter", f"hostile_adapters:{adapter}", *ENGINE_RUN, cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr, result.stdout + result.stderr
    assert no_traceback(result)


@pytest.mark.parametrize("adapter, text, says", [
    ("hostile_adapters:PRELOAD_HANGS", None, "while importing hostile_preload_hangs"),
    ("hangs_at_import:ADAPTER", "import threading\nthreading.Event().wait()\n", "while loading adapter"),
    ("aborts_at_import:ADAPTER", "import os\nos.abort()\n", "died while loading adapter"),
])
def test_d15_d16_an_adapter_that_hangs_or_crashes_at_import_is_an_adapter_error(tmp_path, adapter, text, says):
    if text:
        module(tmp_path, adapter.partition(":")[0], text)
    started = time.perf_counter()
    result = kvspec("check", "--adapter", adapter, *ENGINE_RUN, "--load-timeout", "8", "--json", "r.json",
                    cwd=tmp_path, env={**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ENV['PYTHONPATH']}"})
    assert result.returncode == 2 and says in result.stderr, result.stdout + result.stderr
    assert time.perf_counter() - started < 120 and no_traceback(result)


# -- signals and output streams --------------------------------------------------------------------

def test_d33_sighup_writes_the_report_of_what_finished_like_sigterm(tmp_path):
    """A closed terminal or SSH session: one run finished, one hangs in the implementation."""
    process = subprocess.Popen(["kvspec", "check", "--adapter", "hostile_adapters:HANGS_IN_DECODE",
                                "--run", "engine P=4 W=6 I=4", "--run", "engine P=4 W=7 I=1", "--seed", "1",
                                "-n", "2", "--step-timeout", "600", "--json", "r.json"], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **AS_A_TERMINAL_JOB)
    started = process.stdout.readline()
    time.sleep(5)  # the workers are in their runs, both hung in decode
    os.kill(process.pid, signal.SIGHUP)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 129, started + out + err
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["interrupted"] == {"signal": "SIGHUP", "unfinished": ["engine P=4 W=6 I=4", "engine P=4 W=7 I=1"]}
    assert document["exit_status"] == 129 and "Traceback" not in out + err
    deadline = time.time() + 30  # the forkserver ends once it sees the harness gone
    while session_members(process.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not session_members(process.pid)


def test_d19_ctrl_c_while_kvspec_starts_prints_no_traceback(tmp_path):
    process = subprocess.Popen(["kvspec", "vectors", "--help"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, **AS_A_TERMINAL_JOB)
    time.sleep(0.3)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    # 130 from kvspec, or killed by the signal before Python could handle it: never a traceback
    assert "Traceback" not in out + err and process.returncode in (0, 130, -signal.SIGINT), out + err


def test_d25_a_reader_that_stops_early_or_a_full_disk_leaves_the_verdict_and_the_report(tmp_path):
    with open("/dev/full", "w") as full:
        result = subprocess.run(["kvspec", "check", *ALLOCATOR_RUN, "--json", "r.json"], cwd=tmp_path, env=ENV,
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["exit_status"] == 0
    piped = subprocess.run("kvspec check --run 'allocator P=4' --seed 1 --json p.json | head -1", shell=True,
                           cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
                           executable="/bin/bash")
    assert "Traceback" not in piped.stderr and (tmp_path / "p.json").is_file(), piped.stderr


def test_d25_a_name_the_terminal_cannot_encode_is_written_escaped(tmp_path):
    trace = tmp_path / "é-vector.jsonl"
    trace.write_bytes(V44.read_bytes())
    result = kvspec("replay", str(trace), cwd=tmp_path, env={**ENV, "PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0 and "\\xe9-vector" in result.stdout and no_traceback(result), result.stderr


def test_d28_an_interrupted_zoo_writes_the_mutants_that_finished(tmp_path):
    process = subprocess.Popen(["kvspec", "zoo", "--implementation", "reference", "--profile", "quick",
                                "--shrink-seconds", "1", "--json", "z.json"], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **AS_A_TERMINAL_JOB)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("[2/"):
            break
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, "".join(lines) + out + err
    document = json.loads((tmp_path / "z.json").read_text())
    assert document["interrupted"]["signal"] == "SIGINT" and len(document["mutants"]) >= 2
    assert document["interrupted"]["unfinished"]


def test_d22_the_worker_replays_the_trace_the_harness_verified_not_the_file_again(tmp_path):
    """The task a worker gets holds the parsed trace: with the file gone (or swapped) since
    the harness read it, the worker replays what was verified."""
    from kvspec.conformance.commands import isolated_replay

    trace = load(V44)
    result, _, _ = isolated_replay((str(tmp_path / "gone.jsonl"), trace, "reference", False, None), None)
    assert result.conforms and result.steps == len(trace.steps)
