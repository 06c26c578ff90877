"""The history table: `kvspec check` over every member of the `sglang@` family (release x
tree x knob), one process per member, and the table of what each found.

    python -m kvspec.adapters.sglang.releases history --profile ci --out DIR [--shard I/N]
    python -m kvspec.adapters.sglang.releases table DIR/history*.json --out docs

`history` runs its shard of the members (all by default; `--members` picks some by name
prefix, `--defaults` only each tree at its release's default knobs) and writes `DIR/history[-I-of-N].json`, with each member's own report and traces
beside it; separate machines or CI jobs run one shard each. `table` merges the shards'
JSON into `sglang-history.json` and `sglang-history.md`. A violation in the table names
the finding that explains it (findings.py); one no finding explains is marked
UNEXPLAINED, and `table` exits 1 until it is explained.
"""

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .catalog import MEMBERS, key
from .environment import installed
from .findings import explain

SCHEMA = "kvspec-sglang-history/1"


@dataclass(frozen=True)
class Cell:
    """What one member's check found."""

    member: str
    release: str
    tree: str
    knobs: tuple[str, ...]
    policy_version: str
    verdict: str
    """ok, violated, crashed, hung, or not-installed / error (the check did not report)."""
    runs: tuple[dict, ...]
    """Per run: label, run (its configuration: what findings read), verdict, clauses, trace,
    trace_steps, first_failure_seconds."""
    seconds: float


def shard(names: list[str], spec: str | None) -> list[str]:
    if not spec:
        return names
    index, _, count = spec.partition("/")
    index, count = int(index), int(count)
    if not 1 <= index <= count:
        raise SystemExit(f"--shard {spec}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return names[index - 1::count]


def chosen(prefixes: list[str] | None, defaults: bool = False) -> list[str]:
    """Members by release; those whose name starts with one of `prefixes`; with `defaults`,
    only those at their release's default knobs (each tree)."""
    names = sorted((f"sglang@{slug}" for slug, adapter in MEMBERS.members.items() if not (defaults and adapter.knobs)),
                   key=lambda name: (key(MEMBERS.members[name.removeprefix("sglang@")].release), name))
    return [name for name in names if not prefixes or any(name.startswith(prefix) for prefix in prefixes)]


def check(member: str, profile: str, workers: int, out: Path, shrink_seconds: float | None = None,
          examples: Path | None = None, seed: int | None = None) -> Cell:
    adapter = MEMBERS.members[member.removeprefix("sglang@")]
    cell = dict(member=member, release=adapter.release, tree=adapter.tree, knobs=adapter.knobs,
                policy_version=adapter.policy_version)
    if not installed(adapter.release):
        return Cell(**cell, verdict="not-installed", runs=(), seconds=0.0)
    name = member.replace("@", "-")
    report, traces = out / "reports" / f"{name}.json", out / "traces" / name
    report.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    command = [sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", member, "--profile", profile,
               "-n", str(workers), "--json", str(report), "--traces", str(traces)]
    command += ["--shrink-seconds", str(shrink_seconds)] if shrink_seconds else []
    command += ["--example-database", str(examples)] if examples else []
    command += ["--seed", str(seed)] if seed is not None else []
    with open(out / "reports" / f"{name}.log", "w") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    if status not in (0, 1) or not report.is_file():
        return Cell(**cell, verdict="error", runs=({"label": "check", "verdict": "error", "clauses": [],
                                                   "message": f"exit status {status}; see {log.name}"},), seconds=seconds)
    found = json.loads(report.read_text())
    runs = tuple({field: run.get(field) for field in ("label", "run", "verdict", "clauses", "message", "trace",
                                                      "trace_steps", "first_failure_seconds")} for run in found["runs"])
    for run in runs:  # where the shard's folder goes, its traces go: relative to it
        if run["trace"]:
            run["trace"] = str(Path(run["trace"]).resolve().relative_to(out.resolve()))
    verdict = next((run["verdict"] for run in runs if run["verdict"] != "ok"), "ok")
    return Cell(**cell, verdict=verdict, runs=runs, seconds=seconds)


def history(profile: str, out: Path, shard_spec: str | None, members: list[str] | None, workers: int,
            defaults: bool = False, shrink_seconds: float | None = None, examples: Path | None = None,
            seed: int | None = None) -> Path:
    """Check this shard's members one after another; `examples`: a Hypothesis example
    database they share (point every shard at one folder). Off by default: a failure saved
    by one release is then tried first on the next, which finds it sooner there but makes
    the table's seconds to the first counterexample say less about a search from scratch."""
    names = shard(chosen(members, defaults), shard_spec)
    out.mkdir(parents=True, exist_ok=True)
    cells = []
    for number, member in enumerate(names, 1):
        cell = check(member, profile, workers, out, shrink_seconds, examples, seed)
        cells.append(cell)
        failed = [f"{run['label']}: {', '.join(run['clauses']) or run['verdict']}" for run in cell.runs
                  if run["verdict"] != "ok"]
        print(f"[{number}/{len(names)}] {member}: {cell.verdict} in {cell.seconds:.0f} s"
              + (f" ({'; '.join(failed)})" if failed else ""), flush=True)
    suffix = f"-{shard_spec.replace('/', '-of-')}" if shard_spec else ""
    path = out / f"history{suffix}.json"
    path.write_text(json.dumps({"schema": SCHEMA, "profile": profile, "cells": [asdict(c) for c in cells]}, indent=1))
    print(f"wrote {path}")
    return path


# -- the table ----------------------------------------------------------------------------------

def first_failure(cell: dict) -> dict | None:
    return next((run for run in cell["runs"] if run["verdict"] != "ok"), None)


def row(cell: dict) -> tuple[str, ...]:
    """The first failing run's details; the findings of every failing run."""
    run = first_failure(cell)
    knobs = ", ".join(cell["knobs"]) or "defaults"
    failed = [r for r in cell["runs"] if r["verdict"] != "ok"]
    verdict = cell["verdict"] + (f" ({len(failed)} of {len(cell['runs'])} runs)" if failed else "")
    if run is None:
        return (cell["release"], cell["tree"], knobs, cell["policy_version"], verdict, "", "", "", "")
    findings = [explain(cell, r) for r in failed]
    named = [f"[{f}](engines/sglang-findings.md#{f})" for f in dict.fromkeys(f for f in findings if f)]
    if None in findings:
        named.append("UNEXPLAINED: " + ", ".join(r["label"] for r, f in zip(failed, findings) if f is None))
    seconds = run.get("first_failure_seconds")
    return (cell["release"], cell["tree"], knobs, cell["policy_version"], verdict,
            f"{', '.join(run['clauses']) or run['verdict']} ({run['label']})", str(run.get("trace_steps") or ""),
            "" if seconds is None else f"{seconds:.1f}", ", ".join(named))


HEADER = ("release", "tree", "knobs", "policy", "verdict", "first violated clause (run)", "shrunk steps",
          "s to 1st counterexample", "explained by (every failing run)")


def table(shards: list[Path], out: Path) -> int:
    by_member, profiles = {}, set()
    for path in shards:  # a member checked in several shards: the last one given counts
        document = json.loads(path.read_text())
        if document.get("schema") != SCHEMA:
            raise SystemExit(f"{path}: not a history shard (schema {document.get('schema')!r}, expected {SCHEMA})")
        profiles.add(document["profile"])
        by_member.update((cell["member"], cell) for cell in document["cells"])
    cells = sorted(by_member.values(), key=lambda cell: (key(cell["release"]), cell["member"]))
    rows = [row(cell) for cell in cells]
    lines = ["# SGLang's release history, checked by kvspec", "",
             f"Written by `python -m kvspec.adapters.sglang.releases table` from `kvspec check --profile "
             f"{'/'.join(sorted(profiles))}` of {len(cells)} of the {len(MEMBERS)} members of the `sglang@` family "
             "(adapters/sglang/releases/catalog.py): one row per release, tree and knob turned from its default. "
             "Each violation is explained in [engines/sglang-findings.md](engines/sglang-findings.md), which also "
             "says how this table was run.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "sglang-history.md").write_text("\n".join(lines) + "\n")
    (out / "sglang-history.json").write_text(json.dumps({"schema": SCHEMA, "profile": "/".join(sorted(profiles)),
                                                         "cells": cells}, indent=1))
    unexplained = [cell["member"] for cell, r in zip(cells, rows) if "UNEXPLAINED" in r[-1]]
    print(f"wrote {out / 'sglang-history.md'}: {len(cells)} members, "
          f"{sum(cell['verdict'] != 'ok' for cell in cells)} with a violation, {len(unexplained)} unexplained"
          + (f" ({', '.join(unexplained)})" if unexplained else ""))
    return 1 if unexplained else 0
