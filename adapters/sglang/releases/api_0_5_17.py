"""SGLang 0.5.17 and 0.5.18: as 0.5.19 - 0.5.20 (api_0_5_19.py) but for what follows.
Lines are of the 0.5.17 wheel's `sglang/srt/` unless 0.5.18 is named.

* Request KV fields: `req.kv` is `ReqKvInfo(kv_allocated_len, swa_evicted_seqlen)`, None
  until the first extend and again after the release (`managers/schedule_batch.py:761-768, 850`,
  `mem_cache/common.py:132-134, 175`); `req_pool_idx`, `cache_protected_len` and
  `kv_committed_len` are on the `Req` (`:899, 980, 849`), and nobody but the scheduler
  keeps `kv_committed_len`: `prepare_for_extend` sets it to the extend's end (`:2353`),
  `prepare_for_decode` adds one after `alloc_for_decode` (`:2978-2983`). The release asserts
  it has reached `kv_allocated_len` (`mem_cache/common.py:186-190`).
* Eviction before an extend: no `evict_to_free_tokens` (see `evict_for_extend`).
* Decode gate: no `check_decode_capacity`; the scheduler's is `batch.check_decode_mem()`:
  evict the shortfall, then `available_size() >= num_tokens` (`managers/schedule_batch.py:2727-2732`).
* Decode eviction cadence (0.5.17): `maybe_evict_swa` evicts at batches with
  `(forward_iter or 0) % I == 0` (`managers/schedule_batch.py:3218-3224`); the scheduler counts
  every batch it runs and gives each its count after preparing it (`managers/scheduler.py:3534-3535`),
  so a decode batch is prepared with the count of the batches run before it. This engine runs
  one batch per prefill step (a chunk, or a batch of chunks) and per decode step and
  counts them the same way. 0.5.18 tests tokens instead (`0.5.18 managers/schedule_batch.py:3333-3351`) and ignores the count.
"""

from ..view import KvFields
from .api_0_5_19 import Engine_0_5_19


class Engine_0_5_17(Engine_0_5_19):
    """SGLang 0.5.17, 0.5.18."""

    def __init__(self, *args, **kwargs):
        self.batches_run = 0
        super().__init__(*args, **kwargs)

    def kv(self, req) -> KvFields:
        kv = req.kv
        return KvFields(req.req_pool_idx is not None, req.req_pool_idx, req.cache_protected_len,
                        0 if kv is None else kv.swa_evicted_seqlen, 0 if kv is None else kv.kv_allocated_len,
                        req.kv_committed_len)

    def batch(self, reqs: list, mode: str):
        batch = super().batch(reqs, mode)
        batch.forward_iter = self.batches_run
        return batch

    def extended(self, req, extend_end: int) -> None:
        req.kv_committed_len = extend_end

    def prefill(self, chunks, finishing=frozenset()):
        outcome = super().prefill(chunks, finishing)
        if outcome is None:  # one batch, however many requests it extends
            self.batches_run += 1
        return outcome

    def decode(self, rid: str, next_token: int = 0):
        outcome = super().decode(rid, next_token)
        if outcome is None:
            self.requests[rid].kv_committed_len += 1
            self.batches_run += 1
        return outcome

    def decode_fits(self, batch, req) -> bool:
        return batch.check_decode_mem()

    def evict_for_extend(self, tokens: int) -> None:
        """The eviction `evict_to_free_tokens` does by default from 0.5.19 (`0.5.19
        mem_cache/allocator/base.py:59-67`): 0.5.17 calls `evict_from_tree_cache` itself
        (`mem_cache/allocation.py:151, 208`)."""
        self.s.common.evict_from_tree_cache(self.cache, tokens)
