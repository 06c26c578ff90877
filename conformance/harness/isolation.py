"""Running jobs in worker processes, so that a crash or a hang of the implementation under
test is a failure with its trace, and the harness survives it.

Each job runs in its own process, forked from a forkserver that has already imported
kvspec, Hypothesis and torch (so a start costs milliseconds, and no thread pool is
forked). Up to `workers` run at once. A job reports through a Journal: a line per
example and per step, written to a file before the step runs, and a heartbeat. When a
job's process dies, or no step finishes within `step_timeout` seconds, the parent kills
it and hands `on_lost` the journal's last example: the steps up to the one that crashed
or hung.
"""

import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .trace import TraceStep

PRELOAD = ["kvspec.conformance.runs.jobs", "torch"]
POLL_SECONDS = 0.05
STARTUP_SECONDS = 600
"""How long a worker may take to start (the forkserver's first start, importing the
implementation under test) before its first step: that is not a step's hang."""


class Journal:
    """The worker's side: what it is doing, where the parent can read it if it dies."""

    def __init__(self, path: str, heartbeat):
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the job's whole life
        self.heartbeat = heartbeat

    def __call__(self, kind: str, payload: Any):
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


def last_example(path: str) -> tuple[dict | None, list[TraceStep]]:
    config, steps = None, []
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
    except OSError:
        pass
    return config, steps


def worker_main(work: Callable, job: Any, connection, heartbeat, journal_path: str):
    result = work(job, Journal(journal_path, heartbeat))
    connection.send(result)
    connection.close()


def context(preload: Iterable[str] = ()):
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, *preload])
    return ctx


def run_jobs(jobs: Iterable[Any], work: Callable[[Any, Journal], Any], on_lost: Callable[[Any, Lost], Any],
             workers: int, step_timeout: float, on_done: Callable[[Any, Any], None], preload: Iterable[str] = ()) -> None:
    """Run `work(job, journal)` for every job in a worker process; call `on_done(job,
    result)` as each finishes, with `on_lost(job, lost)` as the result of a lost one.
    `preload`: modules the forkserver imports first (an adapter's slow imports, once)."""
    ctx = context(preload)
    pending = list(jobs)
    running = []
    with tempfile.TemporaryDirectory(prefix="kvspec-journal-") as journals:
        try:
            supervise(ctx, pending, running, journals, work, on_lost, workers, step_timeout, on_done)
        finally:  # interrupted (Ctrl-C, SIGTERM, an error): no worker outlives the harness
            for _job, process, *_ in running:
                process.kill()
                process.join()


def supervise(ctx, pending: list, running: list, journals: str, work, on_lost, workers: int,
              step_timeout: float, on_done) -> None:
    """Start jobs while fewer than `workers` run; collect each result, or declare it lost."""
    while pending or running:
        while pending and len(running) < max(1, workers):
            job = pending.pop(0)
            receiver, sender = ctx.Pipe(duplex=False)
            heartbeat = ctx.Value("d", 0.0, lock=False)  # 0 until the job's first event
            path = os.path.join(journals, f"job-{id(job)}-{len(pending)}.jsonl")
            process = ctx.Process(target=worker_main, args=(work, job, sender, heartbeat, path), daemon=True)
            process.start()
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
                process.join()
            elif not process.is_alive():
                process.join()
                how = f"signal {-process.exitcode}" if process.exitcode and process.exitcode < 0 \
                    else f"exit status {process.exitcode}"
                result = on_lost(job, Lost(f"the process running the implementation died ({how})", "crashed",
                                           *last_example(path)))
            elif (time.time() - heartbeat.value > step_timeout if heartbeat.value
                  else time.time() - started > max(step_timeout, STARTUP_SECONDS)):
                process.kill()
                process.join()
                result = on_lost(job, Lost(f"no step finished within {step_timeout:g} s (hang)", "hung",
                                           *last_example(path)))
            else:
                continue
            receiver.close()
            running.remove(entry)
            on_done(job, result)
