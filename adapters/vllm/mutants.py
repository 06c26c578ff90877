"""The bug zoo on real vLLM: bugs seeded into vLLM 0.33.0's own v1 KV cache manager, a line
or a few each, at least one for every clause of chapter 08 (one shared block pool), driven
through the vllm adapter.

    kvspec check --adapter vllm-mutant-window-one-token-early --run 'engine P=2 W=5 I=1' --profile quick

must fail and name the mutant's clause. A mutant is an adapter like
kvspec.adapters.vllm.VLLM (same capabilities, observables, preload, policy) with the
clause it breaks, that clause's invariant class, the run of `kvspec check` that exposes
it (`exposed_by`) and its `patch`: which vLLM function, which source text in it, and
what replaces that text. Its docstring says what the bug is, which real-world bug class
it models, and where it is caught. `MUTANTS` maps each slug to its mutant, named
`vllm-mutant-<slug>`.

The patches are applied as the SGLang zoo's are (kvspec.adapters.patching): the
function's own source with the one edit is compiled again and swapped in as its
`__code__`, only while a call into the mutant's engine runs, so an unpatched vllm
adapter in the same process runs vLLM unpatched. A patch whose text is not in the
function exactly once raises PatchError: a vLLM upgrade that moves the code stops the
mutant instead of leaving it silently unpatched.

vLLM's own assertions stay on. Some of these bugs trip one if the engine runs on past
the step where kvspec catches them (their docstrings name it); kvspec's invariants catch
every bug first, an InvariantViolation naming its clause rather than a crash
(tests/test_vllm_mutants.py runs each `exposed_by` run at a fixed seed and requires that).
"""

import functools

from kvspec.adapters import patching
from kvspec.adapters.patching import Patched
from kvspec.conformance.harness.declarations import RUNS, Run
from kvspec.conformance.harness.families import MalformedDeclaration, check_declaration

from . import VLLM, VLLM_DENSE
from .runtime import vllm

# -- patches ----------------------------------------------------------------------------------


class Patch(patching.Patch):
    """One edit of one vLLM function: `old`, exact source text of the function (whole
    lines, indentation as in vLLM's file), becomes `new`."""

    implementation = "vLLM"

    def prepare(self) -> None:
        vllm()  # vLLM's modules import as the adapter imports them (and the block hashes' seed is set)


# -- mutants as adapters ----------------------------------------------------------------------

MUTANTS: dict[str, type["VllmMutant"]] = {}
"""The mutants of chapter 08 (BLOCK-n)."""
STATE_MUTANTS: dict[str, type["VllmMutant"]] = {}
"""The mutants of recurrent state in a block pool (STATE-10 .. STATE-14), run on a state run."""
ALL_MUTANTS: dict[str, type["VllmMutant"]] = {}
"""Every mutant, by slug: the family `vllm-mutant-<slug>` (family.py)."""
BLOCK_POOL_STATE_CLAUSES = tuple(f"STATE-{n}" for n in range(10, 15))
"""The clauses of chapter 09 that read a shared block pool (kvspec.spec.block_pool_state)."""
ENGINE_RUNS = {run for run in RUNS if run.tier == "engine"}


class VllmMutant:
    """Real vLLM with one patch, as an adapter. A subclass passes its slug (and `base`, the
    vllm adapter it patches: VLLM, the engine's default prefix-cache retention, unless
    it names VLLM_DENSE), sets `patch`, `clause`, `invariant_class` and `exposed_by`, and
    says in its docstring what the bug is and which real-world bug class it models."""

    name: str
    policy_version = VLLM.policy_version
    memory_model = VLLM.memory_model
    capabilities = VLLM.capabilities
    observables = VLLM.observables
    preload = VLLM.preload
    make_engine = None
    patch: Patch
    clause: str
    invariant_class: str
    exposed_by: Run
    base: type
    """The vllm adapter the patch goes into."""

    def __init_subclass__(cls, slug: str, base=VLLM, **kwargs):
        super().__init_subclass__(**kwargs)
        check_declaration(cls, slug)
        if not (cls.clause.startswith("BLOCK-") or cls.clause in BLOCK_POOL_STATE_CLAUSES):
            raise MalformedDeclaration(f"vllm mutant {slug!r}: name a clause of chapter 08 (BLOCK-n) or of recurrent "
                                       f"state in a block pool (STATE-10 .. STATE-14)")
        if cls.exposed_by not in ENGINE_RUNS:
            raise MalformedDeclaration(f"vllm mutant {slug!r}: {cls.exposed_by.label!r} is not an engine run kvspec "
                                       f"check makes")
        cls.name = f"vllm-mutant-{slug}"
        cls.base = base
        cls.policy_version, cls.capabilities, cls.memory_model = base.policy_version, base.capabilities, base.memory_model
        cls.observables, cls.preload = base.observables, base.preload
        cls.make_engine = staticmethod(functools.partial(Patched, (cls.patch,), base.make_engine))
        (MUTANTS if cls.clause.startswith("BLOCK-") else STATE_MUTANTS)[slug] = cls
        ALL_MUTANTS[slug] = cls


BLOCK_POOL = "vllm.v1.core.block_pool"
MANAGERS = "vllm.v1.core.single_type_kv_cache_manager"
COORDINATOR = "vllm.v1.core.kv_cache_coordinator"


# -- the pool, its free queue and reference counts ---------------------------------------------


class HIT_LEFT_IN_FREE_QUEUE(VllmMutant, slug="hit-left-in-free-queue"):
    """A prefix hit on a cached block that no request holds (an eviction candidate)
    takes a reference but leaves the block in the free queue: the pool can hand it out
    again while the request that hit reads it.

    Bug class: use-after-free of a cached block, the free list and the reference counts
    disagreeing. vLLM evicts lazily (a cached block nobody holds stays in the free
    queue, keeping its key), so every hit must unlink such a block (`BlockPool.touch`).
    Caught at the admission that hits: a held block in the free queue (BLOCK-1). Run on,
    the pool pops the block for another allocation and vLLM's `assert block.ref_cnt == 0`
    in `get_new_blocks` fires."""

    patch = Patch(BLOCK_POOL, "BlockPool.touch",
                  "            if block.ref_cnt == 0:\n"
                  "                self.free_block_queue.remove(block)\n",
                  "")
    clause, invariant_class = "BLOCK-1", "leak"
    exposed_by = Run(page_size=2, window=5, interval=1)


class HIT_WITHOUT_REFERENCE(VllmMutant, slug="hit-without-reference"):
    """A prefix hit adopts the cached blocks into the request's tables (and unlinks the
    free ones from the free queue) without taking a reference: each shared block's count
    is one short per request that hit it.

    Bug class: a missing reference-count increment on sharing, which frees a shared
    prefix block early (the first holder's release drops the count to 0 while another
    request still reads the block). Caught at the admission that hits: a block held by
    more table entries than its count (BLOCK-2; with BLOCK-1 when the hit block was
    free: a count of 0 outside the free queue)."""

    patch = Patch(BLOCK_POOL, "BlockPool.touch",
                  "            block.ref_cnt += 1\n",
                  "")
    clause, invariant_class = "BLOCK-2", "ownership"
    exposed_by = Run(page_size=2, window=5, interval=1)


class WINDOW_RELEASE_WITHOUT_FREE(VllmMutant, slug="window-release-without-free"):
    """The sliding-window release puts the null block in the table entries that left the
    window but never gives their blocks back to the pool: each keeps a reference count
    of 1 that no table holds.

    Bug class: a leak of out-of-window SWA KV (SGLang's out-of-window release that frees
    nothing, its leak on release, in vLLM's shape): the table looks released, the pool
    never gets the blocks back and fills up. Caught at the first allocation that
    releases a block (BLOCK-2: a count with no table entry behind it)."""

    patch = Patch(MANAGERS, "SingleTypeKVCacheManager._remove_blocks_in_range",
                  "        if freed:\n"
                  "            self.block_pool.free_blocks(freed)\n",
                  "")
    clause, invariant_class = "BLOCK-2", "ownership"
    exposed_by = Run(page_size=2, window=5, interval=1)


# -- the null block ----------------------------------------------------------------------------


class NULL_BLOCK_IN_FREE_QUEUE(VllmMutant, slug="null-block-in-free-queue"):
    """The pool takes block 0 as its null block without taking it out of the free queue:
    the placeholder that every released sliding-window entry points at is also the first
    block the pool hands out, so a request writes its KV where every released entry
    reads.

    Bug class: the padding/placeholder page in the free list (SGLang's page 0, the
    padding page, in its free list: bug class 4). Caught at the engine's build, before
    the first step: the null block in the free queue (BLOCK-3; BLOCK-1 reports block 0
    there too)."""

    patch = Patch(BLOCK_POOL, "BlockPool.__init__",
                  "        self.null_block = self.free_block_queue.popleft()\n",
                  "        self.null_block = self.blocks[0]\n")
    clause, invariant_class = "BLOCK-3", "ownership"
    exposed_by = Run(page_size=4, window=6, interval=4)


class NULL_BLOCK_FREED(VllmMutant, slug="null-block-freed"):
    """The pool's null block is not marked as one (`is_null`), so the code that must skip
    it treats it as a real block: a release keeps the leading null entries of a
    sliding-window table (`trim_null_head` finds none) and frees the null block once per
    entry, and its reference count, which nothing maintains, drops below 0.

    Bug class: a free of the padding page through the entries that point at it (SGLang's
    free of page 0 through the padding mapping, bug class 4). Caught at the first release
    of a request with released SWA entries (BLOCK-3: the null block's count is not 0)."""

    patch = Patch(BLOCK_POOL, "BlockPool.__init__",
                  "        self.null_block.is_null = True\n",
                  "")
    clause, invariant_class = "BLOCK-3", "ownership"
    exposed_by = Run(page_size=2, window=5, interval=1)


# -- block tables ------------------------------------------------------------------------------


class TABLE_ONE_BLOCK_SHORT(VllmMutant, slug="table-one-block-short"):
    """An allocation sizes the request's tables with floor division instead of a ceiling:
    the block for the last, partly filled block's worth of its tokens is not allocated,
    so those tokens' KV has no slot (the kernel would write past the table).

    Bug class: a page-count mismatch, floor where a ceiling is due (docs/engines/sglang.md,
    bug class 7; every `cdiv` of vLLM's block math). Caught at the first allocation whose
    slot count is not a multiple of the block size (BLOCK-4: a table one entry short of
    `cdiv(N, block_size)`; I7 sees the row short of kv_allocated_len too). Invisible at
    block size 1: engine P=1 W=3 I=4 passes."""

    patch = Patch(MANAGERS, "SingleTypeKVCacheManager.allocate_new_blocks",
                  "        num_required_blocks = cdiv(num_tokens, self.block_size)\n",
                  "        num_required_blocks = num_tokens // self.block_size\n")
    clause, invariant_class = "BLOCK-4", "alignment"
    exposed_by = Run(page_size=4, window=6, interval=4)


class FREE_FORGETS_A_GROUP(VllmMutant, slug="free-forgets-a-group"):
    """Releasing a request (finish, abort, preemption) frees its blocks in the first layer
    group only, full attention: the sliding-window group keeps the request's table and
    blocks after it is gone.

    Bug class: a hybrid model's release that walks one of its groups or pools (SGLang's
    full-side free without the SWA side). Caught at the release (BLOCK-4: a request that
    holds no KV has a table). Run on, admitting a preempted request again with a prefix
    hit trips vLLM's `assert len(new_computed_blocks) == 0` in
    `get_num_blocks_to_allocate`: the group still takes the request for a running one."""

    patch = Patch(COORDINATOR, "KVCacheCoordinator.free",
                  "        for manager in self.single_type_managers:\n"
                  "            manager.free(request_id)\n",
                  "        for manager in self.single_type_managers[:1]:\n"
                  "            manager.free(request_id)\n")
    clause, invariant_class = "BLOCK-4", "alignment"
    exposed_by = Run(page_size=4, window=6, interval=4)


# -- the window ----------------------------------------------------------------------------------


class WINDOW_ONE_TOKEN_EARLY(VllmMutant, slug="window-one-token-early"):
    """The sliding window is one token short: `get_num_skipped_tokens` skips
    `p - sliding_window + 2` tokens instead of `+ 1`, so whenever `p - W + 1` is a
    multiple of the block size, the block that holds position `p - W`, which the next
    token still reads, is released.

    Bug class: an off-by-one between window conventions (vLLM's `sliding_window` counts
    the current token, a model's window often does not), the release of the window's
    first token (SGLang's decode frontier one token late, bug class 9). Caught at the
    first allocation with `(p - W + 1) % P == 0` (BLOCK-5: a released block the window
    reads)."""

    patch = Patch(MANAGERS, "SlidingWindowManager.get_num_skipped_tokens",
                  "            num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens,\n",
                  "            num_computed_tokens - self.sliding_window + 2 - self.extra_retained_tokens,\n")
    clause, invariant_class = "BLOCK-5", "window-liveness"
    exposed_by = Run(page_size=2, window=5, interval=1)


class NO_WINDOW_RELEASE(VllmMutant, slug="no-window-release"):
    """`remove_skipped_blocks` works out which blocks left the window and releases none:
    a request keeps every sliding-window block it was given, so a long prompt or a long
    decode holds a whole sequence of SWA KV instead of a window.

    Bug class: the missing out-of-window release (SGLang's bug class 1, and its decode
    eviction that never fires). vLLM's admission cap (`max_admission_blocks_per_request`)
    assumes this release; vLLM's comment there ties such drift to issue #39734's
    deadlock or an OOM mid-prefill. Caught at the first allocation past the window
    (BLOCK-6: fewer null entries than due). A prefix hit still pads its skipped blocks
    with the null block."""

    patch = Patch(MANAGERS, "SingleTypeKVCacheManager.remove_skipped_blocks",
                  "        self._remove_blocks_in_range(request_id, 0, num_skipped_blocks)\n",
                  "        pass\n")
    clause, invariant_class = "BLOCK-6", "window-bound"
    exposed_by = Run(page_size=2, window=5, interval=1)


# -- the prefix-cache map and its events -----------------------------------------------------------


class EVICTED_KEY_STAYS_MAPPED(VllmMutant, slug="evicted-key-stays-mapped"):
    """Evicting a block from the prefix cache (when the pool hands a cached free block out
    again, or on an explicit eviction) clears the block's own key and publishes its
    removal, but leaves the map's entry: the map names a block that no longer carries
    that key, and a later prefix hit on the key gets whatever the block holds now.

    Bug class: a stale prefix-cache entry, a hit that returns overwritten KV: silently
    wrong output, no crash. Caught at the first eviction (BLOCK-7: an entry whose block
    has no key; BLOCK-8 too: the events removed the key, the map still has it)."""

    patch = Patch(BLOCK_POOL, "BlockPool._maybe_evict_cached_block",
                  "        evicted_hashes = self._remove_cached_block_hashes(block)\n",
                  "        evicted_hashes = [block.block_hash] if block.block_hash is not None else []\n"
                  "        block.reset_hash()\n")
    clause, invariant_class = "BLOCK-7", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


class NO_REMOVED_EVENT(VllmMutant, slug="no-removed-event"):
    """Evicting a block from the prefix cache (when the pool reuses it, or on an explicit
    eviction) publishes no BlockRemoved event: the map drops the key, the consumers of
    vLLM's KV events keep it.

    Bug class: a lost KV event. A KV-aware router or a remote cache index fed by the
    events believes the block is still cached on this instance, and routes requests for
    that prefix to an instance that has to compute it again. Caught at the first
    eviction (BLOCK-8: replaying the events gives a key the map does not have)."""

    patch = Patch(BLOCK_POOL, "BlockPool._maybe_evict_cached_block",
                  "        self._emit_block_removed_events(evicted_hashes)\n",
                  "")
    clause, invariant_class = "BLOCK-8", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


# -- prefix hits and the eviction order ----------------------------------------------------------


class HIT_COVERS_THE_LAST_TOKEN(VllmMutant, slug="hit-covers-the-last-token", base=VLLM_DENSE):
    """The prefix lookup is capped at `num_tokens`, not `num_tokens - 1`: a prompt cached to
    its last token hits whole, and the request has no token left to compute for the logits
    of its first output (vLLM's own NOTE in `get_computed_blocks`). Caught at the admission
    of a block-aligned prompt cached whole: a hit as long as the request (BLOCK-9); run on,
    the next `allocate_slots` with no new token raises vLLM's ValueError."""

    patch = Patch("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks",
                  "            max_cache_hit_length = request.num_tokens - 1\n",
                  "            max_cache_hit_length = request.num_tokens\n")
    clause, invariant_class = "BLOCK-9", "mapping"
    exposed_by = Run(page_size=1, window=3, interval=4)


class RELEASE_HEAD_FIRST(VllmMutant, slug="release-head-first"):
    """`free(request)` hands a group's blocks to the pool in table order, not reversed: the
    block of the request's shortest prefix goes to the free queue first and is evicted
    first, which makes every longer cached prefix of the request unreachable with it (a
    chained key is useless without the blocks before it). Caught at the release of two or
    more cached blocks (BLOCK-10: not in release order)."""

    patch = Patch(MANAGERS, "SingleTypeKVCacheManager.free",
                  "        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))\n",
                  "        self.block_pool.free_blocks(self.pop_blocks_for_free(request_id))\n")
    clause, invariant_class = "BLOCK-10", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


# -- recurrent state (STATE-10 .. STATE-14) ----------------------------------------------------


# -- group layouts -----------------------------------------------------------------------------


class EVERY_GROUP_OF_THE_FIRST_SPEC(VllmMutant, slug="every-group-of-the-first-spec"):
    """The coordinator builds every group's manager from the first group's spec: a model of
    one full-attention and one sliding-window group gets two full-attention managers, and
    its sliding-window layers keep every block of the sequence.

    Bug class: a uniform-spec assumption surviving in a hybrid path (vLLM's manager was
    written for one attention type per model before its hybrid coordinator; SGLang's
    hybrid pools likewise grew out of one). Caught at the engine's build, before the
    first step: the engine's groups are not the layout it was built with (BLOCK-11)."""

    patch = Patch(COORDINATOR, "KVCacheCoordinator.__init__",
                  "                kv_cache_spec=kv_cache_group.kv_cache_spec,\n",
                  "                kv_cache_spec=self.kv_cache_config.kv_cache_groups[0].kv_cache_spec,\n")
    clause, invariant_class = "BLOCK-11", "mapping"
    exposed_by = Run(page_size=4, window=6, interval=4)


class RETIRED_STATE_NOT_FREED(VllmMutant, slug="retired-state-not-freed", base=VLLM_DENSE):
    """In align mode `MambaManager._remove_blocks_in_range` retires the state blocks a
    request no longer needs (a hit's state, a checkpoint it cached on the way) by
    putting the null block in their entries and giving them back to the pool. Here it
    nulls the entries but never frees the blocks: each keeps a reference that no table
    holds, and never returns to the free queue.

    Bug class: a state block leaked by the retirement of a running request's old states
    (as SGLang's #16067, a state slot leaked on a path that drops it): the pool shrinks
    by one block per retired state. Caught at the step that retires one: a state block
    whose reference count no state-table entry accounts for (STATE-13)."""

    patch = Patch(MANAGERS, "MambaManager._remove_blocks_in_range",
                  "        if freed:\n"
                  "            self.block_pool.free_blocks(freed)\n",
                  "")
    clause, invariant_class = "STATE-13", "ownership"
    exposed_by = Run(page_size=1, window=3, interval=4, state_grid=1)


class STATE_HIT_NOT_THE_MINIMUM(VllmMutant, slug="state-hit-not-the-minimum", base=VLLM_DENSE):
    """`HybridKVCacheCoordinator.find_longest_cache_hit` takes the hit of several groups
    as the minimum over them: each group's finder may shorten the candidate, and the
    shorter length is what the next group is asked for. Here a shorter (non-zero) hit of
    the Mamba group is ignored: the request is admitted with the attention groups' hit
    while its state table ends at a state cached for fewer tokens.

    Bug class: a hybrid hit that is not the minimum over its components (chapter 09's
    STATE-5 for the two-pool model): the request's state has not read the prefix it is
    said to have computed. Caught at the admission that hits: the entries past the
    Mamba group's own hit get a fresh block, which vLLM keys at once as the state of the
    whole hit, so the request runs on (and the cache holds, under that key) a state
    that has read nothing (STATE-11). STATE-12 does not see it: the fresh block is
    cached for exactly the hit."""

    patch = Patch(COORDINATOR, "HybridKVCacheCoordinator.find_longest_cache_hit",
                  "                curr_hit_length = _new_hit_length\n",
                  "                if not (isinstance(spec, MambaSpec) and _new_hit_length):\n"
                  "                    curr_hit_length = _new_hit_length\n")
    clause, invariant_class = "STATE-11", "state"
    exposed_by = Run(page_size=1, window=3, interval=4, state_grid=1)

