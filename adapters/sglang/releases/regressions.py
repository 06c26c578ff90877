"""The regression vectors of the bugs the history table found (findings.py), replayed on
every installed release: each must fail, on a clause of its finding, on every release
that has the bug, and pass on every other.

A vector is a kvspec trace under `vectors/regressions/` (no expected observables: they
differ between releases). It is replayed with the policy version the member declares, so
one vector serves releases whose retention differs; one process per release, as always.

    python -m kvspec.adapters.sglang.releases regressions [RELEASE ...]
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from .catalog import MEMBERS, Release, key
from .environment import RELEASES, installed
from .findings import FINDINGS, Finding

VECTORS = Path(__file__).resolve().parents[3] / "vectors" / "regressions"
"""In the repository (an editable install: `pip install -e .`)."""


def expectations(finding: Finding, release: str) -> list[tuple[str, bool]]:
    """(member, fails) for one release: its members whose tree the finding names, at
    their default knobs, and with the knobs the finding needs before it was on by default."""
    found = []
    for tree in Release(release).trees:
        if tree not in finding.trees:
            continue
        base = f"sglang@{release}" + ("" if tree == Release(release).default_tree else f"-{tree}")
        affected = key(finding.first) <= key(release) <= key(finding.last)
        by_default = affected and key(release) >= key(finding.by_default_from)
        found.append((base, by_default))
        if finding.knobs and not by_default:
            member = base + "".join(f"+{knob}" for knob in finding.knobs)
            if member.removeprefix("sglang@") in MEMBERS:
                found.append((member, affected))
    return found


def replay_here(member: str, vector: Path) -> dict:
    """Replay one vector on one member in this process."""
    from kvspec.conformance.harness.protocol import load_adapter
    from kvspec.conformance.harness.replay import replay
    from kvspec.conformance.harness.trace import load

    adapter = load_adapter(member)
    trace = load(vector)
    config = dict(trace.config, policy=dict(trace.config["policy"], version=adapter.policy_version))
    result = replay(replace(trace, config=config, adapter=member), adapter, compare=False)
    return {"member": member, "vector": vector.name, "conforms": result.conforms, "stopped_at": result.stopped_at,
            "clauses": list(result.failure.clauses) if result.failure else [], "verdict": result.verdict()}


def replay_release(release: str) -> list[dict]:
    """Every vector on the members of one release (a process of its own)."""
    command = [sys.executable, "-c", "import json, sys; from kvspec.adapters.sglang.releases.regressions import "
               "in_process; print(json.dumps(in_process(sys.argv[1])))", release]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"replaying on SGLang {release} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def in_process(release: str) -> list[dict]:
    results = []
    for finding in FINDINGS:
        if finding.vector is None:
            continue
        for member, fails in expectations(finding, release):
            result = replay_here(member, VECTORS / finding.vector)
            results.append(dict(result, finding=finding.id, expected_to_fail=fails,
                                as_expected=(not result["conforms"]) == fails
                                and (not fails or bool(set(result["clauses"]) & set(finding.clauses)))))
    return results


def report(releases: list[str]) -> int:
    releases = releases or [release for release in RELEASES if installed(release)]
    wrong = 0
    for release in releases:
        for result in replay_release(release):
            expected = "fails" if result["expected_to_fail"] else "passes"
            mark = "ok" if result["as_expected"] else "WRONG"
            wrong += not result["as_expected"]
            print(f"{mark:5} {result['finding']} on {result['member']}: {expected} as expected" if result["as_expected"]
                  else f"{mark:5} {result['finding']} on {result['member']}: expected it {expected}; {result['verdict']}",
                  flush=True)
    return 1 if wrong else 0
