"""A known divergence: one place where a real implementation differs from kvspec's spec.

Each entry names the clauses it breaks, the adapters it shows on, a minimal trace
(`<folder>/<id>.jsonl`, steps with the reference's expectations where the reference can
take them, the diverging step marked) and why. Each implementation keeps its list
beside its adapter (adapters/sglang/divergences.py, adapters/vllm/divergences.py), and
its tests replay every trace on every adapter it names and require the divergence to
still reproduce, so an upstream fix is noticed (and the entry then goes). Nothing in a
list loosens a check.

`python -m kvspec.adapters.<implementation>.divergences [ID ...]` records the traces
again from the steps (needs the implementation installed); it refuses to write one that
does not reproduce.
"""

import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay, with_expectations
from kvspec.conformance.harness.trace import Trace, TraceStep, load


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
    """Where its trace is kept."""
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
    step where the first adapter it names diverges marked with what it broke."""
    steps = tuple(TraceStep(op, args) for op, args in divergence.steps)
    trace = Trace(divergence.tier, divergence.config, divergence.adapters[0], steps,
                  label=f"{divergence.id}: {divergence.title}", description=divergence.explanation)
    trace = with_expectations(trace, load_adapter("reference"))
    result = replay(trace, load_adapter(divergence.adapters[0]))
    if result.failure is None:
        raise SystemExit(f"{divergence.id} does not reproduce on {divergence.adapters[0]}: {result.verdict()}")
    marked = list(trace.steps)
    marked[result.stopped_at] = replace(marked[result.stopped_at], violated=result.failure.clauses
                                        or (result.failure.kind,), message=str(result.failure))
    return replace(trace, steps=tuple(marked[:result.stopped_at + 1])).save(divergence.path)


def main(divergences: Iterable[KnownDivergence], chosen: Iterable[str] = ()) -> None:
    """Record the chosen divergences' traces (all of them when none is chosen)."""
    chosen = set(chosen)
    for divergence in divergences:
        if not chosen or divergence.id in chosen:
            print(f"{divergence.id}: {record(divergence)}")


if __name__ == "__main__":
    sys.exit("run python -m kvspec.adapters.sglang.divergences or kvspec.adapters.vllm.divergences")
