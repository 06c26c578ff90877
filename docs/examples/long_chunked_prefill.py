"""The example of docs/checking.md, "Pictures of a run": one long prompt prefilled in chunks, then a few decode steps.

    python docs/examples/long_chunked_prefill.py [--out DIR]

writes vectors/examples/long-chunked-prefill.jsonl, the trace (with the reference's
observables as expectations, and its front matter), and docs/images/swa-release-on-off.png,
the SWA pool of the trace on the reference (each checkpoint releases the chunk's SWA KV
that slid out of the window, WIN-4) above the same on mutant-no-chunk-release (it
releases none). With `--out DIR`, DIR/examples/ and DIR/images/ instead. The trace is
part of the vectors tree: after writing it there, `kvspec vectors --out vectors/` indexes
it again.

Chunks of 32 tokens against a window of 8: a checkpoint raises the cursor to the
protected length first (WIN-3), so only a chunk longer than the retention (8) plus a
page has anything to release.
"""

import argparse
from pathlib import Path

from kvspec.conformance.harness.front_matter import with_front_matter
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import with_expectations
from kvspec.conformance.harness.trace import Trace, TraceStep, engine_config_json
from kvspec.conformance.review.occupancy import timeline
from kvspec.conformance.review.occupancy_plot import plot_pool, pyplot
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy

DOCS = Path(__file__).resolve().parents[1]
VECTORS = DOCS.parent / "vectors"
CONFIG = EngineConfig(page_size=4, window=8, size_full=256, size_swa=256, max_requests=4,
                      policy=Policy(decode_eviction_interval=4))
PROMPT, CHUNK, DECODE_STEPS = 192, 32, 12


def long_chunked_prefill() -> Trace:
    steps = (TraceStep("admit", {"rid": "r1", "prompt": list(range(PROMPT))}),
             *[TraceStep("prefill_chunk", {"rid": "r1", "chunk": CHUNK, "token": 1})] * (PROMPT // CHUNK),
             *[TraceStep("decode", {"rid": "r1", "token": 1})] * DECODE_STEPS,
             TraceStep("finish", {"rid": "r1", "trim": 0}))
    trace = Trace("engine", engine_config_json(CONFIG), "reference", steps, label="long chunked prefill",
                  description=f"one request: a {PROMPT}-token prompt prefilled in chunks of {CHUNK}, "
                              f"{DECODE_STEPS} decode steps, finish (docs/checking.md, Pictures of a run)")
    reference = load_adapter("reference")
    return with_front_matter(with_expectations(trace, reference), reference)


def draw_release_on_off(trace: Trace, path: Path) -> None:
    plt = pyplot()
    figure, panels = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5), layout="constrained")
    for axes, (adapter, what) in zip(panels, (("reference", "each checkpoint releases the SWA KV out of the window"),
                                              ("mutant-no-chunk-release", "no release during the prefill"))):
        plot_pool(axes, timeline(trace, load_adapter(adapter)), "swa")
        axes.set_title(f"{adapter}: {what}", fontsize=9)
    panels[-1].set_xlabel(f"step of the trace (admit, {PROMPT // CHUNK} chunks of {CHUNK}, "
                          f"{DECODE_STEPS} decode steps, finish)")
    figure.suptitle(f"A {PROMPT}-token prompt in chunks of {CHUNK} (P={CONFIG.page_size}, W={CONFIG.window}, "
                    f"I={CONFIG.policy.decode_eviction_interval}, {CONFIG.policy.version})", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="where examples/ and images/ go (default: vectors/examples/ "
                                                 "and docs/images/)")
    out = parser.parse_args().out
    examples, images = (VECTORS / "examples", DOCS / "images") if out is None else (out / "examples", out / "images")
    trace = long_chunked_prefill()
    print(f"wrote {trace.save(examples / 'long-chunked-prefill.jsonl')}")
    draw_release_on_off(trace, images / "swa-release-on-off.png")
    print(f"wrote {images / 'swa-release-on-off.png'}")
