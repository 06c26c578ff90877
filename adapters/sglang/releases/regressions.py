"""The regression vectors of what the history table found (findings.py), replayed on
every installed release: each must fail, on a clause of its finding, on every member
that has the bug (or keeps the divergence), and pass on every other.

A vector is a kvspec trace under `vectors/regressions/sglang/`, or a known divergence's
trace under `vectors/divergences/sglang/` (no expected observables are compared: they
differ between releases). It is replayed as `kvspec bisect` replays a trace
(conformance/runs/bisect.py): at the policy the member declares, so one vector serves
releases whose retention differs; one process per release, as always. A member that
cannot drive the vector's steps (a PD admission before 0.5.19, or one whose checkpoint
is short of a window before 0.5.23) skips it, and says so.

    python -m kvspec.adapters.sglang.releases regressions [RELEASE ...]
    python -m kvspec.adapters.sglang.releases ranges [FINDING ...]

`ranges` bisects each finding's vector on every member of the family and says, per
line (tree and knobs), whether the releases it reproduces on are exactly those the
finding declares (findings.disagreement).
"""

from pathlib import Path

from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.trace import load
from kvspec.conformance.runs.bisect import CANNOT_RUN, PASSES, Outcome, lines, members_of, replay_member, replay_pairs
from kvspec.conformance.runs.tree import TREE

from .catalog import FAMILY, MEMBERS, Release
from .environment import RELEASES, installed
from .findings import FINDINGS, Finding, as_run, disagreement

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


def result(outcome: Outcome) -> dict:
    """An outcome as this module's results read it (a vector, conforms, a verdict in words)."""
    found = {"member": outcome.member, "vector": Path(outcome.trace).name, "label": outcome.label}
    if outcome.verdict == CANNOT_RUN:
        return dict(found, skipped=outcome.message)
    conforms = outcome.verdict == PASSES
    return dict(found, conforms=conforms, stopped_at=outcome.step, clauses=list(outcome.clauses),
                kind="crashed" if outcome.kind == "crashed" else "violated", run=outcome.run,
                verdict="conforms" if conforms else f"{outcome.kind} at step {outcome.step}: {outcome.message}")


def replay_here(member: str, vector: Path) -> dict:
    """Replay one vector on one member in this process (several members in one process must
    not leak their knobs into each other: tests/test_sglang_releases.py)."""
    return result(replay_member(str(vector), load(vector), load_adapter(member)))


def judged(finding: Finding, fails: bool, outcome: Outcome) -> dict:
    """Where a vector is expected to pass, a stop at a violation another finding explains
    (say the default's missing chunk release, on an older release) is not this bug: it is
    reported as such, not as a pass."""
    found = dict(result(outcome), finding=finding.id, expected_to_fail=fails)
    if outcome.verdict == CANNOT_RUN:
        return dict(found, as_expected=True)
    adapter = MEMBERS.members[outcome.member.removeprefix("sglang@")]
    cell = {"release": adapter.release, "tree": adapter.tree, "knobs": adapter.knobs}
    # the finding that explains it: this vector's own where it matches (findings may overlap:
    # pd-swa-lock-released-twice and the early unlock both break I11 on 0.5.19), else the first
    matching = [] if found["conforms"] else [each.id for each in FINDINGS if each.matches(cell, as_run(outcome))]
    other = finding.id if finding.id in matching else next(iter(matching), None)
    as_expected = other == finding.id if fails else found["conforms"] or other not in (None, finding.id)
    return dict(found, as_expected=as_expected, explained_by=other)


def replay_releases(releases: list[str], workers: int = 1, on_release=lambda release, results: None) -> list[dict]:
    """Every vector on the members of each release that expect it (one process per release)."""
    members = {member.name: member for member in members_of(FAMILY)}
    expected = [(finding, member, fails) for release in releases for finding in FINDINGS if finding.vector
                for member, fails in expectations(finding, release)]
    by_pair = {}

    def judge_release(release, outcomes, seconds):
        by_pair.update(((o.trace, o.member), o) for o in outcomes)
        on_release(release, [judged(finding, fails, by_pair[str(ROOT / finding.vector), member])
                             for finding, member, fails in expected if members[member].version == release])

    replay_pairs([(str(ROOT / finding.vector), members[member]) for finding, member, _ in expected], workers,
                 on_version=judge_release)
    return [judged(finding, fails, by_pair[str(ROOT / finding.vector), member]) for finding, member, fails in expected]


def replay_release(release: str) -> list[dict]:
    """Every vector on the members of one release (a process of its own)."""
    return replay_releases([release])


def report(releases: list[str], workers: int = 1) -> int:
    releases = releases or [release for release in RELEASES if installed(release)]
    wrong = 0

    def show(release, results):
        nonlocal wrong
        for result in results:
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

    replay_releases(releases, workers, show)
    return 1 if wrong else 0


def ranges(ids: list[str], workers: int = 1) -> int:
    """Bisect each finding's vector on every member and compare, line by line, the releases
    it reproduces on with those the finding declares; exit 1 on any disagreement."""
    chosen = [finding for finding in FINDINGS if finding.vector and (not ids or finding.id in ids)]
    if not chosen:
        raise SystemExit(f"no finding with a vector is named {' or '.join(ids)}; they are "
                         + ", ".join(dict.fromkeys(f.id for f in FINDINGS if f.vector)))
    members = members_of(FAMILY)
    vectors = list(dict.fromkeys(str(ROOT / finding.vector) for finding in chosen))
    print(f"bisecting {len(vectors)} vector(s) on {len(members)} members, one process per release", flush=True)
    outcomes = replay_pairs([(vector, member) for vector in vectors for member in members], workers,
                            on_version=lambda release, done, seconds: print(
                                f"  {release}: {len(done)} replays in {seconds:.1f} s", flush=True))
    by_vector = {vector: outcomes[i * len(members):(i + 1) * len(members)] for i, vector in enumerate(vectors)}
    disagreements = 0
    for finding in chosen:
        print(f"\n{finding.id} ({finding.first} - {finding.last}, fixed in {finding.fixed_in or 'none'}; "
              f"{', '.join(finding.trees)}): {finding.vector}")
        for line in lines(members, by_vector[str(ROOT / finding.vector)]):
            first = line.outcomes[0][0]
            adapter = MEMBERS.members[first.name.removeprefix("sglang@")]
            # one bug may take several entries (its shapes, its trees): the vector agrees with
            # its finding where it agrees with any of them, as a table's violation does
            outcomes = [(member.version, outcome) for member, outcome in line.outcomes]
            whys = [disagreement(entry, adapter.tree, adapter.knobs, outcomes)
                    for entry in (finding, *(other for other in FINDINGS if other.id == finding.id))]
            why = None if None in whys else whys[0]
            disagreements += why is not None
            print(f"  {'ok   ' if why is None else 'DIFF '} {line.line}: {why or 'as declared'}")
    print(f"\n{disagreements} line(s) where a vector's bisection disagrees with its finding's range")
    return 1 if disagreements else 0
