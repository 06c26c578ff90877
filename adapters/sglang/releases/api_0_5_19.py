"""SGLang 0.5.19 and 0.5.20: as 0.5.21 (api_0_5_21.py) but for what follows. Lines are
of the 0.5.19 wheel's `sglang/srt/` unless 0.5.20 is named.

* Tree core: `CacheInitParams` has no `tree_core_backend`; the core is chosen by
  `SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND` (`environ.py:643`, default "python";
  `mem_cache/unified_cache/tree_core_registry.py:66-79`), set for each engine.
* Cursor: `req.kv.swa_evicted_seqlen` (`managers/schedule_batch.py:862`), no per-component
  `get_evicted_seqlen`.
* Lock: 0.5.20 already keeps `req.lock_receipt` with its `node_id`
  (`0.5.20 managers/schedule_policy.py:1092-1094`, `mem_cache/base_prefix_cache.py:186-195`);
  0.5.19 keeps `req.swa_uuid_for_lock` and clears `req.skip_lock_node_ids`
  (`managers/schedule_policy.py:926-932`), on the node `req.last_node`. Neither has
  `tree.unpin`: the request's lock goes back with `tree._dec_req_lock(req)`, the call
  its finish makes (`mem_cache/unified_radix_cache.py:801-811, 906`).
* Decode gate: 0.5.19's `check_decode_capacity` takes no `requests`
  (`mem_cache/allocator/base.py:69`; `ScheduleBatch.check_decode_mem`,
  `managers/schedule_batch.py:3019-3028`); 0.5.20's takes it and ignores it
  (`0.5.20 mem_cache/allocator/base.py:79-92`).
* Observation: the pools have no `get_all_free_pages` (`all_free_pages` stands in).
* Import: see `tolerate_shipped_configs`, which the older releases' shims inherit.
"""

from functools import partial

from ..runtime import BEFORE_IMPORT, sglang
from ..view import KvFields
from .api_0_5_21 import Engine_0_5_21


def tolerate_shipped_configs() -> None:
    """Up to 0.5.19 SGLang registers its `qwen3_asr` configs with `AutoConfig.register`
    without `exist_ok` (`configs/qwen3_asr.py:167-168`); transformers 5.24 ships that model
    type itself, so the registration raises ValueError and SGLang does not import. 0.5.20
    passes `exist_ok=True` there (`0.5.20 configs/qwen3_asr.py:167-168`): do as it does."""
    from transformers import AutoConfig
    register = AutoConfig.register
    AutoConfig.register = staticmethod(lambda model_type, config, exist_ok=False: register(model_type, config, True))


def add_free_page_census(allocator) -> None:
    """What kvspec observes of each pool: 0.5.20's `get_all_free_pages`, where it is missing."""
    for pool in (allocator.full_attn_allocator, allocator.swa_attn_allocator):
        if not hasattr(pool, "get_all_free_pages"):
            pool.get_all_free_pages = partial(all_free_pages, pool)


def all_free_pages(pool):
    """0.5.19's pools have no `get_all_free_pages` (0.5.20 `mem_cache/allocator/base.py:113-119`,
    restated here): its free list is `free_pages` and the pages freed since the last sort,
    `release_pages` (`mem_cache/allocator/paged.py:308-314`)."""
    if pool.release_pages is None or len(pool.release_pages) == 0:
        return pool.free_pages
    return sglang().torch.cat((pool.free_pages, pool.release_pages))


if tolerate_shipped_configs not in BEFORE_IMPORT:
    BEFORE_IMPORT.append(tolerate_shipped_configs)


class Engine_0_5_19(Engine_0_5_21):
    """SGLang 0.5.19, 0.5.20."""

    def __init__(self, config, tree: str = "python", environment: dict[str, str] | None = None, **kwargs):
        if tree in ("python", "rust"):  # a unified tree's core (not the chunk cache's: it has none)
            environment = {**(environment or {}), "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": tree}
        super().__init__(config, tree=tree, environment=environment, **kwargs)

    def make_cache(self):
        add_free_page_census(self.allocator)
        s = self.s
        return s.UnifiedRadixCache(s.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.P, sliding_window_size=self.config.window, eviction_policy=self.eviction_policy,
            tree_components=(s.ComponentType.FULL, s.ComponentType.SWA)))

    def kv(self, req) -> KvFields:
        kv = req.kv
        return KvFields(kv.holds_kv, kv.req_pool_idx, kv.cache_protected_len, kv.swa_evicted_seqlen,
                        kv.kv_allocated_len, kv.kv_committed_len)

    def lock(self, req) -> None:
        if hasattr(req, "lock_receipt"):  # 0.5.20
            return super().lock(req)
        req.swa_uuid_for_lock = self.cache.inc_lock_ref(req.last_node).swa_uuid_for_lock
        req.skip_lock_node_ids = {}

    def unlock(self, req) -> None:
        self.cache._dec_req_lock(req)

    def lock_node(self, req) -> int | None:
        return req.lock_receipt.node_id if hasattr(req, "lock_receipt") else req.last_node

    def decode_fits(self, batch, req) -> bool:
        return self.allocator.check_decode_capacity(num_tokens=batch.new_tokens_required_next_decode(),
                                                    tree_cache=self.cache)

    def swa_lock_receipt(self, req):
        return req.lock_receipt if hasattr(req, "lock_receipt") else req.swa_uuid_for_lock  # 0.5.19 `:1238-1241`

    def pd_fits(self, queue, req, required: int) -> bool:
        """Before 0.5.21 `pop_preallocated` checks each pool's demand against its budget
        itself (no `_prealloc_reservation_fits`), and reclaims SWA without the full
        length (`disaggregation/decode.py:1276-1330`)."""
        full_budget = queue._allocatable_token_budgets(retractable_tokens=0, count_retracted=True,
                                                       extra_reserved_reqs=0, hicache_reserved_tokens=0)
        if required + queue.num_reserved_decode_tokens > full_budget:
            return False
        if not queue._uses_swa_tail_prealloc():
            return True
        swa_budget = queue._swa_tail_allocatable_token_budget(retractable_tokens=0, retractable_swa_tokens=0,
                                                              count_retracted=True, extra_reserved_reqs=0)
        if queue._prealloc_required_tokens(req)[1] > swa_budget:
            return False
        return queue._reclaim_swa_tail_capacity(queue._prealloc_kv_lens(req)[1], req.rid) is None
