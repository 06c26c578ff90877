"""SGLang 0.5.21: the engine of adapters/sglang/engine.py with the request API of
before 0.5.22's TreeLock and `checkpoint`. Lines are of the 0.5.21 wheel's `sglang/srt/`.

* Lock: `req.lock_receipt = tree.inc_lock_ref(req.last_node).to_dec_params()`
  (`managers/schedule_policy.py:1025-1027`); a request's lock goes back with
  `tree.unpin(req)` (`mem_cache/unified_radix_cache.py:961-964`), the node it holds is
  `req.lock_receipt.node_id` (`mem_cache/base_prefix_cache.py:212-221`).
* No `prefix_len` / `extend_end` / `refresh_fill_ids`: the extend range is
  `req.set_extend_range(len(req.prefix_indices), ...)` after `_refresh_fill_ids()`
  (`managers/schedule_policy.py:1090`, `managers/schedule_batch.py:1555-1579`), and the
  matched prefix is `req.prefix_indices` (no `prefix_device_indices`).
* Checkpoint: `maybe_cache_unfinished_req(req, tree, chunked=True)` for a chunk
  (`managers/scheduler.py:3531-3535`), without `chunked` after the last one
  (`managers/scheduler_components/batch_result_processor.py:383`).
* Finish / abort: `release_kv_cache(req, tree, is_insert=...)` (`mem_cache/common.py:292`;
  it calls `insert_req(req, up_to=owned_kv_len)`, `:316`).
* Paged kernels: see `use_cpu_kernels`, which the older releases' shims inherit.
"""

from .. import pd_decode
from ..engine import SglangEngine
from ..runtime import sglang


class CpuLaunch:
    """`kernel[grid](*args)` for a plain function: what the paged allocator launches."""

    def __init__(self, function):
        self.function = function

    def __getitem__(self, grid):
        return self.function


def pool_short(free_pages, needed) -> bool:
    """The Triton kernels read past `free_pages` when the pool is short and the
    allocator returns None after them (`0.5.21 paged.py:206-227, 247-266`); the torch
    code would raise instead, so it is not run then (its output is dropped anyway)."""
    return int(needed) > free_pages.numel()


def use_cpu_kernels(s) -> None:
    """Up to 0.5.21 the paged allocator always launches its Triton kernels
    (`alloc_extend_kernel`, `alloc_decode_kernel`; `0.5.21 mem_cache/allocator/paged.py:206, 247`,
    `0.5.14 :170, 211`), which need a GPU; from 0.5.22 it runs its own torch code on CPU
    (`0.5.22 paged.py:246-256, 304-313`). On CPU, replace the two launches with that torch
    code: the release's own `alloc_extend_naive` (every release has one) and, for decode,
    0.5.22's `alloc_decode_naive` (older releases have none), restated here. Installed
    once per process, before the first allocation."""
    paged, torch = s.paged, s.torch
    if hasattr(paged, "alloc_decode_naive") or isinstance(getattr(paged, "alloc_extend_kernel", None), CpuLaunch):
        return

    def extend(prefix_lens, seq_lens, last_loc, free_pages, out_indices, _block, page_size):
        new_pages = ((seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size).sum()
        if not pool_short(free_pages, new_pages):
            paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, "cpu")

    def decode(seq_lens, last_loc, free_pages, out_indices, _block, page_size):  # 0.5.22 paged.py:117-132
        need_new_page = ((seq_lens - 1) % page_size == 0).to(torch.int64)
        num_new_pages = int(need_new_page.sum())
        if num_new_pages == 0:
            out_indices.copy_(last_loc + 1)
        elif not pool_short(free_pages, num_new_pages):
            rank = (torch.cumsum(need_new_page, 0) - need_new_page).clamp_(max=num_new_pages - 1)
            out_indices.copy_(torch.where(need_new_page.bool(), free_pages[rank] * page_size, last_loc + 1))

    paged.alloc_extend_kernel, paged.alloc_decode_kernel = CpuLaunch(extend), CpuLaunch(decode)


class Engine_0_5_21(SglangEngine):
    """SGLang 0.5.21."""

    def __init__(self, *args, **kwargs):
        use_cpu_kernels(sglang())
        super().__init__(*args, **kwargs)

    def lock(self, req) -> None:
        req.lock_receipt = self.cache.inc_lock_ref(req.last_node).to_dec_params()

    def unlock(self, req) -> None:
        self.cache.unpin(req)

    def lock_node(self, req) -> int | None:
        return req.lock_receipt.node_id

    def matched_prefix(self, req):
        return req.prefix_indices

    def start_extend(self, req, chunk_len: int) -> tuple[int, int, int]:
        req._refresh_fill_ids()
        prefix_len, fill_len = len(req.prefix_indices), len(req.full_untruncated_fill_ids)
        req.set_extend_range(prefix_len, min(prefix_len + chunk_len, fill_len))
        return prefix_len, req.extend_range.end, fill_len

    def checkpoint(self, req) -> None:
        chunked = req.extend_range.end < len(req.full_untruncated_fill_ids)
        self.s.common.maybe_cache_unfinished_req(req, self.cache, chunked=chunked)

    def release_kv(self, req, checkpoint: bool) -> None:
        self.s.release_kv_cache(req, self.cache, is_insert=checkpoint)

    def pd_match(self, queue, req) -> pd_decode.PdMatch:
        """Up to 0.5.21 the match is capped clear of the SWA tail by `pop_preallocated`
        itself, and the prefix's SWA lock goes back with `dec_swa_lock_only`, marked on the
        request (`disaggregation/decode.py:1418-1441`)."""
        match = queue._match_prefix_and_lock(req)
        prefix_indices, prefix_len, total_prefix_len = match.prefix_indices, match.l1_prefix_len, match.decode_prefix_len
        fill_len = queue._pre_alloc_fill_len(req)
        uses_swa_tail = queue._uses_swa_tail_prealloc()
        if uses_swa_tail and prefix_len > 0:
            cap = fill_len - queue._swa_tail_len(fill_len)
            if prefix_len > cap:
                prefix_len = total_prefix_len = cap
                prefix_indices = prefix_indices[:cap]
        if uses_swa_tail and match.l1_prefix_len > 0 and hasattr(self.cache, "dec_swa_lock_only"):
            self.cache.dec_swa_lock_only(req.last_node, self.swa_lock_receipt(req))
            req.swa_prefix_lock_released = True
        return pd_decode.PdMatch(prefix_indices, prefix_len, total_prefix_len, fill_len, match.l1_prefix_len > 0)

    def swa_lock_receipt(self, req):
        return req.lock_receipt

    def pd_refused(self, queue, req, match: pd_decode.PdMatch):
        """The matched prefix's lock goes back, less its SWA part if that went already
        (`_release_matched_prefix_lock`, `disaggregation/decode.py:509`)."""
        if match.locked:
            queue._release_matched_prefix_lock(req)
        return self.out_of_memory()
