"""The bug zoo on real SGLang: each bug of kvspec.adapters.mutants that lives in SGLang's
code, patched into SGLang 0.5.23 itself, a line or a few, and driven through the sglang
adapter.

    kvspec check --adapter sglang-mutant-missing-page-margin --run 'engine P=4 W=6 I=4' --profile ci

must fail and name the mutant's clause. A mutant is an adapter like
kvspec.adapters.sglang.SGLANG_PYTHON (same capabilities, observables, preload, policy)
with the reference mutants' attributes (`clause`, `invariant_class`, `exposed_by`,
`reverts`) and its `patch`: which SGLang function, which source text in it, and what
replaces that text. `MUTANTS` maps each slug (the reference mutant's) to its mutant,
named `sglang-mutant-<slug>`; `NOT_PATCHED` says why the other bugs of the zoo have no
patch here.

All are built on SGLang's Python tree core: kvspec can walk its tree (I10-I14 need it),
and two of the patches are in Python tree code that the Rust core replaces (the SWA
eviction walk, the match validator). The rest are in code both cores share.

How a patch is applied (`Patch`, `active`, `Patched`: kvspec.adapters.patching): the
function's own source text with the one edit is compiled again and swapped in as its
`__code__`, so every caller runs the edit, including modules that imported the function
by name (components/swa.py imports `free_swa_out_of_window_slots`, the adapter's runtime
imports `release_kv_cache`). The patch is on only while a call into the mutant's
allocator or engine runs, so an unpatched sglang adapter in the same process runs SGLang
unpatched; nothing is patched at import. A patch whose text is not in the function
exactly once raises PatchError: an SGLang upgrade that moves the code stops the mutant
instead of leaving it silently unpatched.

SGLang runs with its invariant checks off (as in the sglang adapter), so a misuse the
patch causes shows as SGLang silently doing the wrong thing, which kvspec's invariants
catch; where SGLang's own assertions fire first, the mutant's docstring says so.
"""

import functools

from kvspec.adapters import patching
from kvspec.adapters.patching import (  # noqa: F401 - re-exported: the machinery's names, importable from here
    FUTURE_FLAGS,
    ORIGINAL_CODE,
    Patched,
    PatchError,
    active,
    patched_code,
)
from kvspec.conformance.harness.declarations import CRASH, RUNS, Capability, Run
from kvspec.conformance.harness.families import MalformedDeclaration, check_declaration

from . import SGLANG_PYTHON
from .runtime import sglang

# -- patches ----------------------------------------------------------------------------------


class Patch(patching.Patch):
    """One edit of one SGLang function: `old`, exact source text of the function (whole
    lines, indentation as in SGLang's file), becomes `new`."""

    implementation = "SGLang"

    def prepare(self) -> None:
        sglang()  # SGLang's modules import through the adapter's runtime (the torchvision stub)


# -- mutants as adapters ----------------------------------------------------------------------

MUTANTS: dict[str, type["SglangMutant"]] = {}


class SglangMutant:
    """Real SGLang with one patch, as an adapter. A subclass passes its slug, sets `patch`,
    `clause`, `invariant_class`, `exposed_by` and `reverts`, and says in its docstring
    what the bug is. The base is SGLang's Python tree core (sglang-python), whose tree
    kvspec can walk; `base=SGLANG` takes the Rust core."""

    name: str
    policy_version = SGLANG_PYTHON.policy_version
    capabilities = SGLANG_PYTHON.capabilities
    observables = SGLANG_PYTHON.observables
    preload = SGLANG_PYTHON.preload
    make_allocator = None
    make_engine = None
    patch: Patch
    clause: str
    invariant_class: str
    exposed_by: Run
    reverts: str
    """The upstream SGLang fix or flag the patch undoes (bug classes of
    docs/engines/sglang.md section 7)."""
    crash_message: str = ""
    """As kvspec.adapters.mutants.seeding.Mutant.crash_message: for CRASH, the text the crash
    shows, where an assertion of SGLang's own stops every counterexample first."""

    def __init_subclass__(cls, slug: str, base=SGLANG_PYTHON, **kwargs):
        super().__init_subclass__(**kwargs)
        check_declaration(cls, slug)
        if cls.exposed_by not in RUNS:
            raise MalformedDeclaration(f"sglang mutant {slug!r}: {cls.exposed_by.label!r} is not a run kvspec check "
                                       f"makes")
        if not cls.reverts:
            raise MalformedDeclaration(f"sglang mutant {slug!r}: say which SGLang fix or flag it reverts")
        cls.name = f"sglang-mutant-{slug}"
        cls.observables = base.observables
        cls.make_allocator = staticmethod(functools.partial(Patched, (cls.patch,), base.make_allocator))
        cls.make_engine = staticmethod(functools.partial(Patched, (cls.patch,), base.make_engine))
        MUTANTS[slug] = cls


COMMON = "sglang.srt.mem_cache.common"
ALLOCATOR = "sglang.srt.mem_cache.allocator.swa"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
RADIX_CACHE = "sglang.srt.mem_cache.unified_radix_cache"
SWA_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.swa"
PD_DECODE = "sglang.srt.disaggregation.decode"
TREE_CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core"


# -- window eviction: free_swa_out_of_window_slots and its decode trigger ---------------------------


class MISSING_PAGE_MARGIN(SglangMutant, slug="missing-page-margin"):
    """Window eviction retains `W` tokens below `pre_len` instead of whole pages
    `ceil_align(max(W, P), P)`, while sharing prefixes. The window of the next token stays
    live, but when `1 <= W % P <= P - 2` the floored cursor leaves the leaf a checkpoint
    inserts fewer than `W` live SWA tokens: no later request can match the prefix."""

    patch = Patch(COMMON, "free_swa_out_of_window_slots",
                  "        evict_threshold = pre_len - ceil_align(\n"
                  "            max(sliding_window_size, page_size), page_size\n"
                  "        )\n",
                  "        evict_threshold = pre_len - sliding_window_size\n")
    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = ("the page margin: 0.5.23's ceil_align(max(W, P), P), which replaced the threshold pre_len - W of "
               "SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN (bug class 2)")


class FRONTIER_MAX_WINDOW_PAGE(SglangMutant, slug="frontier-max-window-page"):
    """Window eviction retains `max(W, P)` tokens, not rounded up to a page. It differs
    from 0.5.23 when `W > P` and `W % P != 0`, and there it is the missing page margin:
    at `W % P <= P - 2` a checkpoint's leaf keeps fewer than `W` live SWA tokens (I10).
    (It differs from the missing margin only when `P > W`, where it is safe.)"""

    patch = Patch(COMMON, "free_swa_out_of_window_slots",
                  "        evict_threshold = pre_len - ceil_align(\n"
                  "            max(sliding_window_size, page_size), page_size\n"
                  "        )\n",
                  "        evict_threshold = pre_len - max(sliding_window_size, page_size)\n")
    clause, invariant_class = "I10", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = ("the rounding of max(W, P) up to a page: the public-fork threshold pre_len - max(W, P) that "
               "preceded 0.5.23's ceil_align(max(W, P), P) (docs/engines/sglang.md §4.1)")


class FRONTIER_INTO_WINDOW(SglangMutant, slug="frontier-into-window"):
    """Window eviction rounds the new cursor up to a page instead of down: whenever the
    threshold is not on a page boundary the request frees one page too many.

    At a decode step that page holds positions of the window (I8). At a prefill
    checkpoint it is cut from the leaf the insert makes, which keeps fewer than `W` live
    SWA tokens (I10), and from the window too unless the chunk's window starts at or
    above the rounded cursor (I8). The first counterexample breaks I8; kvspec check may
    shrink it to a checkpoint that breaks I10 alone (P=4, W=7: an 11-token chunk, cursor
    4, leaf [4, 8) live). Its runs draw no PD-decode admission: SGLang checkpoints the
    received prompt at once (SGL-9), and there the same short leaf breaks I10 before any
    decode step reads the window (P=4, W=7: an 11-token prompt, cursor 4, leaf [4, 8)).
    Without them the first counterexample breaks I8, as the reference mutant's does."""

    capabilities = tuple(capability for capability in SGLANG_PYTHON.capabilities if capability != Capability.PD_DECODE)
    patch = Patch(COMMON, "free_swa_out_of_window_slots",
                  "        new_evicted_seqlen = (new_evicted_seqlen // page_size) * page_size\n",
                  "        new_evicted_seqlen = ceil_align(new_evicted_seqlen, page_size)\n")
    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=4, window=7, interval=1)
    reverts = "the floor of the new cursor to a page (bug class 9, evicting into the live window)"


class UNALIGNED_CURSOR(SglangMutant, slug="unaligned-cursor"):
    """Window eviction sets the SWA cursor to the raw threshold, not floored to a page:
    the cursor splits a page between the dead and the live range.

    Decode steps and prefill checkpoints share free_swa_out_of_window_slots. Where a decode
    step evicts first, kvspec sees the unaligned cursor (I6, with I5 and I8: the
    page-granular SWA free released live positions above it; the first counterexample at
    seed 0). Where a checkpoint does, its insert asserts the cursor is page aligned
    (SWAComponent._clip_to_window), a crash; kvspec check shrinks to that, two steps:
    admit, then a 10-token chunk (P=4, W=7: cursor 9 - 8 = 1).
    (The reference mutant seeds the decode path only; in SGLang that would take a copy of
    the shared function, not an edit of it.)"""

    patch = Patch(COMMON, "free_swa_out_of_window_slots",
                  "    if page_size > 1:\n"
                  "        new_evicted_seqlen = (new_evicted_seqlen // page_size) * page_size\n",
                  "")
    clause, invariant_class = "I6", "alignment"
    exposed_by = Run(page_size=4, window=7, interval=1)
    reverts = "the floor of the cursor to a page, `if P > 1: new = floorP(new)` (bug class 5, misaligned cursors)"
    crash_message = "must be page-aligned"  # the same assertion, reached first by a PD admission's checkpoint


class PD_CURSOR_UNSET(SglangMutant, slug="pd-cursor-unset"):
    """The PD-decode pre-allocation allocates SWA KV for the tail only but does not set the
    cursor to the tail's start, `fill - tail`: the head, whose full slots map to 0, looks
    SWA-live (I5)."""

    patch = Patch(PD_DECODE, "alloc_for_decode_prealloc",
                  "            req.kv.set_evicted_seqlen(ComponentType.SWA, swa_evicted_seqlen)\n", "")
    clause, invariant_class = "I5", "mapping"
    exposed_by = Run(page_size=4, window=7, interval=1)  # not W = 6, where SGLang's runs draw no PD admission (SGL-11)
    reverts = ("docs/engines/sglang.md, bug class 3: req.kv.set_evicted_seqlen(SWA, fill - tail) after "
               "alloc_extend_swa_tail (disaggregation/decode.py:2486-2494)")


class DECODE_FRONTIER_ONE_TOKEN_LATE(SglangMutant, slug="decode-frontier-one-token-late"):
    """The decode step's window eviction is called with the new `seqlen` instead of
    `pre_len = seqlen - 1`: it frees position `C - W`, which the step itself still reads."""

    patch = Patch(SCHEDULE_BATCH, "ScheduleBatch.maybe_evict_swa",
                  "                            req.seqlen - 1,\n",
                  "                            req.seqlen,\n")
    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=1, window=3, interval=4)
    reverts = "decode's pre_len = seqlen - 1 (bug class 9: an off-by-one in pre_len frees the window's first token)"


class DECODE_EVICTION_NEVER(SglangMutant, slug="decode-eviction-never"):
    """The decode trigger of window eviction is never true: `or` slipped to `and` in the
    condition `has_auxiliary_swa or swa_evict_due(req)`, and a plain SWA tree has no
    auxiliary window. A decoding request keeps every SWA slot it allocates."""

    patch = Patch(SCHEDULE_BATCH, "ScheduleBatch.maybe_evict_swa",
                  "                        and (has_auxiliary_swa or swa_evict_due(req))\n",
                  "                        and (has_auxiliary_swa and swa_evict_due(req))\n")
    clause, invariant_class = "I9", "window-bound"
    exposed_by = Run(page_size=4, window=8, interval=1)
    reverts = ("decode-time window eviction (maybe_evict_swa's token-gated trigger, SGLANG_SWA_EVICTION_INTERVAL): "
               "the bound on a decoding request's SWA")


class NO_CHUNK_RELEASE(SglangMutant, slug="no-chunk-release"):
    """A checkpoint of an unfinished request inserts its chunk without releasing the SWA
    below the window first: the whole chunk goes into the tree with live SWA, so a long
    prompt holds SWA for all of its chunks instead of a window per chunk."""

    patch = Patch(RADIX_CACHE, "UnifiedRadixCache.checkpoint_into_tree",
                  "            for comp in self._components_tuple:\n"
                  "                comp.free_out_of_window_slots(req, len(radix_key) - 1, insert_params)\n",
                  "            pass\n")
    clause, invariant_class = "I9", "window-bound"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = ("the out-of-window release during chunked prefill (bug class 1; in 0.5.23 also turned off by "
               "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS=0, a flag, not a code patch)")


# -- request release: release_kv_cache, free_kv_row_segments ----------------------------------------


class LEAK_ON_RELEASE(SglangMutant, slug="leak-on-release"):
    """A release frees `[cache_protected_len, owned)` and forgets the over-allocation
    `[ceil_page(owned), kv_allocated_len)` that a finish with a stop leaves: those pages
    are neither free nor held."""

    patch = Patch(COMMON, "release_kv_cache",
                  "    _release_overallocated_kv_indices(\n"
                  "        req, owned_kv_len, req.kv.kv_allocated_len, tree_cache\n"
                  "    )\n",
                  "")
    clause, invariant_class = "I2", "leak"
    exposed_by = Run(page_size=4, window=6, interval=4)
    reverts = "_release_overallocated_kv_indices, the release of the pages past a stop"


class RELEASE_DEAD_RANGE_AS_FULL(SglangMutant, slug="release-dead-range-as-full"):
    """A release frees the request's SWA-dead range `[swa_dead_lo, cursor)`, whose SWA the
    window eviction already gave back, in both pools instead of the full pool only: the
    strict SWA free reads the cleared mapping (slot 0) and, with SGLang's checks off,
    puts the padding page into the SWA free list, once per dead page.

    kvspec sees page 0 in the free list (I1, and I3 counts a page twice: the first
    counterexample at seed 0). Where the SWA pool is free enough for those extra entries
    to overfill it, SGLang's own check that its free list is no longer than the pool
    (SWATokenToKVPoolAllocator._free_swa_pages) fires inside the release instead, a crash;
    kvspec check shrinks to that (a lone request, an abort after decode eviction). That check
    is a bare `assert` (0.5.23 mem_cache/allocator/swa.py:553, 607), with no message to declare
    as the crash's: at P=4 W=6 I=4 the seed-0 search meets it first since the engine machine
    also draws flushes, waiting matches and finishes in a prefill batch, so the bug is exposed
    at P=4 W=7 I=1, where the padding page in the free list comes first (I1)."""

    patch = Patch(COMMON, "free_kv_row_segments",
                  "        allocator.free_full_segments(swa_dead)\n",
                  "        allocator.free_segments(swa_dead)\n")
    clause, invariant_class = "I1", "leak"
    exposed_by = Run(page_size=4, window=7, interval=1)
    reverts = ("the dead/alive split of free_kv_row_segments (dead range full-side only); bug class 4, a free "
               "of page 0 through the padding mapping")


# -- the hybrid allocator: SWATokenToKVPoolAllocator -----------------------------------------------


class STALE_MAPPING(SglangMutant, slug="stale-mapping"):
    """The strict SWA free (`free_swa_segment`, `free_segment`, `free_swa` at page size 1)
    returns the SWA pages but leaves the freed full slots mapped to them: released
    positions still name SWA slots the pool may give to another request."""

    patch = Patch(ALLOCATOR, "SWATokenToKVPoolAllocator._free_swa_pages_none_cuda",
                  "        self.clear_full_to_swa_mapping(mapping_indices)\n"
                  "        return swa_pages\n",
                  "        return swa_pages\n")
    clause, invariant_class = "I5", "mapping"
    exposed_by = Run(page_size=4)
    reverts = "the mapping reset on every SWA free (bug class 6, stale mapping after free)"


class TAIL_FULL_PAGE_COUNT(SglangMutant, slug="tail-full-page-count"):
    """`alloc_extend_swa_tail` passes the full side's page count to the SWA sub-allocator,
    which consumes that many pages for a tail that needs fewer: the rest are neither free
    nor mapped (I3).

    Where the SWA pool has the tail's pages but not the full count, the capacity check
    passes and the SWA sub-allocator returns None; SGLang's own `assert alloc_swa_indices
    is not None` fires, a crash the allocator tier names ALLOC-5. Every counterexample
    shrinks to that, two steps (a one-token sequence, then a 5-token fork with a one-token
    tail into a two-page SWA pool). Either manifestation counts as caught (`crash_message`);
    which one the first counterexample shows differs between processes at the same seed
    (the leak in one fresh-clone CI run, the crash in another)."""

    patch = Patch(ALLOCATOR, "SWATokenToKVPoolAllocator.alloc_extend_swa_tail",
                  "            num_new_pages=num_swa_pages,\n",
                  "            num_new_pages=num_full_pages,\n")
    clause, invariant_class = "I3", "leak"
    crash_message = "alloc_extend_swa_tail"  # the same bug's other manifestation
    exposed_by = Run(page_size=4)
    reverts = ("num_new_pages=num_swa_pages for the SWA side of alloc_extend_swa_tail (design-doc change 2; "
               "bug class 7, page-count mismatch)")


class FULL_FREED_BEFORE_SWA(SglangMutant, slug="full-freed-before-swa"):
    """The set-shaped SWA free (`free_swa` at page size > 1, which `free` calls first)
    does the full side's bookkeeping first: it resets the freed full pages' mapping to 0,
    then reads their SWA peers from it. It finds none and, lenient, skips them: the SWA
    pages are neither freed nor held.

    (The literal reorder of `free`'s two calls, `free_full` before `free_swa`, is no bug
    in 0.5.23: `free_full` leaves the mapping alone, so `free_swa` after it reads the same
    peers; unpatched and patched that way, allocator P=1, 2, 4 and 16 pass 300 examples.)"""

    patch = Patch(ALLOCATOR, "SWATokenToKVPoolAllocator.free_swa",
                  "        swa_indices = self.full_to_swa_index_mapping[mapping_indices]\n"
                  "        self.clear_full_to_swa_mapping(mapping_indices)\n",
                  "        self.clear_full_to_swa_mapping(mapping_indices)\n"
                  "        swa_indices = self.full_to_swa_index_mapping[mapping_indices]\n")
    clause, invariant_class = "I3", "leak"
    exposed_by = Run(page_size=4)
    reverts = ("SWA first: free_swa reads the peers from the mapping before it clears it "
               "(docs/engines/sglang.md, bug class 6 and §2.3)")


class ONE_POOL_AVAILABLE(SglangMutant, slug="one-pool-available"):
    """The capacity predicate `new_pages_available` looks at the full pool only. An
    extend (or SWA-tail allocation) that fits the full pool but not the SWA pool then
    takes its full pages, and the SWA sub-allocator returns None: SGLang's own
    `assert alloc_swa_indices is not None` stops it: a crash, which the allocator tier
    names ALLOC-5 (the adapter turns the AssertionError into InvalidAllocation, raised by a
    valid call), as the reference mutant crashes too.
    The engine tier's extend gate (the adapter's `extend_fits`) calls this same predicate
    and crashes there the same way; the decode gate (`check_decode_capacity`) reads
    `available_size()`, which still looks at both pools."""

    patch = Patch(ALLOCATOR, "SWATokenToKVPoolAllocator.new_pages_available",
                  "        return full_ok and (\n"
                  "            num_swa_pages <= self.swa_attn_allocator.available_size() // self.page_size\n"
                  "        )\n",
                  "        return full_ok\n")
    clause, invariant_class = "ALLOC-5", CRASH
    crash_message = "raised although the call is valid"
    exposed_by = Run(page_size=4)
    reverts = "new_pages_available over both pools, the single capacity predicate (design-doc change 2)"


# -- the tree: SWA eviction and the SWA match validator --------------------------------------------


class SWA_EVICT_IGNORES_LOCKS(SglangMutant, slug="swa-evict-ignores-locks"):
    """SWA eviction's LRU walk skips nodes by their host lock count instead of their
    device lock count (the walker it was copied from): with no host cache that count is
    0, so SWA eviction tombstones nodes running requests hold locked."""

    patch = Patch(TREE_CORE, "UnifiedLRUList.get_prev_no_lock",
                  "        while x.component_data[ct].lock_ref > 0:\n",
                  "        while x.component_data[ct].host_lock_ref > 0:\n")
    clause, invariant_class = "I14", "locks"
    exposed_by = Run(page_size=4, window=8, interval=1)
    reverts = "SWA eviction skipping SWA-locked nodes (get_prev_no_lock; bug class 10, I14)"


class MATCH_SHORT_WINDOW(SglangMutant, slug="match-short-window"):
    """The SWA match validator rejects a tombstone but forgets to restart the count of live
    SWA tokens after it: the count stays at "no tombstone met", so any live node below a
    tombstone is accepted, with fewer than `W` live SWA tokens after the tombstone. A
    request that matches such a prefix starts with a window reaching into the tombstone.
    The engine machine draws that rarely on real SGLang (a prompt that follows a cached
    path through a tombstone and leaves it fewer than W tokens later): at seed 0 the
    page-size-1 run finds it in its 12th example, the P=4 runs not in 300."""

    patch = Patch(SWA_COMPONENT, "SWAComponent.create_match_validator",
                  '                state["len"] = 0\n',
                  "")
    clause, invariant_class = "I8", "window-liveness"
    exposed_by = Run(page_size=1, window=3, interval=4)
    reverts = "the SWA match validator: at least W live SWA tokens after a tombstone (docs/engines/sglang.md §3.3)"


# -- recurrent state: the MAMBA component and the state pool (chapter 09) -------------------------

STATE_RUN = Run(page_size=1, window=3, interval=4, state_grid=1)
"""The one state run SGLang takes (page size 1: no extra buffer)."""


class STATE_LEAK_BEFORE_EXTEND(SglangMutant, slug="state-leak-before-extend"):
    """A request released before its first extend gives back nothing of its state: the
    working slot that its admission took (a copy-on-write destination at a hit, or the
    slot of its first extend) is neither free nor held. `release_kv_cache` frees a slot a
    request holds without a KV row (common.py:403-415, "A mamba-capable cache may alloc
    mamba state before alloc KV cache"); the patch drops that free, the state-slot leak
    of a request that is dropped before it runs (the class of sgl-project/sglang #16067,
    a slot leaked on a failed schedule, whose fix is the same kind of free in
    scheduler.py:4285-4298)."""

    patch = Patch(COMMON, "release_kv_cache",
                  "        if req.kv.holds_mamba:\n"
                  "            tree_cache.req_to_token_pool.mamba_allocator.free(\n"
                  "                req.kv.mamba_pool_idx.unsqueeze(-1)\n"
                  "            )\n"
                  "            req.kv.mamba_pool_idx = None\n",
                  "")
    clause, invariant_class = "STATE-9", "leak"
    exposed_by = STATE_RUN
    reverts = ("the free of a state slot held without a KV row in release_kv_cache (common.py:403-415); the "
               "leak class of sgl-project/sglang #16067")


class STALE_COW_SOURCE(SglangMutant, slug="stale-cow-source"):
    """The forward that runs a request's deferred copy-on-write leaves the copy source on
    the request: every later extend of it copies the hit's checkpoint into its slot again,
    over the state of the chunks it computed since (after a hit and two prefill chunks
    its working state has read the hit and the last chunk only). kvspec sees it after
    the first chunk: the request's slot has a copy staged over its state (state.py shows
    a staged copy as what the slot is about to hold, STATE-4). This is the stale
    copy source that sgl-project/sglang #35821 names (there an empty ghost node was the
    source); 0.5.23 clears the source as it collects the copy
    (`ScheduleBatch._collect_deferred_mamba_cow_and_clear`, schedule_batch.py:3246-3250)."""

    patch = Patch(SCHEDULE_BATCH, "ScheduleBatch._collect_deferred_mamba_cow_and_clear",
                  "                req.kv.mamba_cow_src_index = None\n",
                  "")
    clause, invariant_class = "STATE-4", "state"
    exposed_by = STATE_RUN
    reverts = ("the clearing of the copy-on-write source once collected (schedule_batch.py:3249); the stale "
               "copy source of sgl-project/sglang #35821")


MAMBA_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.mamba"


class FREE_WORKING_FOR_FORK(SglangMutant, slug="free-working-for-fork"):
    """A chunk's checkpoint whose node already holds one frees the wrong slot: the
    request's working state instead of the unused fork. The request runs on with a free
    slot as its state (the next allocation hands it out), and the fork is neither free
    nor held. 0.5.23 frees the fork it just made (`MambaComponent.cleanup_after_caching_req`,
    mamba.py:722-725).

    The bug is one STATE-7 forbids (a step frees a running request's state), but the
    request still names the slot, so STATE-7's check, which looks for a request that lost
    its working slot, does not fire: STATE-2 sees the slot free and held at once."""

    patch = Patch(MAMBA_COMPONENT, "MambaComponent.cleanup_after_caching_req",
                  "            ):\n"
                  "                self._free_mamba_value(insert_params.mamba_value)\n",
                  "            ):\n"
                  "                self._free_mamba_value(req.kv.mamba_pool_idx.unsqueeze(0))\n")
    clause, invariant_class = "STATE-2", "ownership"
    exposed_by = STATE_RUN
    reverts = "the free of the unused fork, not the working slot, when the node has a checkpoint (mamba.py:722-725)"


class LEDGER_STUCK_PROTECTED(SglangMutant, slug="ledger-stuck-protected"):
    """The last unlock of a node with a checkpoint leaves it in the protected ledger: the
    move back to evictable tests `lock_ref == 0` before the decrement instead of
    `lock_ref == 1`, so it never runs. The tree's counts of its checkpoints drift from its
    nodes (and SGLang's admission, which adds the evictable ledger to what it may
    reclaim, undercounts). 0.5.23 moves it at the last unlock (mamba.py:518-523)."""

    patch = Patch(MAMBA_COMPONENT, "MambaComponent.release_component_lock",
                  "        if cd.lock_ref == 1 and value is not None:\n",
                  "        if cd.lock_ref == 0 and value is not None:\n")
    clause, invariant_class = "STATE-6", "locks"
    exposed_by = STATE_RUN
    reverts = "the ledger move at a checkpoint's last unlock (release_component_lock, mamba.py:518-523)"


class SHARED_STATE_ON_HIT(SglangMutant, slug="shared-state-on-hit"):
    """A prefix hit adopts the checkpoint's own slot as the request's working state
    instead of copying it into the slot it took (that one goes back): the request's
    forwards write into the checkpoint, and the slot has two holders. 0.5.23 stages a
    copy into a slot of the request's own (MambaComponent.finalize_match_result_in_cache,
    mamba.py:209-224)."""

    patch = Patch(MAMBA_COMPONENT, "MambaComponent.finalize_match_result_in_cache",
                  "            req.kv.mamba_pool_idx = dst_index[0]\n"
                  "        req.kv.mamba_cow_src_index = src_index\n",
                  "            self.cache.req_to_token_pool.mamba_allocator.free(dst_index)\n"
                  "            req.kv.mamba_pool_idx = src_index[0]\n")
    clause, invariant_class = "STATE-2", "ownership"
    exposed_by = STATE_RUN
    reverts = "copy-on-write at a match (MambaComponent.finalize_match_result_in_cache, mamba.py:209-224)"


class NO_COPY_ON_HIT(SglangMutant, slug="no-copy-on-hit"):
    """A prefix hit takes a slot of its own but stages a clear instead of the copy: the
    request computes only the tokens after the hit, from an empty state. 0.5.23 stages
    the copy and cancels the clear (mamba.py:223-224)."""

    patch = Patch(MAMBA_COMPONENT, "MambaComponent.finalize_match_result_in_cache",
                  "        req.kv.mamba_cow_src_index = src_index\n"
                  "        req.kv.mamba_needs_clear = False\n",
                  "        req.kv.mamba_needs_clear = True\n")
    clause, invariant_class = "STATE-4", "state"
    exposed_by = STATE_RUN
    reverts = "finalize_match_result_in_cache stages the copy and sets mamba_needs_clear = False (mamba.py:223-224)"


class HIT_WITHOUT_CHECKPOINT(SglangMutant, slug="hit-without-checkpoint"):
    """The MAMBA component's match validator accepts every node, so a hit ends where the
    full and SWA KV allow, also at a node without a checkpoint (one a split made, or one
    whose checkpoint was evicted): there is nothing to copy, and the request starts from
    an empty state as if it had read the hit. 0.5.23 accepts only a node with a
    checkpoint (MambaComponent.create_match_validator, mamba.py:151-162)."""

    patch = Patch(MAMBA_COMPONENT, "MambaComponent.create_match_validator",
                  "        if match_device_only:\n"
                  "            return lambda node: node.component_data[ct].value is not None\n",
                  "        return lambda node: True\n")
    clause, invariant_class = "STATE-5", "state"
    exposed_by = STATE_RUN
    reverts = "the MAMBA match validator: a match ends only at a checkpoint (mamba.py:151-162)"


# -- bugs of the zoo with no SGLang patch here ---------------------------------------------------

NOT_PATCHED = {
    "group-end-mapping": "SGLang 0.5.18 shipped this bug (finding grouped-swa-free-remap: its regression vector "
                         "fails on sglang@0.5.18 and passes on every other release); 0.5.23 resolves a grouped SWA "
                         "free's mapping when it is queued in two functions (free_swa, _free_swa_pages) and releases "
                         "in a third (free_group_end), so undoing it is a rewrite, not a patch",
    "pd-checkpoint-short": "SGLang 0.5.23 already has this bug (known divergence SGL-11, its PD-decode admission "
                           "checkpoints a leaf short of a window); the reference mutant shows it",
    "non-atomic-decode": "SGLang 0.5.23 already has this bug (known divergence SGL-6, alloc_decode keeps the full "
                         "page it took when the SWA side is short); the reference mutant shows it",
    "leak-state-on-failed-admission": "SGLang's revert of a request it does not add (scheduler.py:4285-4298) is "
                                      "inline in get_new_batch_prefill, which the adapter does not run, and its "
                                      "PD-decode admission with state is not driven; state-leak-before-extend is "
                                      "the same leak through release_kv_cache",
    "checkpoint-off-grid": "without the extra buffer SGLang's checkpoint grid is 1 (every insert end), the only "
                           "grid its adapter runs; a grid > 1 needs the extra buffer, not driven",
    "state-lock-on-path": "not patched yet: MambaComponent locks the one node inc_lock_ref passes it "
                          "(unified_tree_core.py:730-743); a path lock is a rewrite of acquire/release_component_lock",
    "window-release-frees-state": "not patched yet: MambaComponent has no free_out_of_window_slots of its own (the "
                                  "base no-op, components/base.py:713-716), and the base is FULL's too",
    "evict-locked-checkpoint": "the lock test of SGLang's eviction walk is shared by SWA and MAMBA "
                               "(UnifiedLRUList.get_prev_no_lock): swa-evict-ignores-locks is that patch",
    "retract-keeps-state": "not patched yet: a retract frees the slot in on_release, as an abort does "
                           "(unified_radix_cache.py:1152-1157); state-leak-before-extend is the leak of a release",
}
"""Reference only: each slug of kvspec.adapters.mutants that has no SGLang patch, and why."""
