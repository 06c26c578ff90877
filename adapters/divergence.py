"""A known divergence: one place where a real implementation differs from kvspec's spec.

Each entry names the clauses it breaks, the adapters it shows on, a minimal trace
(`vectors/divergences/<implementation>/<id>.jsonl` in the vectors tree: steps with the
reference's expectations where the reference can take them, the diverging step marked,
and in its header the clauses it violates) and why. Each implementation keeps its list
beside its adapter (adapters/sglang/divergences.py, adapters/vllm/divergences.py,
adapters/tokenspeed/divergences.py), and its tests replay every trace on every adapter it
names and require the divergence to still reproduce, so an upstream fix is noticed (and
the entry then goes). Nothing in a list loosens a check.

`python -m kvspec.adapters.<implementation>.divergences [ID ...]` records the traces
again from the steps (needs the implementation installed); it refuses to write one that
does not reproduce. It writes into the tree it is run from (a checkout's vectors/); run
`kvspec vectors --out vectors/` after it, to index the traces again.
"""

import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from kvspec.conformance.harness.front_matter import with_front_matter
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay, with_expectations
from kvspec.conformance.harness.trace import Trace, TraceStep, load
from kvspec.conformance.runs.tree import TREE

DIVERGENCES = TREE / "divergences"
"""Where each implementation's divergence traces are kept: one folder per implementation."""


@dataclass(frozen=True)
class KnownDivergence:
    id: str
    clauses: tuple[str, ...]
    title: str
    explanation: str
    upstream: str
    """Where the behaviour lives in the implementation's source, or an upstream reference."""
    tier: str
    config: dict
    steps: tuple[tuple[str, dict], ...]
    adapters: tuple[str, ...]
    folder: Path
    """Where its trace is kept: its implementation's folder of DIVERGENCES."""
    steered_by: str = ""
    """What the adapters leave out (a capability, an option) so that `kvspec check` does not stop here."""
    differential: bool = False
    """Seen only against the reference's expectations (OBS-3)."""

    @property
    def path(self) -> Path:
        return self.folder / f"{self.id}.jsonl"

    def trace(self) -> Trace:
        return load(self.path)


def record(divergence: KnownDivergence) -> Path:
    """Write the divergence's trace: its steps with the reference's expectations, the
    step where the first adapter it names diverges marked with what it broke, and its
    front matter (it violates the divergence's clauses)."""
    steps = tuple(TraceStep(op, args) for op, args in divergence.steps)
    trace = Trace(divergence.tier, divergence.config, divergence.adapters[0], steps,
                  label=f"{divergence.id}: {divergence.title}", description=divergence.explanation)
    reference = load_adapter("reference")
    trace = with_expectations(trace, reference)
    result = replay(trace, load_adapter(divergence.adapters[0]))
    if result.failure is None:
        raise SystemExit(f"{divergence.id} does not reproduce on {divergence.adapters[0]}: {result.verdict()}")
    marked = list(trace.steps)
    marked[result.stopped_at] = replace(marked[result.stopped_at], violated=result.failure.clauses
                                        or (result.failure.kind,), message=str(result.failure))
    trace = replace(trace, steps=tuple(marked[:result.stopped_at + 1]))
    return with_front_matter(trace, reference, violates=divergence.clauses).save(divergence.path)


def main(divergences: Iterable[KnownDivergence], chosen: Iterable[str] = ()) -> None:
    """Record the chosen divergences' traces (all of them when none is chosen)."""
    chosen = set(chosen)
    for divergence in divergences:
        if not chosen or divergence.id in chosen:
            print(f"{divergence.id}: {record(divergence)}")


if __name__ == "__main__":
    sys.exit("run python -m kvspec.adapters.sglang.divergences or kvspec.adapters.vllm.divergences")
