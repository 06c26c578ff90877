"""The regression vectors of what the history table found (findings.py), replayed on
every installed release: each must fail, on a clause of its finding, on every member
that has the bug (or keeps the divergence), and pass on every other.

A vector is a kvspec trace under `vectors/regressions/sglang/`, or a known divergence's
trace under `vectors/divergences/sglang/` (no expected observables are compared: they
differ between releases). It is replayed with
the policy version the member declares, so one vector serves releases whose retention
differs; one process per release, as always. A member that cannot drive the vector's
steps (a PD admission before 0.5.23) skips it, and says so.

    python -m kvspec.adapters.sglang.releases regressions [RELEASE ...]
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from kvspec.conformance.runs.tree import TREE

from .catalog import MEMBERS, Release
from .environment import RELEASES, installed
from .findings import FINDINGS, Finding, explain

ROOT = TREE.parent
"""What a finding's vector path is relative to: the repository, whose vectors/ is the tree
(an editable install: `pip install -e .`), or the installed kvspec, which ships it."""


def expectations(finding: Finding, release: str) -> list[tuple[str, bool]]:
    """(member, fails) for one release: its members whose tree the finding names, at
    their default knobs, and with the finding's knobs where the defaults do not reach it."""
    found = []
    for tree in Release(release).trees:
        if tree not in finding.trees:
            continue
        base = f"sglang@{release}" + ("" if tree == Release(release).default_tree else f"-{tree}")
        found.append((base, finding.reaches(release, ())))
        turned = base + "".join(f"+{knob}" for knob in finding.knobs)
        if finding.knobs and not finding.reaches(release, ()) and turned.removeprefix("sglang@") in MEMBERS:
            found.append((turned, finding.reaches(release, finding.knobs)))
    return found


def described(trace) -> dict:
    """The run a trace was recorded in, as a report describes it (plan.PlannedRun.description):
    what a finding that shows in some runs only (Finding.runs) reads."""
    config = trace.config
    recurrent = bool(config.get("state_slots"))
    return {"tier": trace.tier, "page_size": config.get("page_size"), "window": config.get("window"),
            "interval": config.get("policy", {}).get("decode_eviction_interval"),
            "state_grid": config.get("state_grid", 1) if recurrent else None, "state": recurrent}


def replay_here(member: str, vector: Path) -> dict:
    """Replay one vector on one member in this process."""
    from kvspec.conformance.harness.protocol import load_adapter
    from kvspec.conformance.harness.replay import replay, unmet_requirements
    from kvspec.conformance.harness.trace import load

    adapter = load_adapter(member)
    trace = load(vector)
    config = dict(trace.config, policy=dict(trace.config["policy"], version=adapter.policy_version))
    trace = replace(trace, config=config, adapter=member)
    unmet = unmet_requirements(trace, adapter)
    if unmet:
        return {"member": member, "vector": vector.name, "skipped": f"needs {', '.join(unmet)}", "label": trace.label}
    result = replay(trace, adapter, compare=False)
    failure = result.failure
    return {"member": member, "vector": vector.name, "conforms": result.conforms, "stopped_at": result.stopped_at,
            "clauses": list(failure.clauses or ()) if failure else [], "verdict": result.verdict(),
            "kind": "crashed" if failure is not None and failure.kind == "crashed" else "violated", "label": trace.label,
            "run": described(trace)}


def replay_release(release: str) -> list[dict]:
    """Every vector on the members of one release (a process of its own)."""
    command = [sys.executable, "-c", "import json, sys; from kvspec.adapters.sglang.releases.regressions import "
               "in_process; print(json.dumps(in_process(sys.argv[1])))", release]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"replaying on SGLang {release} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def in_process(release: str) -> list[dict]:
    """Where a vector is expected to pass, a stop at a violation another finding explains
    (say the default's missing chunk release, on an older release) is not this bug: it is
    reported as such, not as a pass."""
    results = []
    for finding in FINDINGS:
        if finding.vector is None:
            continue
        for member, fails in expectations(finding, release):
            result = replay_here(member, ROOT / finding.vector)
            if "skipped" in result:
                results.append(dict(result, finding=finding.id, expected_to_fail=fails, as_expected=True))
                continue
            adapter = MEMBERS.members[member.removeprefix("sglang@")]
            cell = {"release": release, "tree": adapter.tree, "knobs": adapter.knobs}
            run = {"clauses": result["clauses"], "message": result["verdict"].partition(": ")[2],
                   "verdict": result["kind"], "label": result["label"], "run": result["run"]}
            other = None if result["conforms"] else explain(cell, run)
            if fails:
                as_expected = other == finding.id
            else:
                as_expected = result["conforms"] or other not in (None, finding.id)
            results.append(dict(result, finding=finding.id, expected_to_fail=fails, as_expected=as_expected,
                                explained_by=other))
    return results


def report(releases: list[str]) -> int:
    releases = releases or [release for release in RELEASES if installed(release)]
    wrong = 0
    for release in releases:
        for result in replay_release(release):
            if "skipped" in result:
                print(f"skip  {result['vector']} on {result['member']}: {result['skipped']}", flush=True)
                continue
            expected = "fails" if result["expected_to_fail"] else "passes"
            mark = "ok" if result["as_expected"] else "WRONG"
            wrong += not result["as_expected"]
            stopped = (f" (stopped first by {result['explained_by']})"
                       if not result["expected_to_fail"] and not result["conforms"] else "")
            what = f"{mark:5} {result['vector']} on {result['member']}"
            print(f"{what}: {expected} as expected{stopped}" if result["as_expected"]
                  else f"{what}: expected it {expected}; {result['verdict']}",
                  flush=True)
    return 1 if wrong else 0
