"""The `vllm@` family over vLLM's releases (adapters/vllm/releases): which members exist
and what they declare, what the shelf unpacks of a wheel, and real checks of the oldest
driven, a middle and the newest release.

The catalog needs no vLLM. The checks need the releases installed (`python -m
kvspec.adapters.vllm.releases install 0.9.2 0.13.0 0.14.0 0.27.0 0.34.0`); CI installs them and sets
KVSPEC_REQUIRE_VLLM_RELEASES=1, which turns a missing release into a failure instead of a
skip. The bugs found: each regression vector crashes (or violates) on the release it names
and replays clean on the one that fixed it, and so does its standalone reproduction, which
imports vLLM alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.adapters.vllm.releases.catalog import MEMBERS, generation, retentions, uncached_first
from kvspec.adapters.vllm.releases.environment import RELEASES, SHELF, kept
from kvspec.conformance.harness.protocol import AdapterError, load_adapter
from kvspec.spec.window import VLLM_0_33, VLLM_0_33_DENSE

REQUIRED = os.environ.get("KVSPEC_REQUIRE_VLLM_RELEASES") == "1"
CHECKED = ("0.9.2", "0.27.0", "0.34.0")
"""The oldest release kvspec drives, one in the middle, the newest: CI's."""
ROOT = Path(__file__).resolve().parents[1]
BUGS = {
    # bug: (its regression vector, a release it shipped in, the release that fixed it, what it raises)
    "swa-cache-parent-null": ("vectors/regressions/vllm/swa-cache-parent-null.jsonl", "0.13.0", "0.14.0",
                              "prefill_chunk raised AssertionError"),
}


def require(release: str) -> None:
    if not SHELF.installed(release):
        message = f"vLLM {release} is not installed: {SHELF.install_command(release)}"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


def test_the_releases_are_the_41_with_the_hybrid_manager_and_each_is_a_member():
    assert len(RELEASES) == 41 and RELEASES[0] == "0.9.2" and RELEASES[-1] == "0.34.0"
    assert all(generation(release) for release in RELEASES) and set(RELEASES) <= set(MEMBERS)
    with pytest.raises(AdapterError, match="vllm@0.9.1"):
        load_adapter("vllm@0.9.1")  # before the hybrid manager: a clear error


def test_each_member_declares_the_retention_and_block_pool_settings_of_its_release():
    """Retention 0 is the engine's default from 0.29.0, a setting from 0.24.0 (dense the
    default), absent before; the null block's count is kept from 0.33.0 (BLOCK-3); uncached
    blocks are queued first by every group from 0.24.0, by the sliding-window one in 0.23.0
    (BLOCK-10)."""
    assert retentions("0.31.0") == {"": 0, "+dense": None}
    assert retentions("0.26.0") == {"": None, "+retention-0": 0}
    assert retentions("0.22.1") == {"": None}
    assert MEMBERS.members["0.31.0"].policy_version == VLLM_0_33
    assert MEMBERS.members["0.26.0"].policy_version == VLLM_0_33_DENSE
    assert MEMBERS.members["0.26.0+retention-0"].policy_version == VLLM_0_33
    assert [MEMBERS.members[r].null_block_counted for r in ("0.32.0", "0.33.0")] == [False, True]
    assert [uncached_first(r) for r in ("0.22.1", "0.23.0", "0.24.0")] == [(), ("swa",), ("full", "swa")]
    assert "recurrent_state" not in MEMBERS.members["0.30.0"].capabilities  # the state group from 0.31.0
    assert "recurrent_state" in MEMBERS.members["0.31.0"].capabilities
    # BLOCK-8: the KV events name their group from 0.20.0; before, the check is skipped, never passed
    assert "kv_events" not in MEMBERS.members["0.19.1"].observables
    assert "kv_events" in MEMBERS.members["0.20.0"].observables


def test_the_shelf_unpacks_vllms_python_and_metadata_never_its_kernels():
    assert kept("vllm/v1/core/block_pool.py") and kept("vllm-0.34.0.dist-info/METADATA")
    assert kept("vllm/transformers_utils/chat_templates/template_basic.jinja")
    assert not kept("vllm/_C.abi3.so") and not kept("vllm/third_party/cutlass/include/cute/tensor.hpp")
    assert not SHELF.keep_wheels


def test_an_unknown_release_is_refused_with_the_releases_kvspec_covers():
    done = subprocess.run([sys.executable, "-m", "kvspec.adapters.vllm.releases", "install", "0.35.0"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "unknown vLLM release(s) 0.35.0" in done.stderr and "0.34.0" in done.stderr


@pytest.mark.parametrize("release", CHECKED)
def test_a_release_passes_the_quick_profile(tmp_path, release):
    """0.9.2's run at page size 16 meets swa-cache-parent-null (0.9.2 - 0.13.0); the others pass."""
    require(release)
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", f"vllm@{release}",
                           "--profile", "quick", "--seed", "0", "-n", "1", "--json", str(report)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    runs = json.loads(report.read_text())["runs"]
    failed = {run["label"]: run["message"] for run in runs if run["verdict"] != "ok"}
    if release == "0.9.2":
        assert set(failed) == {"engine P=16 W=5 I=4"} and "raised AssertionError" in failed["engine P=16 W=5 I=4"]
    else:
        assert done.returncode == 0 and not failed, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_bugs_vector_fails_where_it_shipped_and_replays_clean_where_it_was_fixed(bug):
    vector, shipped, fixed, raised = BUGS[bug]
    for release in (shipped, fixed):
        require(release)
    done = replay(vector, shipped)
    assert done.returncode == 1 and raised in done.stdout, done.stdout + done.stderr
    done = replay(vector, fixed)
    assert done.returncode == 0 and "conforms" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_bugs_reproduction_imports_vllm_alone_fails_where_it_shipped_and_passes_where_it_was_fixed(bug):
    _, shipped, fixed, _ = BUGS[bug]
    path = ROOT / "vectors" / "reproductions" / "vllm" / f"{bug}.py"
    imported = {line.split()[1].split(".")[0] for line in path.read_text().splitlines()
                if line.startswith(("import ", "from "))}
    assert imported - set(sys.stdlib_module_names) == {"torch", "vllm"}, imported
    for release in (shipped, fixed):
        require(release)
    env = {**os.environ, "PYTHONPATH": str(SHELF.folder(shipped))}
    done = subprocess.run([sys.executable, path.name], cwd=path.parent, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode != 0 and done.stderr.rstrip().endswith("AssertionError"), done.stderr[-2000:]
    env["PYTHONPATH"] = str(SHELF.folder(fixed))
    done = subprocess.run([sys.executable, path.name], cwd=path.parent, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0 and f"vLLM {fixed}: the request's blocks were cached" in done.stdout, done.stderr[-2000:]


def replay(vector: str, release: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "replay", str(ROOT / vector), "--adapter",
                           f"vllm@{release}"], capture_output=True, text=True, timeout=600, check=False)


def test_the_history_checks_each_member_in_its_own_process_and_keeps_its_cell(tmp_path):
    """`python -m kvspec.adapters.vllm.releases history`: the members a prefix names (one
    here), each checked by `kvspec check` in its own process, their cells in the shard's JSON
    with the member's own columns and every run's verdict (kvspec.conformance.runs.history)."""
    require("0.14.0")
    done = subprocess.run([sys.executable, "-m", "kvspec.adapters.vllm.releases", "history", "--profile", "quick",
                           "--out", str(tmp_path), "--members", "vllm@0.14.0", "--shard", "1/1", "--seed", "0",
                           "-n", "1"], capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((tmp_path / "history-1-of-1.json").read_text())
    (cell,) = document["cells"]
    assert document["schema"] == "kvspec-vllm-history/1" and document["profile"] == "quick"
    assert (cell["member"], cell["release"], cell["retention"], cell["policy_version"]) == \
        ("vllm@0.14.0", "0.14.0", None, VLLM_0_33_DENSE)
    assert cell["verdict"] == "ok" and len(cell["runs"]) == 7 and all(run["verdict"] == "ok" for run in cell["runs"])
    assert (tmp_path / "reports" / "vllm-0.14.0.json").is_file()
