"""Every known place where real SGLang 0.5.23 differs from kvspec's spec
(kvspec.adapters.divergence: what an entry is). `tests/test_sglang_divergences.py`
replays every trace (`vectors/divergences/sglang/<id>.jsonl`) on every adapter it names and requires
the divergence to still reproduce. Nothing here loosens a check:

- divergences a `kvspec check` would otherwise hit at once are steered around by
  capabilities the sglang adapters do not declare (`refuses_misuse`,
  `atomic_alloc_decode`): the report lists those rules and checks as skipped;
- divergences seen only against the reference (`--differential`, vectors) are
  differences in the observables the spec fixes (OBS-3), not invariant violations.

`python -m kvspec.adapters.sglang.divergences` records the traces again from the steps
below (needs SGLang installed); it refuses to write one that does not reproduce.
"""

import sys
from functools import partial

from kvspec.adapters.divergence import DIVERGENCES, KnownDivergence, main
from kvspec.conformance.harness.declarations import Capability
from kvspec.conformance.harness.trace import engine_config_json
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import SGLANG_0_5_23, Policy

FOLDER = DIVERGENCES / "sglang"
BOTH = ("sglang", "sglang-python")
SglangDivergence = partial(KnownDivergence, adapters=BOTH, folder=FOLDER)
"""Upstream paths are SGLang 0.5.23's (sglang/srt/...)."""


def misuse(id: str, op: str, args: dict, what: str, upstream: str, page_size: int = 4,
           setup: tuple = ()) -> KnownDivergence:
    P = page_size
    return SglangDivergence(
        id, ("ALLOC-6",), f"accepts a free of {what}",
        f"With its invariant checks off (SGLANG_INVARIANT_CHECK unset, the default), SGLang's hybrid allocator "
        f"accepts a free of {what} and changes its free lists; the spec requires InvalidFree and no change. "
        f"Its guards are `expect(...)` calls that only signal when the checks are on.",
        upstream, "allocator", {"page_size": P, "size_full": 8 * P, "size_swa": 8 * P},
        (("new_sequence", {"length": 3 * P}), *setup, (op, args)), steered_by=Capability.REFUSES_MISUSE)


def engine_config(page_size: int, window: int, size_full: int, size_swa: int) -> dict:
    """A trace header's engine configuration, at SGLang's policy (interval 4)."""
    return engine_config_json(EngineConfig(page_size, window, size_full, size_swa, 4, Policy(SGLANG_0_5_23, 4)))


KNOWN_DIVERGENCES: tuple[KnownDivergence, ...] = (
    misuse("SGL-1", "free_padding_page", {}, "the padding page (slot 0)",
           "mem_cache/allocator/paged.py free (page 0 is released like any other); swa.py:609-623 free_full"),
    misuse("SGL-2", "free_a_free_page", {"index": 0}, "a page that is already free (a double free)",
           "mem_cache/allocator/paged.py:328-338 free (no check against the free list; "
           "only SGLANG_DEBUG_MEMORY_POOL looks for duplicates)"),
    misuse("SGL-3", "free_slot_twice", {"sequence": 0, "position": 1}, "the same slot twice in one call",
           "mem_cache/allocator/token.py:65-75 free (page size 1 appends every slot, no dedup)", page_size=1),
    misuse("SGL-4", "free_full_with_live_peer", {"sequence": 0, "position": 1},
           "a full slot whose SWA peer is still live (free_full): the SWA page is stranded, mapped from a free slot",
           "mem_cache/allocator/swa.py:609-623 free_full (expect _SWA_PEER_RELEASED)"),
    misuse("SGL-5", "free_swa_of_released", {"sequence": 0},
           "the SWA peers of a segment whose SWA is already released (free_swa_segment): the unmapped peers read "
           "as slot 0 and the padding page goes into the SWA free list",
           "mem_cache/allocator/swa.py:532-575 _free_swa_pages (expect _SWA_PEER_MAPPED)",
           setup=(("release_swa", {"sequence": 0, "pages": 1, "set_shaped": False}),)),
    SglangDivergence(
        "SGL-6", ("ALLOC-4",), "a failed alloc_decode keeps the page it took from the other pool",
        "alloc_decode runs the full sub-allocator, then the SWA one, and returns None if either is short: when only "
        "the SWA pool is out of pages the full page it took is neither returned nor mapped (a leak, I2), and when "
        "only the full pool is, the SWA page it took is (I3). SGLang's scheduler never calls it without room "
        "(check_decode_capacity, then a RuntimeError on None), so the engine tier never sees it; the allocator "
        "tier calls it without room too and charges what it kept to the failed call (spec ALLOC-4).",
        "mem_cache/allocator/swa.py:430-465 alloc_decode",
        "allocator", {"page_size": 4, "size_full": 32, "size_swa": 4},
        (("new_sequence", {"length": 4}), ("decode", {"sequence": 0})), steered_by=Capability.ATOMIC_ALLOC_DECODE),
    SglangDivergence(
        "SGL-7", ("OBS-3", "LIFE-7", "TREE-5"), "eviction for an allocation counts what the full eviction frees",
        "An extend one page short in both pools: SGLang's allocation path evicts until each pool's available size "
        "reaches its target (evict_to_free_tokens -> evict_for_alloc, for the conservative demand extend + one "
        "page per request of the batch), so the SWA freed along with an evicted leaf's full KV counts toward the SWA target and one leaf "
        "goes. The reference computes both shortfalls first and evicts each (LIFE-7, TREE-5): after the leaf, it "
        "evicts another node for the SWA pool. SGLang keeps more cached; no invariant is broken. The spec is the "
        "one to revisit: evicting against availability is what an implementer would expect.",
        "mem_cache/allocator/swa.py:210-220 evict_to_free_tokens; mem_cache/unified_radix_cache.py:697-778, "
        "968-998 evict_for_alloc; mem_cache/allocation.py:175-200",
        "engine", engine_config(page_size=4, window=8, size_full=32, size_swa=32),
        (("admit", {"rid": "a", "prompt": list(range(12))}), ("prefill_chunk", {"rid": "a", "chunk": 12, "token": 0}),
         ("finish", {"rid": "a", "trim": 0}), ("admit", {"rid": "b", "prompt": list(range(100, 124))}),
         ("prefill_chunk", {"rid": "b", "chunk": 24, "token": 0})), differential=True),
    SglangDivergence(
        "SGL-8", ("OBS-3", "LIFE-4"), "a checkpoint after a match into an SWA tombstone inserts only up to the branch",
        "A request whose admission match ran past its SWA-valid prefix into an SWA tombstone (the full KV matched "
        "further) gets swa_branching_seqlen; its checkpoint then inserts [0, branch) only, recovers the tombstone "
        "from its own slots, and raises its cursor to the new cache_protected_len. The spec (LIFE-4) inserts "
        "[0, floor_page(up_to)). SGLang's state is sound (the recovered node is live and matchable, and kvspec's "
        "I9/I10 read the insert's cursor from the tree in this case, see spec.invariants.window.insert_cursor), but "
        "cache_protected_len after the chunk differs: 4 instead of 8 here. The spec does not model "
        "swa_branching_seqlen yet.",
        "mem_cache/unified_cache/components/swa.py:379-421 (swa_branching_seqlen at match), 999-1069 "
        "(prepare_for_caching_req truncation, post-insert cleanup); unified_radix_cache.py:1164-1335 checkpoint",
        "engine", engine_config(page_size=4, window=6, size_full=52, size_swa=12),
        (("admit", {"rid": "r1", "prompt": [0] * 13}), ("prefill_chunk", {"rid": "r1", "chunk": 12, "token": 0}),
         ("prefill_chunk", {"rid": "r1", "chunk": 1, "token": 0}), ("retract", {"rid": "r1"}),
         ("evict", {"full_tokens": 0, "swa_tokens": 4}), ("admit", {"rid": "r1", "prompt": None}),
         ("prefill_chunk", {"rid": "r1", "chunk": 8, "token": 0})), differential=True),
    SglangDivergence(
        "SGL-9", ("OBS-3", "LIFE-6"), "a PD-decode admission checkpoints the prompt into the prefix cache at once",
        "After its decode-side pre-allocation, SGLang inserts the received prompt into the decode-side prefix cache "
        "before the first decode step (process_prebuilt's checkpoint), so cache_protected_len is the prompt's "
        "page-aligned length right after pd_admit; the spec (LIFE-6) leaves the request owning its prompt until a "
        "later checkpoint, and the reference protects nothing. Both are sound; the spec's admission only matches, "
        "and I10 checks the leaf of SGLang's admission checkpoint all the same, which is short of a window at some "
        "windows (SGL-11).",
        "disaggregation/decode_schedule_batch_mixin.py:119-122 (process_prebuilt: checkpoint_kv_cache); "
        "disaggregation/decode.py:2237-2392 (_pre_alloc)",
        "engine", engine_config(page_size=4, window=8, size_full=64, size_swa=32),
        (("pd_admit", {"rid": "r1", "prompt": list(range(1, 31)), "first_output": 0}),), differential=True),
    KnownDivergence(
        "SGL-11", ("I10", "WIN-6"), "a PD-decode admission checkpoints a leaf short of a window",
        "With the decode-side radix cache, SGLang starts a PD request's SWA tail at floor_page(fill - 1 - max(W, P)) "
        "and checkpoints the received prompt, [0, floor_page(fill)), before the first decode step (SGL-9). Its "
        "comment's intent is a complete window before that insert boundary, but max(W, P) is not rounded to a page: "
        "where W > P and 1 <= W % P <= P - 2 the new leaf keeps fewer than W live SWA tokens below a tombstoned "
        "head and no later match reaches it (W = 6, P = 4, a 15-token prompt: cursor 8, leaf [8, 12), and the same "
        "prompt admitted again matches nothing). A bug of SGLang (0.5.19 - 0.5.23 share the arithmetic; on 0.5.19 - "
        "0.5.22 the short leaf meets checkpoint-short-rematch first), not a difference of models: 0.5.23 re-points the request to the tree's slots, so "
        "the leaf is merely unmatchable; the releases that match again after the insert meet "
        "checkpoint-short-rematch (docs/engines/sglang-findings.md, pd-tail-not-rounded). The spec's WIN-6 tail is "
        "the same arithmetic, sound for the reference, which does not checkpoint there. Steered: the sglang "
        "adapters do not declare pd_checkpoint_keeps_window, so pd_admit is not drawn at those windows.",
        "disaggregation/decode.py:572-579 (the tail's start), :2486-2494 (the cursor set there); "
        "disaggregation/decode_schedule_batch_mixin.py:119-122 (process_prebuilt: checkpoint_kv_cache); "
        "mem_cache/unified_radix_cache.py:1232 (the insert of [0, floor_page(fill)))",
        "engine", engine_config(page_size=4, window=6, size_full=64, size_swa=32),
        (("pd_admit", {"rid": "r1", "prompt": [2, 0, 1] * 5, "first_output": 0}),),
        # not on the Rust core: I10 reads the tree, which it does not show
        adapters=("sglang-python",), folder=FOLDER, steered_by=Capability.PD_CHECKPOINT_KEEPS_WINDOW),
    KnownDivergence(
        "SGL-10", ("STATE-3", "STATE-9"), "a finish with a stop keeps a state that has read past the stop",
        "A request of a hybrid model (FULL + SWA + MAMBA, no extra buffer) whose stop leaves written outputs after "
        "it (finished_len: a speculative verify step that accepted tokens past the stop, or a stop string) "
        "finishes: release_kv_cache inserts [0, owned_kv_len) with owned_kv_len = prompt + outputs through the "
        "stop, and MambaComponent.prepare_for_caching_req donates the request's working slot as that node's "
        "checkpoint (cache_len = token_ids_len, mamba.py:613-646). The working state has read every computed "
        "token, the ones past the stop too, so the tree keys a state of 4 tokens by a 2-token prefix, and a "
        "later request that hits it copies a state of tokens it never had. The spec (STATE-9) frees the "
        "working state there; the reference does. An SGLang bug, not a difference of models (the same holds "
        "for strip_thinking_cache, whose owned_kv_len is the prompt only, schedule_batch.py:1552-1564). "
        "Steered: the sglang-python adapter does not declare releases_state_at_stop, so the state runs finish "
        "without such a stop.",
        "mem_cache/unified_cache/components/mamba.py:604-646 (prepare_for_caching_req, finished, no extra buffer: "
        "the working slot is the value at any cache_len); mem_cache/common.py:418-431 (release_kv_cache: "
        "checkpoint up_to=owned_kv_len); managers/schedule_batch.py:1552-1564 (owned_kv_len)",
        "engine", engine_config_json(EngineConfig(1, 3, 24, 12, 4, Policy(SGLANG_0_5_23, 4), state_slots=9,
                                                  state_grid=1)),
        (("admit", {"rid": "r1", "prompt": [2]}), ("prefill_chunk", {"rid": "r1", "chunk": 1, "token": 0}),
         ("decode", {"rid": "r1", "token": 2}), ("decode", {"rid": "r1", "token": 2}),
         ("decode", {"rid": "r1", "token": 2}), ("finish", {"rid": "r1", "trim": 2})),
        # not on the Rust core: STATE-3 reads the checkpoints' nodes, which its tree does not show
        adapters=("sglang-python",), folder=FOLDER, steered_by=Capability.RELEASES_STATE_AT_STOP),
)


if __name__ == "__main__":
    main(KNOWN_DIVERGENCES, sys.argv[1:])
