"""The `chunk` tree of the `sglang@` family (adapters/sglang/releases/chunk_cache.py): SGLang
with its radix cache disabled on a hybrid SWA model, checked under policy `no-prefix-sharing`.

Which members exist and what they declare needs no SGLang. A hand-written trace (chunked
prefill past the window, decode past it, a stop, a retraction and readmission, an admission
dropped before its first extend, an eviction) must hold on the reference and on a chunk
member of each cache class: `SWAChunkCache` (0.5.18) and the unified tree built disabled
(0.5.23). A bug seeded into each piece of the chunk-cache path must break a check on the
same trace: the extend-time release (I9's no-sharing form, found missing while writing
these members), its threshold kept a page too high (I9) or a token too low (I8), and the
finish's free (I2, I3). The releases are driven in processes of their own (one SGLang per
process); a release that is not installed skips, and fails under CI's
KVSPEC_REQUIRE_SGLANG_RELEASES=1 (as in tests/test_sglang_reproductions.py)."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from unittest import mock

import pytest

from kvspec.adapters.sglang.releases import environment
from kvspec.adapters.sglang.releases.catalog import MEMBERS, Release
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.trace import parse
from kvspec.reference import engine as reference_engine

REQUIRED = os.environ.get("KVSPEC_REQUIRE_SGLANG_RELEASES") == "1"


def require_release(release):
    if not environment.installed(release):
        if REQUIRED:
            pytest.fail(f"SGLang {release} is not installed: {environment.install_command(release)}")
        pytest.skip(f"SGLang {release} is not installed: {environment.install_command(release)}")


HEADER = {"kvspec_trace": 1, "kvspec_version": "0.1.0", "tier": "engine", "adapter": "sglang@0.5.18-chunk",
          "config": {"page_size": 4, "window": 6, "size_full": 96, "size_swa": 48, "max_requests": 4,
                     "policy": {"version": "no-prefix-sharing", "decode_eviction_interval": 1}},
          "description": "tests/test_sglang_chunk_cache.py: chunked prefill and decode past the window without "
                         "prefix sharing"}
PROMPT = [0, 1, 2, 0, 1, 2, 0, 0, 1, 1, 2, 2, 0, 1, 2, 0, 1, 2, 0, 0, 1, 1, 2, 2, 0, 1]
STEPS = [
    ("admit", {"rid": "r1", "prompt": PROMPT}),
    *[("prefill_chunk", {"rid": "r1", "chunk": 8, "token": 1})] * 4,  # pre_len 0, 8, 16, 24: cursor 0, 0, 8, 16
    *[("decode", {"rid": "r1", "token": 2})] * 6,  # seq_len 27 .. 32: decode eviction from the second step
    ("admit", {"rid": "r2", "prompt": PROMPT[:10]}),
    ("prefill_chunk", {"rid": "r2", "chunk": 10, "token": 0}),
    ("decode", {"rid": "r2", "token": 1}),
    ("retract", {"rid": "r2"}),
    ("admit", {"rid": "r3", "prompt": PROMPT[:5]}),
    ("abort", {"rid": "r3"}),  # dropped before its first extend: only its (no-op) lock goes back
    ("admit", {"rid": "r2", "prompt": None}),
    ("prefill_chunk", {"rid": "r2", "chunk": 6, "token": 0}),
    ("prefill_chunk", {"rid": "r2", "chunk": 6, "token": 0}),
    ("decode", {"rid": "r2", "token": 1}),
    ("evict", {"full_tokens": 8, "swa_tokens": 8}),  # nothing cached: evicts nothing
    ("finish", {"rid": "r1", "trim": 1}),  # a stop: the token after it is not kept
    ("finish", {"rid": "r2", "trim": 0}),
]
TRACE_TEXT = "\n".join([json.dumps(HEADER)] + [json.dumps({"op": op, "args": args}) for op, args in STEPS]) + "\n"

SEEDED = {
    # name: (module, function, old text, new text) of the 0.5.18 wheel, and the clauses it breaks
    "no-extend-release": (("sglang.srt.managers.schedule_batch", "ScheduleBatch.maybe_evict_swa",
                           "                elif self.forward_mode.is_extend() and self.tree_cache.is_chunk_cache():\n",
                           "                elif self.forward_mode.is_extend() and not self.tree_cache.is_chunk_cache():\n"),
                          {"I9"}),
    "keeps-a-page-more": (("sglang.srt.mem_cache.common", "free_swa_out_of_window_slots",
                           "        evict_threshold = pre_len - sliding_window_size\n",
                           "        evict_threshold = pre_len - sliding_window_size - page_size\n"),
                          {"I9"}),
    "keeps-a-token-less": (("sglang.srt.mem_cache.common", "free_swa_out_of_window_slots",
                            "        evict_threshold = pre_len - sliding_window_size\n",
                            "        evict_threshold = pre_len - sliding_window_size + 1\n"),
                           {"I8"}),
    "finish-leaks-its-last-token": (("sglang.srt.mem_cache.chunk_cache", "ChunkCache.cache_finished_req",
                                     "            req.req_pool_idx, req.cache_protected_len : kv_len_to_handle\n",
                                     "            req.req_pool_idx, req.cache_protected_len : kv_len_to_handle - 1\n"),
                                    {"I2", "I3"}),
}
DISABLED_TREE_SEEDED = {  # 0.5.23: the extend-time release of the disabled unified tree
    "no-extend-release": (("sglang.srt.managers.schedule_batch", "ScheduleBatch.maybe_evict_swa",
                           "                    and not self.tree_cache.supports_prefix_sharing()\n",
                           "                    and self.tree_cache.supports_prefix_sharing()\n"),
                          {"I9"}),
}

SCRIPT = """
import json, sys
from dataclasses import replace
from functools import partial
from kvspec.adapters.sglang.releases.environment import activate
activate(sys.argv[1])
from kvspec.adapters.patching import Patched
from kvspec.adapters.sglang.mutants import Patch
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.trace import parse
adapter = load_adapter(f"sglang@{sys.argv[1]}-chunk")
trace = parse(sys.stdin.read())
engine = adapter.make_engine(trace.engine_config())
found = {"cache": type(engine.cache).__name__, "disable": bool(getattr(engine.cache, "disable", False))}
for name, patch in [(None, None)] + [(name, Patch(*edit)) for name, edit in json.loads(sys.argv[2]).items()]:
    build = adapter.make_engine if patch is None else partial(Patched, (patch,), adapter.make_engine)
    result = replay(trace, replace(adapter, make_engine=build))
    found[name or "unpatched"] = None if result.conforms else sorted(result.failure.clauses or (result.failure.kind,))
print(json.dumps(found))
"""


def drive(release: str, seeded: dict) -> dict:
    """Replay the trace on `sglang@<release>-chunk`, unpatched and with each seeded edit: what
    cache the engine built, and the clauses each replay broke (None: it conformed)."""
    require_release(release)
    done = subprocess.run([sys.executable, "-c", SCRIPT, release, json.dumps({name: edit for name, (edit, _) in
                                                                               seeded.items()})],
                          input=TRACE_TEXT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the members, without SGLang ---------------------------------------------------------------


def test_every_release_has_a_chunk_tree_at_its_defaults_and_with_need_sort():
    """0.5.14 - 0.5.21 build `SWAChunkCache`, 0.5.22 - 0.5.23 the unified tree disabled
    (registry.py); both read the allocator's need_sort and no tree knob."""
    for release in environment.RELEASES:
        assert "chunk" in Release(release).trees, release
        assert Release(release).knobs("chunk") == ("need-sort",)
        assert {f"{release}-chunk", f"{release}-chunk+need-sort"} <= set(MEMBERS), release
        assert Release(release).disabled_tree == (release in ("0.5.22", "0.5.23"))
    assert not any(slug.startswith(release + "-chunk+") and slug != f"{release}-chunk+need-sort"
                   for slug in MEMBERS for release in environment.RELEASES)
    assert len(MEMBERS) == 175 + 2 * len(environment.RELEASES)


def test_a_chunk_member_declares_no_sharing_and_only_what_it_shows():
    for release in environment.RELEASES:
        member = MEMBERS.members[f"{release}-chunk"]
        assert (member.tree, member.policy_version, member.chunk_release) == ("chunk", "no-prefix-sharing", True)
        assert not {"prefix_sharing", "pd_decode", "pd_checkpoint_keeps_window"} & set(member.capabilities)
        assert {"chunked_prefill", "batched_prefill", "page_size_1", "page_size_gt_1"} <= set(member.capabilities)
        assert set(member.observables) == {"free_sets", "mapping", "rows", "tree"}  # what it holds: no node
        assert "make_allocator" not in vars(member)  # the release's default member has the allocator tier


# -- the trace, on the reference -------------------------------------------------------------


def test_the_trace_holds_on_the_reference():
    result = replay(parse(TRACE_TEXT), load_adapter("reference"))
    assert result.conforms, result.verdict()
    assert result.steps == len(STEPS)


def test_a_reference_that_keeps_its_prefills_swa_breaks_i9_at_the_chunk():
    """I9's no-sharing form: without it this engine broke no clause (the first decode step is
    not bounded without prefix sharing, and the second step's eviction hid the rest)."""

    class KeepsPrefillSwa(reference_engine.TwoPoolEngine):
        def prefill(self, chunks):
            with mock.patch.object(reference_engine, "free_swa_out_of_window_slots", lambda *args, **kwargs: None):
                return super().prefill(chunks)

    adapter = load_adapter("reference")
    result = replay(parse(TRACE_TEXT), replace(adapter, make_engine=KeepsPrefillSwa))
    assert not result.conforms and list(result.failure.clauses) == ["I9"], result.verdict()
    assert STEPS[result.stopped_at][0] == "prefill_chunk" and "the release before the chunk was due" in str(result.failure)


# -- the trace, on SGLang --------------------------------------------------------------------


def test_swa_chunk_cache_holds_the_trace_and_each_seeded_bug_breaks_its_clause():
    found = drive("0.5.18", SEEDED)
    assert (found["cache"], found["unpatched"]) == ("SWAChunkCache", None), found
    for name, (_, clauses) in SEEDED.items():
        assert found[name] is not None and set(found[name]) & clauses, (name, found[name])


def test_the_disabled_unified_tree_holds_the_trace_and_breaks_i9_without_its_extend_release():
    found = drive("0.5.23", DISABLED_TREE_SEEDED)
    assert (found["cache"], found["disable"], found["unpatched"]) == ("UnifiedRadixCache", True, None), found
    assert found["no-extend-release"] == ["I9"], found
