"""The `vllm@` family over vLLM's releases (adapters/vllm/releases): which members exist
and what they declare, what the shelf unpacks of a wheel, and real checks of the oldest
driven, a middle and the newest release.

The catalog needs no vLLM. The checks need the releases installed (`python -m
kvspec.adapters.vllm.releases install 0.20.0 0.27.0 0.34.0`); CI installs them and sets
KVSPEC_REQUIRE_VLLM_RELEASES=1, which turns a missing release into a failure instead of a
skip."""

import json
import os
import subprocess
import sys

import pytest

from kvspec.adapters.vllm.releases.catalog import MEMBERS, generation, retentions, uncached_first
from kvspec.adapters.vllm.releases.environment import RELEASES, SHELF, kept
from kvspec.conformance.harness.protocol import AdapterError, load_adapter
from kvspec.spec.window import VLLM_0_33, VLLM_0_33_DENSE

REQUIRED = os.environ.get("KVSPEC_REQUIRE_VLLM_RELEASES") == "1"
CHECKED = ("0.20.0", "0.27.0", "0.34.0")
"""The oldest release kvspec drives, one in the middle, the newest: CI's."""


def test_the_releases_are_the_41_with_the_hybrid_manager_and_members_from_0_20():
    assert len(RELEASES) == 41 and RELEASES[0] == "0.9.2" and RELEASES[-1] == "0.34.0"
    assert [release for release in RELEASES if generation(release)][0] == "0.20.0"
    for release in RELEASES:
        assert (release in MEMBERS) == (generation(release) is not None), release
    with pytest.raises(AdapterError, match="vllm@0.19.1"):
        load_adapter("vllm@0.19.1")  # not driven yet (docs/engines/vllm-releases.md): a clear error


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
    if not SHELF.installed(release):
        message = f"vLLM {release} is not installed: {SHELF.install_command(release)}"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", f"vllm@{release}",
                           "--profile", "quick", "--seed", "0", "-n", "1", "--json", str(report)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads(report.read_text())["runs"]
    assert runs and all(run["verdict"] == "ok" for run in runs)
