"""[OBS-3, BLOCK-9, BLOCK-10] Real vLLM 0.33.0 against the reference's shared block pool:
the block-pool vectors (vectors/conformance/, written from the reference) replay on both vllm adapters
with the reference's observables, and the one difference the differential run found, a
vLLM adapter that dropped the scheduler's shared_prefix_boundary, stays fixed.

Needs vLLM installed (adapters/vllm/requirements.txt); CI installs it and sets
KVSPEC_REQUIRE_VLLM=1, which turns a missing vLLM into a failure instead of a skip."""

import importlib.util
import os
from pathlib import Path

import pytest

if os.environ.get("KVSPEC_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install --no-deps -r adapters/vllm/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.vllm import VLLM  # noqa: E402
from kvspec.adapters.vllm.engine import VllmEngine  # noqa: E402
from kvspec.conformance.harness.protocol import load_adapter, validate  # noqa: E402
from kvspec.conformance.harness.replay import replay, unmet_requirements  # noqa: E402
from kvspec.conformance.harness.trace import load  # noqa: E402
from kvspec.conformance.runs.tree import corpus  # noqa: E402

ROOT = Path(__file__).parent.parent
VECTORS = corpus(ROOT / "vectors" / "conformance")
JUNCTION = ROOT / "vectors" / "tests" / "vllm-shared-prefix-junction.jsonl"


@pytest.mark.parametrize("adapter", ["vllm", "vllm-dense"])
def test_vllm_replays_every_block_pool_vector_of_its_version(adapter):
    """Every vector of the adapter's policy version replays in full, each step showing the
    reference's observables (free blocks, lengths, hits, released window blocks)."""
    loaded = load_adapter(adapter)
    mine = {path.name: trace for path, trace in VECTORS.items() if not unmet_requirements(trace, loaded)}
    assert len(mine) >= 12, sorted(mine)
    failed = {name: replay(trace, loaded).verdict() for name, trace in mine.items()}
    assert all(verdict.startswith("conforms") for verdict in failed.values()), failed


def test_the_shared_prefix_junction_is_kept():
    """The differential run's first finding (engine P=4 W=7 I=1, retention 0): vLLM's
    scheduler keeps get_computed_blocks' third value, the junction where the full group
    cached more than the hit, in `request.shared_prefix_boundary`, and the sliding-window
    group then caches the window's tail there too; the adapter dropped it, so r2 cached no
    sliding-window block at 8 tokens and r1's later hit was 0, not the reference's 12
    (OBS-3: free blocks 9, not 7). An adapter bug, fixed: the trace conforms."""
    trace = load(JUNCTION)
    assert replay(trace, load_adapter("vllm")).conforms

    class DropsTheJunction(VllmEngine):
        def admit(self, rid, prompt=None):
            outcome = super().admit(rid, prompt)
            if rid in self.requests:
                self.requests[rid].shared_prefix_boundary = 0
            return outcome

    without = validate(type("WITHOUT", (VLLM,), {"name": "without-junction",
                                                 "make_engine": staticmethod(lambda c: DropsTheJunction(c, 0))}), "x")
    result = replay(trace, without)
    assert result.failure is not None and "OBS-3" in result.failure.clauses and result.stopped_at == 7
