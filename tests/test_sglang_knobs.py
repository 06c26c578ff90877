"""The `sglang@` family's knobs in combination (catalog.Release.combinations): every two
knobs a tree reads meet in all four settings, and what a knob sets reaches SGLang's
allocator and tree, in an engine built as the member builds it."""

import itertools
import os
import subprocess
import sys

import pytest

from kvspec.adapters.sglang.releases import environment
from kvspec.adapters.sglang.releases.catalog import KNOBS, MEMBERS, Release


@pytest.mark.parametrize("release", environment.RELEASES)
def test_every_two_knobs_of_a_tree_meet_in_all_four_settings(release):
    for tree in Release(release).trees:
        knobs, rows = Release(release).knobs(tree), Release(release).combinations(tree)
        assert () in rows and all((knob,) in rows for knob in knobs), "the defaults and each knob alone"
        for left, right in itertools.combinations(knobs, 2):
            met = {(left in row, right in row) for row in rows}
            assert met == {(False, False), (False, True), (True, False), (True, True)}, (release, tree, left, right)
        for row in rows:  # each is a member, named by its knobs in the tree's order
            base = release + ("" if tree == Release(release).default_tree else f"-{tree}")
            assert base + "".join(f"+{knob}" for knob in row) in MEMBERS


def test_knobs_are_offered_only_where_the_tree_reads_them():
    assert "swa-compact" in Release("0.5.15").knobs("legacy") and "swa-compact" not in Release("0.5.15").knobs("python")
    assert "evict-lfu" in Release("0.5.20").knobs("rust") and "evict-lfu" not in Release("0.5.14").knobs("legacy")
    assert all("need-sort" in Release(r).knobs(t) for r in environment.RELEASES for t in Release(r).trees)
    assert set(KNOBS) == {knob for r in environment.RELEASES for t in Release(r).trees for knob in Release(r).knobs(t)
                          } | {"chunk-release", "no-chunk-release"}


def test_a_members_knobs_reach_sglangs_allocator_tree_and_environment():
    release = "0.5.20"
    if not environment.installed(release):
        if os.environ.get("KVSPEC_REQUIRE_SGLANG_RELEASES") == "1":  # CI, after installing every release
            pytest.fail(f"SGLang {release} is not installed: {environment.install_command(release)}")
        pytest.skip(f"SGLang {release} is not installed: {environment.install_command(release)}")
    script = (
        "import os, sys; from kvspec.adapters.sglang.releases.environment import activate; activate(sys.argv[1])\n"
        "import kvspec.adapters.sglang.releases.api_0_5_19\n"
        "from kvspec.conformance.harness.protocol import load_adapter\n"
        "from kvspec.spec.snapshot import EngineConfig\nfrom kvspec.spec.window import Policy\n"
        "for name in sys.argv[2:]:\n"
        "    adapter = load_adapter(name)\n"
        "    engine = adapter.make_engine(EngineConfig(4, 6, 64, 64, 4, Policy(adapter.policy_version, 4, "
        "adapter.chunk_release)))\n"
        "    print(engine.allocator.full_attn_allocator.need_sort, engine.eviction_policy,"
        " os.environ.get('SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW'))\n")
    done = subprocess.run([sys.executable, "-c", script, release, "sglang@0.5.20+early-swa-unlock+need-sort+evict-lfu",
                           "sglang@0.5.20"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-3:-1] == ["True lfu 1", "False lru None"]
