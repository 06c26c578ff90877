"""The `chunk` tree of the `sglang@` family: SGLang with its radix cache disabled
(`--disable-radix-cache`) on a hybrid SWA model, where no prefix is shared between requests
and each request owns every position of its row (spec policy `no-prefix-sharing`, WIN-1).

What the registry builds for it (`mem_cache/registry.py`):

* 0.5.14 - 0.5.21: `SWAChunkCache(params)` (0.5.14 `:82-89`, 0.5.18 `:91-102`, 0.5.21
  `:90-101`). Its match is empty (0.5.18 `mem_cache/chunk_cache.py:67-73`), its insert a
  no-op (`:75-77`), its eviction frees nothing (`:138-139`), its locks count nothing
  (`:99-105`). `cache_unfinished_req` only hands the request its own row back as the next
  chunk's prefix (`:89-94`); `cache_finished_req` frees the row from `cache_protected_len`
  to the committed length (`:79-87`; 0.5.14 - 0.5.15.post1 from 0, 0.5.14 `:79-85`;
  0.5.19 - 0.5.20 through `free_kv_row`; 0.5.21 has
  `insert_req` a no-op and `release_kv_cache` frees the row, 0.5.21 `common.py:314-319`).
* 0.5.22 - 0.5.23: `chunk_cache.py` is gone; the registry builds the unified tree disabled,
  `create_unified_radix_cache(ctx)` with `CacheInitParams(disable=True)` (0.5.22
  `registry.py:91-99`, `kv_cache_builder.py:291-332`): every match, insert, lock and
  eviction returns before the tree core (0.5.22 `unified_radix_cache.py:587, 619, 748, 996,
  1006, 1088`), so the core holds its root alone. The core is the Python one here, which
  can be walked; SGLang's default (Rust, 0.5.22 `environ.py:688`) is reached the same
  way, for the root's id and the ledgers only.

The scheduler's side is what the release engines already drive (engine.py's table): the
SWA that slid out of the window is freed before each extend's allocation, in
`alloc_for_extend` -> `ScheduleBatch.maybe_evict_swa` (0.5.18 `mem_cache/allocation.py:292`,
`managers/schedule_batch.py:3370-3384`: `is_chunk_cache()`; 0.5.22 `:3936-3953`: `not
supports_prefix_sharing()`), with `pre_len` the extend's prefix length, and
`free_swa_out_of_window_slots` keeps `W` (0.5.14 `drop_page_margin=is_chunk_cache()`,
`schedule_batch.py:2916`, `common.py:90-91`; 0.5.15 - 0.5.21 `is_chunk_cache`, 0.5.18
`common.py:75-78`; 0.5.22 - 0.5.23 `supports_prefix_sharing=False`, 0.5.23 `common.py:108-111`).

What the adapter shows: the requests' rows and the pools as for every member; the tree
as what the cache holds, which is nothing: no nodes for `SWAChunkCache` (it has no tree),
the root alone for the disabled unified tree, and the ledgers the cache reports.
"""

from kvspec.spec.snapshot import Ledgers

from .api_0_5_19 import add_free_page_census

TREE = "chunk"


class SwaChunkCacheEngine:
    """0.5.14 - 0.5.21: the release's engine (releases/api_*.py) with `SWAChunkCache`. Put
    before the release engine in the bases; every call not below is the release's own."""

    def make_cache(self):
        add_free_page_census(self.allocator)  # what the view reads of each pool, before 0.5.20
        return self.s.SWAChunkCache(self.s.CacheInitParams(
            disable=True, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.P, sliding_window_size=self.config.window))

    def unlock(self, req) -> None:
        """An admitted request dropped before its first extend gives back the lock its
        admission took (`inc_lock_ref(req.last_node)`, a no-op: `chunk_cache.py:99-105`): the
        cache's own `dec_lock_ref`. (The unified tree's `_dec_req_lock` of 0.5.17 - 0.5.20 is
        not the chunk cache's; its release never unlocks.)"""
        self.cache.dec_lock_ref(req.last_node)

    def walk_tree(self):
        """No tree: no nodes; the ledgers the cache reports (BasePrefixCache's, all 0)."""
        cache = self.cache
        return (), Ledgers(cache.full_evictable_size(), cache.full_protected_size(), cache.swa_evictable_size(),
                           cache.swa_protected_size())


class DisabledTreeEngine:
    """0.5.22 - 0.5.23: engine.py's engine with the unified tree built disabled, as the
    registry builds it for `--disable-radix-cache`. Locks, checkpoints, releases and the
    view are engine.py's: SGLang makes the same calls, and the tree answers them empty."""

    def make_cache(self):
        s = self.s
        return s.UnifiedRadixCache(s.CacheInitParams(
            disable=True, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.P, sliding_window_size=self.config.window, eviction_policy="lru",
            tree_components=(s.ComponentType.FULL, s.ComponentType.SWA), tree_core_backend="python"))


def chunk_engine(release_engine: type, disabled_tree: bool) -> type:
    """The engine of a `chunk` member: the release's engine with the cache its registry
    builds when the radix cache is disabled."""
    mixin = DisabledTreeEngine if disabled_tree else SwaChunkCacheEngine
    return type(f"Chunk{release_engine.__name__}", (mixin, release_engine), {"__module__": __name__})
