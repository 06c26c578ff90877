"""SGLang 0.5.14, 0.5.15 and 0.5.15.post1: as 0.5.16 (api_0_5_16.py) but for what follows,
and the legacy tree. Lines are of the 0.5.14 wheel's `sglang/srt/` unless 0.5.15 is named.

* Trees: `legacy` is `SWARadixCache(params)`, the registry's default for a hybrid SWA
  model (`mem_cache/registry.py:114-117`, 0.5.15 `:119-126`), walked by legacy_tree.py;
  `python` is `UnifiedRadixCache`, which the registry builds only with
  `SGLANG_ENABLE_UNIFIED_RADIX_TREE=1` (`:98-99`, `:142-166`), set here for it.
* KV fields all on the `Req`: `req_pool_idx`, `cache_protected_len`, `kv_allocated_len`,
  `kv_committed_len`, `swa_evicted_seqlen` (`managers/schedule_batch.py:737-750, 865-869`);
  no `req.kv`. The scheduler sets both lengths after each allocation (`prepare_for_extend`,
  `:2067-2068`; `prepare_for_decode`, `:2640-2641`); 0.5.16's `alloc_for_decode` does the
  allocated one itself (0.5.16 `mem_cache/allocation.py:591`).
* Extend range (0.5.14 only): `set_extend_input_len(n)` and `req.fill_len`
  (`managers/schedule_policy.py:723-724`); 0.5.15 already has `set_extend_range`
  (0.5.15 `managers/schedule_batch.py:1101`), which the newer shims drive.
* Allocation paths in `mem_cache/common.py` (`alloc_for_extend` `:442`, `alloc_for_decode`
  `:574`; runtime.SYMBOLS finds them); the eviction before an extend is the one they make,
  `evict_from_tree_cache` (`:298-318`): no `evict_to_free_tokens` yet.
* As 0.5.16 (inherited): the lock (`req.swa_uuid_for_lock`, `managers/schedule_policy.py:669-672`),
  the checkpoint (`maybe_cache_unfinished_req(req, tree, chunked=...)`, `managers/scheduler.py:2464-2465`,
  `managers/scheduler_components/batch_result_processor.py:242`), finish / abort
  (`release_kv_cache(req, tree, is_insert=...)`, `mem_cache/common.py:629`), the decode gate
  (`batch.check_decode_mem()`, `managers/schedule_batch.py:2441-2444`) and its batch-counting
  cadence (`:2863`).
* `SWAKVPool` requires `enable_kvcache_transpose` in 0.5.14 (`mem_cache/swa_memory_pool.py:32`,
  asserted off at `:56`): allocator.build_allocator passes it where the signature has it.
"""



from ..view import KvFields
from .api_0_5_16 import Engine_0_5_16
from .api_0_5_19 import add_free_page_census
from .legacy_tree import legacy_tree_view


class Engine_0_5_14(Engine_0_5_16):
    """SGLang 0.5.14, 0.5.15, 0.5.15.post1."""

    def __init__(self, config, tree: str = "legacy", environment: dict[str, str] | None = None, **kwargs):
        if tree == "python":  # what the registry reads to build the unified tree
            environment = {**(environment or {}), "SGLANG_ENABLE_UNIFIED_RADIX_TREE": "1"}
        super().__init__(config, tree=tree, environment=environment, **kwargs)

    def make_cache(self):
        if self.tree_core != "legacy":
            return super().make_cache()  # UnifiedRadixCache(CacheInitParams(..., tree_components)) as in 0.5.19
        add_free_page_census(self.allocator)
        s = self.s
        return s.SWARadixCache(params=s.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.P, sliding_window_size=self.config.window, eviction_policy=self.eviction_policy))

    def kv(self, req) -> KvFields:
        return KvFields(req.req_pool_idx is not None, req.req_pool_idx, req.cache_protected_len,
                        req.swa_evicted_seqlen, req.kv_allocated_len, req.kv_committed_len)

    def start_extend(self, req, chunk_len: int) -> tuple[int, int, int]:
        if hasattr(req, "set_extend_range"):  # 0.5.15
            return super().start_extend(req, chunk_len)
        req._refresh_fill_ids()
        prefix_len, fill_len = len(req.prefix_indices), len(req.full_untruncated_fill_ids)
        req.set_extend_input_len(min(chunk_len, fill_len - prefix_len))
        req.fill_len = prefix_len + req.extend_input_len
        return prefix_len, req.fill_len, fill_len

    def extended(self, req, extend_end: int) -> None:
        super().extended(req, extend_end)
        req.kv_allocated_len = extend_end

    def checkpoint(self, req) -> None:
        if hasattr(req, "set_extend_range"):  # 0.5.15
            return super().checkpoint(req)
        chunked = req.fill_len < len(req.full_untruncated_fill_ids)
        self.s.common.maybe_cache_unfinished_req(req, self.cache, chunked=chunked)

    def decode(self, rid: str, next_token: int = 0):
        outcome = super().decode(rid, next_token)
        if outcome is None:  # the rest of prepare_for_decode's bookkeeping
            self.requests[rid].kv_allocated_len += 1
        return outcome

    def walk_tree(self):
        if self.tree_core == "legacy":
            return legacy_tree_view(self.cache, self.allocator)
        return super().walk_tree()
