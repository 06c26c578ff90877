"""The plan of a check (kvspec.conformance.runs.plan): every run is a value that knows its
tier, label and configuration, so nothing downstream parses a label back. A run of every
label shape can be lost (its worker hangs or dies) and still lands in a schema-valid report
with its own verdict: a `block-pool ...` run once went through `tier_of(label)`, gave the
tier 'block-pool', and ended the check in a traceback with the finished runs' report lost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.conformance.harness.declarations import RUNS, Capability, Run, Tier
from kvspec.conformance.harness.protocol import AdapterError, load_adapter, validate
from kvspec.conformance.reports.json_report import validate_json
from kvspec.conformance.runs.plan import plan

TESTS = Path(__file__).resolve().parent
SHAPES = ("allocator P=4", "engine P=4 W=6 I=4", "engine+state P=1 W=3 I=4 G=1", "block-pool P=4 W=6 I=4",
          "scheduler P=4 W=7", "scheduler+state P=4 W=7")
"""One run of every label shape the reference's check makes."""


def kvspec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_reference_plan_makes_every_label_shape_once():
    planned = plan(load_adapter("reference"))
    assert set(SHAPES) <= set(planned.labels) and len(set(planned.labels)) == len(planned.labels)
    block_pool = planned.named("block-pool P=4 W=6 I=4")
    assert block_pool.tier == Tier.ENGINE and block_pool.target.model.name == "block-pool"
    assert block_pool.description == {"tier": "engine", "page_size": 4, "window": 6, "interval": 4,
                                      "state_grid": None, "state": False, "policy_version": "vllm-0.33",
                                      "memory_model": "block-pool"}
    assert planned.named("scheduler+state P=4 W=7").markers == {"tier": "scheduler", "P": 4, "W": 7, "state": True,
                                                               "model": "two-pool", "policy": "sglang-0.5.23"}
    assert not planned.skipped  # the reference implements its whole spec, the scheduler's state group too


@pytest.mark.parametrize("fate, verdict", [("HANGS", "hung"), ("DIES", "crashed")])
def test_a_lost_run_of_every_label_shape_is_reported_with_its_verdict(tmp_path, fate, verdict):
    runs = [argument for shape in SHAPES for argument in ("--run", shape)]
    result = kvspec("check", "--adapter", f"lost_run_adapters:{fate}", *runs, "--seed", "0", "-n", "2",
                    "--step-timeout", "3", "--json", "report.json", "--junit", "report.xml", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    document = json.loads((tmp_path / "report.json").read_text())
    validate_json(document)
    assert {run["label"]: run["verdict"] for run in document["runs"]} == dict.fromkeys(SHAPES, verdict)
    assert {run["label"]: run["tier"] for run in document["runs"]}["block-pool P=4 W=6 I=4"] == "engine"
    for run in document["runs"]:  # each saved the steps up to the lost one, replayable
        assert run["trace"] and Path(run["trace"]).is_file(), run


def test_run_picks_by_exact_label_else_by_what_the_label_contains():
    planned = plan(load_adapter("reference"))
    assert planned.select(["engine P=4 W=8 I=1"]).labels == ["engine P=4 W=8 I=1"]
    assert planned.select(["block-pool P=4 W=8"]).labels == ["block-pool P=4 W=8 I=1", "block-pool P=4 W=8 I=128"]
    with pytest.raises(AdapterError, match="no run matches --run warp"):
        planned.select(["warp"])


def test_a_mutant_finds_its_run_at_its_own_version_not_by_label():
    mutant = load_adapter("mutant-leak-on-release")
    run = Run(4, 7, 1)
    assert run in RUNS and plan(mutant).of(run).label == "engine P=4 W=7 I=1"


def test_what_a_check_leaves_out_comes_from_the_capability_table():
    """A capability is listed as skipped only where a tier the adapter has reads it, and a
    refinement only where the capability it refines is declared."""
    declared = type("ALLOCATOR_ONLY", (), {"name": "a", "policy_version": "sglang-0.5.23",
                                           "capabilities": ("page_size_1",),
                                           "make_allocator": staticmethod(lambda *args: None)})
    skipped = {s.what for s in plan(validate(declared, "x")).skipped}
    read_by_the_allocator = {str(c) for c in Capability if Tier.ALLOCATOR in c.tiers} - {"page_size_1"}
    assert skipped == read_by_the_allocator | {"engine tier", "scheduler tier"}
