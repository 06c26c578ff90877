"""What the history table found in SGLang's releases, each explained from the release's
code (docs/engines/sglang-findings.md has the lines, the fix, and the regression vector).

A finding matches a violated run of the table when the run's release is in the finding's
range, its tree is one the finding names, and one of the run's violated clauses is the
finding's. The table marks any violation no finding matches UNEXPLAINED.
"""

from dataclasses import dataclass

from .catalog import key


@dataclass(frozen=True)
class Finding:
    id: str
    kind: str
    """"bug" (of the releases named, fixed in `fixed_in`), or "divergence" (behaviour the
    spec does not allow, kept by those releases on purpose or by default)."""
    first: str
    last: str
    fixed_in: str | None
    trees: tuple[str, ...]
    clauses: tuple[str, ...]
    by_default_from: str = ""
    """The first release where the default knobs reach it ("" : `first`); before it, the
    members with `knobs` turned do."""
    knobs: tuple[str, ...] = ()
    """What a release before `by_default_from` needs turned from its default to reach it."""
    vector: str | None = None
    """Its regression vector under vectors/regressions/ (bugs)."""

    def matches(self, cell: dict, run: dict) -> bool:
        release = key(cell["release"])
        reached = release >= key(self.by_default_from or self.first) or set(self.knobs) <= set(cell["knobs"])
        return (key(self.first) <= release <= key(self.last) and reached and cell["tree"] in self.trees
                and bool(set(run["clauses"]) & set(self.clauses)))


FINDINGS = (
    Finding("checkpoint-short-rematch", "bug", "0.5.15", "0.5.22", "0.5.23", ("python",),
            ("I4", "I2", "I3", "I1", "I5", "I10"), by_default_from="0.5.18", knobs=("chunk-release",),
            vector="checkpoint-short-rematch.jsonl"),
)


def explain(cell: dict, run: dict) -> str | None:
    return next((finding.id for finding in FINDINGS if finding.matches(cell, run)), None)
