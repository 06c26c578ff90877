"""The history table: `kvspec check` over every member of the `sglang@` family (release x
tree x knob), one process per member, and the table of what each found.

    python -m kvspec.adapters.sglang.releases history --profile ci --out DIR [--shard I/N]
    python -m kvspec.adapters.sglang.releases table DIR/history*.json --out docs

`history` runs its shard of the members (all by default; `--members` picks some by name
prefix, `--defaults` only each tree at its release's default knobs) and writes `DIR/history[-I-of-N].json`, with each member's own report and traces
beside it; separate machines or CI jobs run one shard each. `table` merges the shards'
JSON into `sglang-history.json` and `sglang-history.md`. A violation in the table names
the finding that explains it: one whose pattern it matches (findings.py) and whose range
its own trace bisects to, along its line (the members of its tree and knobs, every
release: `kvspec bisect`, findings.disagreement). One no finding explains is marked
UNEXPLAINED, with why, and `table` exits 1 until it is explained. The bisections are kept
beside each shard (BISECTIONS), so a `table` again replays only traces it has not seen;
`--no-bisect` explains by pattern only, and the table says so.
"""

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from kvspec.conformance.harness.trace import TraceError, load
from kvspec.conformance.runs.bisect import Outcome, members_of, replay_pairs
from kvspec.conformance.runs.history import Member
from kvspec.conformance.runs.history import history as run_history

from .catalog import FAMILY, MEMBERS, key, placement
from .environment import installed
from .findings import FINDINGS, disagreement, explain

SCHEMA = "kvspec-sglang-history/1"


def chosen(prefixes: list[str] | None, defaults: bool = False) -> list[str]:
    """Members by release; those whose name starts with one of `prefixes`; with `defaults`,
    only those at their release's default knobs (each tree)."""
    names = sorted((f"sglang@{slug}" for slug, adapter in MEMBERS.members.items() if not (defaults and adapter.knobs)),
                   key=lambda name: (key(MEMBERS.members[name.removeprefix("sglang@")].release), name))
    return [name for name in names if not prefixes or any(name.startswith(prefix) for prefix in prefixes)]


def member(name: str) -> Member:
    """A member as the history checks it: its columns are its release, tree, knobs and policy."""
    adapter = MEMBERS.members[name.removeprefix("sglang@")]
    return Member(name, dict(member=name, release=adapter.release, tree=adapter.tree, knobs=adapter.knobs,
                             policy_version=adapter.policy_version), installed(adapter.release))


def history(profile: str, out: Path, shard_spec: str | None, members: list[str] | None, workers: int,
            defaults: bool = False, shrink_seconds: float | None = None, examples: Path | None = None,
            seed: int | None = None) -> Path:
    """Check this shard's members one after another (kvspec.conformance.runs.history)."""
    return run_history(map(member, chosen(members, defaults)), SCHEMA, profile, out, shard_spec, workers,
                       shrink_seconds, examples, seed)


# -- the table ----------------------------------------------------------------------------------

def first_failure(cell: dict) -> dict | None:
    return next((run for run in cell["runs"] if run["verdict"] != "ok"), None)


def by_pattern(cell: dict, run: dict) -> tuple[str | None, str]:
    """(the finding that explains a failing run by its pattern alone, or None; why not)."""
    return explain(cell, run), "no finding matches it"


def row(cell: dict, explained=by_pattern) -> tuple[str, ...]:
    """The first failing run's details; the findings of every failing run (`explained`:
    by_pattern, or Bisections.explained)."""
    run = first_failure(cell)
    knobs = ", ".join(cell["knobs"]) or "defaults"
    failed = [r for r in cell["runs"] if r["verdict"] != "ok"]
    verdict = cell["verdict"] + (f" ({len(failed)} of {len(cell['runs'])} runs)" if failed else "")
    if run is None:
        return (cell["release"], cell["tree"], knobs, cell["policy_version"], verdict, "", "", "", "")
    findings = [explained(cell, r) for r in failed]
    named = [f"[{f}](engines/sglang-findings.md#{f})" for f in dict.fromkeys(f for f, _ in findings if f)]
    if unexplained := [f"{r['label']} ({why})" for r, (f, why) in zip(failed, findings) if f is None]:
        named.append("UNEXPLAINED: " + "; ".join(unexplained))
    seconds = run.get("first_failure_seconds")
    return (cell["release"], cell["tree"], knobs, cell["policy_version"], verdict,
            f"{', '.join(run['clauses']) or run['verdict']} ({run['label']})", str(run.get("trace_steps") or ""),
            "" if seconds is None else f"{seconds:.1f}", ", ".join(named))


HEADER = ("release", "tree", "knobs", "policy", "verdict", "first violated clause (run)", "shrunk steps",
          "s to 1st counterexample", "explained by (every failing run)")


def table(shards: list[Path], out: Path, bisect: bool = False, workers: int = 1) -> int:
    """Merge the shards into the table; with `bisect` (the command's default), a violation
    is explained only where its trace also bisects to its finding's range."""
    by_member, profiles, folders = {}, set(), {}
    for path in shards:  # a member checked in several shards: the last one given counts
        document = json.loads(path.read_text())
        if document.get("schema") != SCHEMA:
            raise SystemExit(f"{path}: not a history shard (schema {document.get('schema')!r}, expected {SCHEMA})")
        profiles.add(document["profile"])
        by_member.update((cell["member"], cell) for cell in document["cells"])
        folders.update((cell["member"], path.parent) for cell in document["cells"])
    cells = sorted(by_member.values(), key=lambda cell: (key(cell["release"]), cell["member"]))
    explained = Bisections(cells, folders, workers).explained if bisect else by_pattern
    rows = [row(cell, explained) for cell in cells]
    how = ("its own shrunk trace reproduces, along its line (the same tree and knobs, every release: "
           "`kvspec bisect`), on exactly the releases the finding reaches" if bisect else
           "explained by the findings' patterns only: its trace was not bisected (`table --no-bisect`)")
    lines = ["# SGLang's release history, checked by kvspec", "",
             (f"Written by `python -m kvspec.adapters.sglang.releases table` from `kvspec check --profile "
              f"{'/'.join(sorted(profiles))}` of {len(cells)} of the {len(MEMBERS)} members of the `sglang@` family "
              "(adapters/sglang/releases/catalog.py): one row per release, tree and knob turned from its default. "
              "Each violation is explained in [engines/sglang-findings.md](engines/sglang-findings.md), which also "
              f"says how this table was run; a violation is explained by a finding whose pattern it matches where "
              f"{how}."),
             "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "sglang-history.md").write_text("\n".join(lines) + "\n")
    (out / "sglang-history.json").write_text(json.dumps({"schema": SCHEMA, "profile": "/".join(sorted(profiles)),
                                                         "cells": cells}, indent=1))
    unexplained = [cell["member"] for cell, r in zip(cells, rows) if "UNEXPLAINED" in r[-1]]
    print(f"wrote {out / 'sglang-history.md'}: {len(cells)} members, "
          f"{sum(cell['verdict'] != 'ok' for cell in cells)} with a violation, {len(unexplained)} unexplained"
          + (f" ({', '.join(unexplained)})" if unexplained else "")
          + ("" if bisect else "; by the findings' patterns only (--no-bisect)"))
    return 1 if unexplained else 0


# -- bisecting the table's traces ---------------------------------------------------------------

BISECTIONS = "bisections.json"
"""Beside each shard: each trace's outcomes on the members of its line, by the trace's
SHA-256 (a trace written again is bisected again). Delete it to bisect everything again,
say after an adapter of the releases changed."""
BISECTIONS_SCHEMA = "kvspec-sglang-bisections/1"


def line_of(cell: dict) -> str:
    return placement(MEMBERS.members[cell["member"].removeprefix("sglang@")])[1]


class Bisections:
    """Every failing run's trace, bisected along its cell's line: from the cache beside its
    shard where it holds them, else replayed (one process per release, all traces at once)."""

    def __init__(self, cells: list[dict], folders: dict[str, Path], workers: int = 1):
        self.members, self.folders = members_of(FAMILY), folders
        self.outcomes: dict[tuple[Path, str], dict[str, Outcome]] = {}  # (folder, trace) -> member -> outcome
        self.problems: dict[tuple[Path, str | None], str] = {}  # a run whose trace cannot be bisected: why
        caches = {folder: self.read_cache(folder) for folder in set(folders.values())}
        digests, wanted = {}, []  # wanted: (folder, trace, member) still to replay
        for cell in cells:
            folder, line = folders[cell["member"]], line_of(cell)
            for run in (run for run in cell["runs"] if run["verdict"] != "ok"):
                where = folder, run.get("trace")
                if where in digests or where in self.problems:
                    continue
                if not run.get("trace"):
                    self.problems[where] = "the run saved no trace to bisect"
                    continue
                try:
                    digests[where] = hashlib.sha256((folder / run["trace"]).read_bytes()).hexdigest()
                    load(folder / run["trace"])
                except (OSError, TraceError) as error:
                    self.problems[where] = f"its trace cannot be read ({error})"
                    digests.pop(where, None)
                    continue
                cached = caches[folder].get(run["trace"], {})
                known = cached.get("members", {}) if cached.get("sha256") == digests[where] else {}
                self.outcomes[where] = {name: Outcome.from_json(outcome) for name, outcome in known.items()}
                wanted += [(folder, run["trace"], member) for member in self.members
                           if member.line == line and member.name not in known]
        if not wanted:
            return
        print(f"bisecting {len({(folder, trace) for folder, trace, _ in wanted})} trace(s) along their lines: "
              f"{len(wanted)} replays, one process per release", flush=True)
        replayed = replay_pairs([(str(folder / trace), member) for folder, trace, member in wanted], workers,
                                on_version=self.progress)
        for (folder, trace, _member), outcome in zip(wanted, replayed):
            self.outcomes[folder, trace][outcome.member] = outcome
        for folder, cache in caches.items():
            cache.update({trace: {"sha256": digests[where, trace],
                                  "members": {name: asdict(outcome) for name, outcome in outcomes.items()}}
                          for (where, trace), outcomes in self.outcomes.items() if where == folder})
            try:
                (folder / BISECTIONS).write_text(json.dumps({"schema": BISECTIONS_SCHEMA, "traces": cache}, indent=1))
            except OSError as error:  # the table stands; the next one bisects again
                print(f"could not keep the bisections in {folder / BISECTIONS}: {error.strerror or error}")

    @staticmethod
    def read_cache(folder: Path) -> dict:
        try:
            document = json.loads((folder / BISECTIONS).read_text())
        except (OSError, ValueError):
            return {}
        return document.get("traces", {}) if document.get("schema") == BISECTIONS_SCHEMA else {}

    @staticmethod
    def progress(release: str, outcomes: list, seconds: float) -> None:
        print(f"  {release}: {len(outcomes)} replays in {seconds:.1f} s", flush=True)

    def explained(self, cell: dict, run: dict) -> tuple[str | None, str]:
        """(the first finding whose pattern the run matches and whose range its trace bisects
        to, or None; why none does)."""
        candidates = [finding for finding in FINDINGS if finding.matches(cell, run)]
        if not candidates:
            return None, "no finding matches it"
        where = self.folders[cell["member"]], run.get("trace")
        if where in self.problems:
            return None, f"{candidates[0].id} by its pattern, but {self.problems[where]}"
        outcomes = self.outcomes[where]
        line = [(member.version, outcomes[member.name]) for member in self.members
                if member.line == line_of(cell) and member.name in outcomes]
        whys = [disagreement(finding, cell["tree"], cell["knobs"], line) for finding in candidates]
        if None in whys:
            return candidates[whys.index(None)].id, ""
        return None, f"{candidates[0].id} by its pattern, but its trace {whys[0]}"
