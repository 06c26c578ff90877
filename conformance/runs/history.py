"""A family's release history: `kvspec check` of each of its members (a release, a tree,
a knob...), one process per member, split into shards that separate processes or machines
run, each shard written as one JSON document of cells.

A cell is a member's own columns (its name, release and what its family says of it: the
tree and knobs of an SGLang member, the retention of a vLLM one), the verdict of its check
and its runs, each run's failures as entries of their own (every distinct failure of a run,
`--multiple-bugs`: a member's second bug is not hidden behind its first). What explains a
violation (its family's findings, bisection along its line) is the family's table
(adapters/sglang/releases/history.py); this module only runs the checks and keeps what they
found.
"""

import json
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Member:
    """One member of a history: its adapter name, its own columns (first `member` and
    `release`), and whether its release is installed here."""

    name: str
    columns: dict
    installed: bool


def shard(names: list[str], spec: str | None) -> list[str]:
    """The I-th of N interleaved shards of `names` (`spec` "I/N"), or all of them."""
    if not spec:
        return names
    index, _, count = spec.partition("/")
    try:
        index, count = int(index), int(count)
    except ValueError:
        index, count = 0, 0
    if not 1 <= index <= count:
        raise SystemExit(f"--shard {spec}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return names[index - 1::count]


def check(member: Member, profile: str, workers: int, out: Path, shrink_seconds: float | None = None,
          examples: Path | None = None, seed: int | None = None) -> dict:
    """`kvspec check` of one member in its own process: the member's cell."""
    if not member.installed:
        return {**member.columns, "verdict": "not-installed", "runs": [], "seconds": 0.0}
    name = member.name.replace("@", "-")
    report, traces = out / "reports" / f"{name}.json", out / "traces" / name
    report.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    command = [sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", member.name, "--profile", profile,
               "-n", str(workers), "--json", str(report), "--traces", str(traces), "--multiple-bugs"]
    command += ["--shrink-seconds", str(shrink_seconds)] if shrink_seconds else []
    command += ["--example-database", str(examples)] if examples else []
    command += ["--seed", str(seed)] if seed is not None else []
    with open(out / "reports" / f"{name}.log", "w") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    if status not in (0, 1) or not report.is_file():
        return {**member.columns, "verdict": "error", "runs": [{"label": "check", "verdict": "error", "clauses": [],
                                                                "message": f"exit status {status}; see {log.name}"}],
                "seconds": seconds}
    found = json.loads(report.read_text())
    fields = ("label", "run", "verdict", "clauses", "message", "trace", "trace_steps", "first_failure_seconds")
    # a run's further failures are entries of their own, marked `also`: each is explained on its own
    runs = [{field: each.get(field) for field in fields} | extra for run in found["runs"]
            for each, extra in ((run, {}), *((dict(other, label=run["label"], run=run["run"]), {"also": True})
                                             for other in run.get("other_failures", ())))]
    for run in runs:  # where the shard's folder goes, its traces go: relative to it
        if run["trace"]:
            run["trace"] = str(Path(run["trace"]).resolve().relative_to(out.resolve()))
    verdict = next((run["verdict"] for run in runs if run["verdict"] != "ok"), "ok")
    return {**member.columns, "verdict": verdict, "runs": runs, "seconds": seconds}


def history(members: Iterable[Member], schema: str, profile: str, out: Path, shard_spec: str | None, workers: int,
            shrink_seconds: float | None = None, examples: Path | None = None, seed: int | None = None) -> Path:
    """Check this shard's members one after another and write `out/history[-I-of-N].json`;
    `examples`: a Hypothesis example database they share (off by default: a failure saved by
    one release is then tried first on the next, which finds it sooner there but makes the
    seconds to a first counterexample say less about a search from scratch)."""
    lineup = {member.name: member for member in members}
    names = shard(list(lineup), shard_spec)
    out.mkdir(parents=True, exist_ok=True)
    cells = []
    for number, name in enumerate(names, 1):
        cell = check(lineup[name], profile, workers, out, shrink_seconds, examples, seed)
        cells.append(cell)
        failed = [f"{run['label']}: {', '.join(run['clauses']) or run['verdict']}" for run in cell["runs"]
                  if run["verdict"] != "ok"]
        print(f"[{number}/{len(names)}] {name}: {cell['verdict']} in {cell['seconds']:.0f} s"
              + (f" ({'; '.join(failed)})" if failed else ""), flush=True)
    suffix = f"-{shard_spec.replace('/', '-of-')}" if shard_spec else ""
    path = out / f"history{suffix}.json"
    path.write_text(json.dumps({"schema": schema, "profile": profile, "cells": cells}, indent=1))
    print(f"wrote {path}")
    return path
