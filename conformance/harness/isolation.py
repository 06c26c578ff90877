"""Running jobs in worker processes, so that a crash or a hang of the implementation under
test is a failure with its trace, and the harness survives it.

Each job runs in its own process, forked from a forkserver that has already imported
kvspec, Hypothesis and torch (so a start costs milliseconds, and no thread pool is
forked), and the adapters of the command with their `preload` modules
(forkserver_preload.py: the harness's own process never imports an adapter). Up to
`workers` run at once. A job reports through a Journal: a line per
example and per step, written to a file before the step runs, and a heartbeat. When a
job's process dies, or no step finishes within `step_timeout` seconds, the parent kills
it and hands `on_lost` the journal's last example: the steps up to the one that crashed
or hung. So too when a job's resident memory grows past `memory_limit` bytes (a leak
of the implementation): it is a crash, with the steps up to the one that grew it.

What a job leaves behind ends with it: each worker leads a process group of its own,
killed whole when its job ends (the helper processes an implementation starts: a
tokenizer, a detokenizer, `sleep` in a test), and a worker ends with `os._exit` once its
result is sent, so a helper thread the implementation never joins cannot keep it alive.
When the forkserver itself dies or hangs loading an adapter (a crash or a hang at
import), starting a worker raises ForkserverDied, naming what it was importing.

The memory limit is measured, not imposed with setrlimit(RLIMIT_AS): the address space
counts what is reserved but never touched (allocator arenas, thread stacks, a CUDA
context reserves tens of GiB), so a limit on it would fail sound implementations. The
worker compares its peak resident set size with the limit before each journal event, so
the trace it leaves ends with the step that grew it (a leak that builds up over examples
is seen before the next example starts); the parent also reads each worker's resident
set size (/proc/PID/statm) at every poll, for a step that grows without returning.
Linux only; elsewhere no limit is enforced.
"""

import atexit
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import resource
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .trace import TraceStep

PRELOAD = ["kvspec.conformance.runs.runner", "torch", "kvspec.conformance.harness.forkserver_preload"]
"""What the forkserver imports: the last loads the adapters named in ADAPTERS_VARIABLE."""
ADAPTERS_VARIABLE, LOAD_SECONDS_VARIABLE, LOG_VARIABLE = \
    "KVSPEC_FORKSERVER_ADAPTERS", "KVSPEC_FORKSERVER_LOAD_SECONDS", "KVSPEC_FORKSERVER_LOG"
"""How the harness tells the forkserver (forkserver_preload.py) which adapters to load, how
long it may take, and where to write what it is importing."""
LOAD_SECONDS = 300.0
"""How long loading an adapter (importing its module and its preload) may take before it is
a hang at import (`--load-timeout`)."""
POLL_SECONDS = 0.05
MEMORY_LIMIT = 8 << 30
"""A worker's resident memory beyond which it is a leak (`--memory-limit`, in GiB)."""
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PAST_MEMORY_LIMIT = 86
"""A worker's exit status when it ends itself at the memory limit."""
STARTUP_SECONDS = 600
"""How long a worker may take to start (the forkserver's first start, importing the
implementation under test) before its first step: that is not a step's hang."""


class Journal:
    """The worker's side: what it is doing, where the parent can read it if it dies.

    Past `memory_limit` resident bytes the worker writes the peak it reached and ends at
    once (PAST_MEMORY_LIMIT), before the event that would start another step or example."""

    def __init__(self, path: str, heartbeat, memory_limit: int | None = None):
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the job's whole life
        self.heartbeat = heartbeat
        self.memory_limit = memory_limit if os.path.exists("/proc/self/statm") else None

    def __call__(self, kind: str, payload: Any):
        if self.memory_limit is not None and (peak := peak_resident_bytes()) > self.memory_limit:
            self.file.write(json.dumps({"memory": peak}) + "\n")
            os._exit(PAST_MEMORY_LIMIT)  # the parent reads why in the journal
        self.heartbeat.value = time.time()
        data = payload.to_json() if isinstance(payload, TraceStep) else payload
        self.file.write(json.dumps({kind: data}, separators=(",", ":")) + "\n")


@dataclass
class Lost:
    """A job whose process died or hung: why, and its last example as (config, steps)."""

    reason: str
    kind: str  # "crashed" or "hung"
    config: dict | None
    steps: list[TraceStep]


def last_example(path: str) -> tuple[dict | None, list[TraceStep], int | None]:
    """The journal's last example as (config, steps), and the peak resident bytes the
    worker wrote before ending itself at the memory limit (None if it did not)."""
    config, steps, peak = None, [], None
    try:
        with open(path) as journal:
            for line in journal:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    break  # the line being written when the process died
                if "example" in event:
                    config, steps = event["example"], []
                elif "step" in event:
                    step = event["step"]
                    steps.append(TraceStep(step["op"], step["args"], step.get("refuse", False)))
                elif "memory" in event:
                    peak = event["memory"]
    except OSError:
        pass
    return config, steps, peak


def past_memory_limit(used: int, limit: int) -> str:
    return (f"the process running the implementation grew to {used / (1 << 30):.1f} GiB of resident memory, past "
            f"the memory limit of {limit / (1 << 30):g} GiB (--memory-limit; a leak?)")


def peak_resident_bytes() -> int:
    """This process's peak resident set size (getrusage: one system call; Linux counts KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resident_bytes(pid: int) -> int | None:
    """The resident set size of process `pid`, or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def end_with_the_harness() -> None:
    """Make this worker end when the process that started it does.

    A worker can outlive its harness: one killed with SIGKILL, or one interrupted while
    the forkserver was still importing, whose request to fork it was already on its way
    (the forkserver forks it seconds later, after the harness has gone and removed the
    journals). Such an orphan would run its whole job for no reader and end in a
    traceback. The parent's sentinel becomes readable when the parent ends."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        try:
            os.killpg(0, signal.SIGKILL)  # its group: itself and what its implementation started
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="end-with-the-harness", daemon=True).start()


def worker_main(work: Callable, job: Any, connection, heartbeat, journal_path: str, memory_limit: int | None):
    # Ctrl-C reaches the terminal's process group: the parent stops the workers and reports
    # what finished; a worker of its own would print a traceback from inside its run
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setpgid(0, 0)  # a group of its own, killed whole when the job ends: the implementation's helpers too
    end_with_the_harness()
    try:
        journal = Journal(journal_path, heartbeat, memory_limit)
    except FileNotFoundError:  # the harness has gone and removed its journals: no one to report to
        os._exit(0)
    result = work(job, journal)
    connection.send(result)
    connection.close()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # not a return: multiprocessing would join every non-daemon thread first, and one the
    # implementation started and never joins (a watchdog, a poller) would keep it alive
    os._exit(0)


def end_group(process) -> None:
    """Kill a worker and every process of its group (what its implementation started)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, TypeError):
        process.kill()  # its group was never made, or is gone already
    process.join()


class ForkserverDied(Exception):
    """The forkserver died or hung while loading an adapter (forkserver_preload.py): what it
    was importing, from its log."""


def forkserver_log() -> str:
    """What the forkserver wrote while loading the adapters (forkserver_preload.py)."""
    path = os.environ.get(LOG_VARIABLE) or getattr(context, "log", None)
    try:
        with open(path, errors="replace") as log:
            return log.read()[-4000:]
    except (OSError, TypeError):
        return ""


def forkserver_failure(error: BaseException) -> ForkserverDied:
    """Why starting a worker failed: what the forkserver's log says it was doing."""
    lines = [line for line in forkserver_log().splitlines() if line.strip()]
    doing = next((line for line in reversed(lines) if line.startswith(("loading adapter", "importing"))), None)
    hung = any(line.startswith("Timeout (") for line in lines)
    where = f" while {doing}" if doing else ""
    if hung:
        stack = [line.strip() for line in lines if line.strip().startswith("File ")][:6]
        return ForkserverDied(f"the process loading the adapter did not finish within its {context.load_seconds:g} s"
                              f"{where} (a hang at import; --load-timeout)" +
                              ("; where it was: " + " <- ".join(stack) if stack else ""))
    return ForkserverDied(f"the process loading the adapter died{where} (a crash at import: os.abort, a signal "
                          f"or a native library; {type(error).__name__})")


def context(adapters: Iterable[str] = (), load_seconds: float = LOAD_SECONDS):
    """The forkserver context, its server started deaf to Ctrl-C, loading `adapters` (specs).

    Ctrl-C reaches the whole process group, the forkserver too. The forkserver ignores
    SIGINT only once its preload has finished (multiprocessing.forkserver.main), and that
    import of torch and the implementation takes seconds: a Ctrl-C then printed its
    KeyboardInterrupt traceback (seen on CI). Started with SIGINT ignored, it and every
    worker it forks inherit the ignore across exec, and the parent alone answers Ctrl-C.

    The adapters are named to it in the environment it starts with (forkserver_preload.py
    reads them): a forkserver already running keeps what it loaded, and a worker imports
    what it lacks itself."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    if getattr(context, "log", None) is None:
        descriptor, context.log = tempfile.mkstemp(prefix="kvspec-forkserver-", suffix=".log")
        os.close(descriptor)
        atexit.register(lambda path=context.log: os.path.exists(path) and os.remove(path))
    context.load_seconds = load_seconds
    told = {ADAPTERS_VARIABLE: "\n".join(adapters), LOAD_SECONDS_VARIABLE: repr(float(load_seconds)),
            LOG_VARIABLE: context.log}
    saved = {name: os.environ.get(name) for name in told}
    os.environ.update(told)
    main_thread = threading.current_thread() is threading.main_thread()  # only there can a handler change
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
        for name, value in saved.items():  # this process loads no adapter itself
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return ctx


def run_jobs(jobs: Iterable[Any], work: Callable[[Any, Journal], Any], on_lost: Callable[[Any, Lost], Any],
             workers: int, step_timeout: float, on_done: Callable[[Any, Any], None], adapters: Iterable[str] = (),
             memory_limit: int | None = MEMORY_LIMIT, load_seconds: float = LOAD_SECONDS,
             startup_seconds: float = STARTUP_SECONDS) -> None:
    """Run `work(job, journal)` for every job in a worker process; call `on_done(job,
    result)` as each finishes, with `on_lost(job, lost)` as the result of a lost one.
    `adapters`: the specs of the adapters the jobs load, which the forkserver loads first
    (their slow imports, once), taking at most `load_seconds`; `memory_limit`: a worker's
    most resident bytes (None: unbounded); `startup_seconds`: how long a worker may take to
    its first event. ForkserverDied when the forkserver dies or hangs loading them."""
    ctx = context(adapters, load_seconds)
    pending = list(jobs)
    running = []
    with tempfile.TemporaryDirectory(prefix="kvspec-journal-") as journals:
        try:
            supervise(ctx, pending, running, journals, work, on_lost, workers, step_timeout, on_done, memory_limit,
                      startup_seconds)
        finally:  # interrupted (Ctrl-C, SIGTERM, an error): no worker outlives the harness
            for _job, process, *_ in running:
                end_group(process)


def supervise(ctx, pending: list, running: list, journals: str, work, on_lost, workers: int,
              step_timeout: float, on_done, memory_limit: int | None = None,
              startup_seconds: float = STARTUP_SECONDS) -> None:
    """Start jobs while fewer than `workers` run; collect each result, or declare it lost."""
    while pending or running:
        while pending and len(running) < max(1, workers):
            job = pending.pop(0)
            receiver, sender = ctx.Pipe(duplex=False)
            heartbeat = ctx.Value("d", 0.0, lock=False)  # 0 until the job's first event
            path = os.path.join(journals, f"job-{id(job)}-{len(pending)}.jsonl")
            process = ctx.Process(target=worker_main, args=(work, job, sender, heartbeat, path, memory_limit),
                                  daemon=True)
            try:
                process.start()  # the forkserver forks it: after it has loaded the adapters
            except (EOFError, OSError) as error:
                raise forkserver_failure(error) from None
            sender.close()
            running.append((job, process, receiver, heartbeat, path, time.time()))
        time.sleep(POLL_SECONDS)
        for entry in list(running):
            job, process, receiver, heartbeat, path, started = entry
            result = None
            if receiver.poll():
                try:
                    result = receiver.recv()
                except EOFError:
                    result = None
            if result is not None:
                end_group(process)
            elif not process.is_alive():
                end_group(process)
                config, steps, peak = last_example(path)
                how = f"signal {-process.exitcode}" if process.exitcode and process.exitcode < 0 \
                    else f"exit status {process.exitcode}"
                why = past_memory_limit(peak, memory_limit) if peak is not None and memory_limit is not None \
                    else f"the process running the implementation died ({how})"
                result = on_lost(job, Lost(why, "crashed", config, steps))
            elif memory_limit is not None and (used := resident_bytes(process.pid) or 0) > memory_limit:
                end_group(process)
                config, steps, _ = last_example(path)
                result = on_lost(job, Lost(past_memory_limit(used, memory_limit), "crashed", config, steps))
            elif (time.time() - heartbeat.value > step_timeout if heartbeat.value
                  else time.time() - started > max(step_timeout, startup_seconds)):
                end_group(process)
                config, steps, _ = last_example(path)
                result = on_lost(job, Lost(f"no step finished within {step_timeout:g} s (hang)", "hung", config, steps))
            else:
                continue
            receiver.close()
            running.remove(entry)
            on_done(job, result)
