"""vLLM 0.9.2: a free queue without sentinels, and hashes seeded at import.

`FreeKVCacheBlockQueue` links the free blocks between `free_list_head` and `free_list_tail`,
real blocks or None (0.9.2 `v1/core/kv_cache_utils.py:200-210`; 0.10.0 adds the sentinel
blocks `fake_free_list_head` and `_tail`): the adapter's eviction walks back from the real
tail, and since the first free block has no predecessor either, a block's `prev_free_block`
does not say whether it is free, which the partial view reads (OBS-4): every view of 0.9.2 is
whole. `NONE_HASH`, the chained hashes' seed, is set when `kv_cache_utils` is imported (no
`init_none_hash`: adapters/vllm/runtime.py). Importing 0.9.2 registers a transformers
configuration that today's transformers already has (environment.activate). Everything else as
0.10.0's shim (api_0_10_0.py).
"""

from .api_0_10_0 import Engine_0_10_0


class Engine_0_9(Engine_0_10_0):
    def last_free_block(self):
        return self.pool.free_block_queue.free_list_tail

    def partial_snapshot(self):
        return self.snapshot()
