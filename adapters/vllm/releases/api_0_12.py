"""vLLM 0.12.0: no eviction by block id.

`BlockPool.evict_blocks` (0.13.0 `v1/core/block_pool.py:400-417`) is the loop of
`_maybe_evict_cached_block` over the blocks named, which these releases have (0.12.0
`:326`) and call only when an allocation reuses a block: the adapter's `evict` calls it as
0.13.0's loop does. `sha256` is in `vllm.utils` before 0.11.1 (adapters/vllm/runtime.py
imports it from there). Everything else as 0.13.0's shim (api_0_13.py). The older
generations build on this one (api_0_11.py, api_0_10.py).
"""

from .api_0_13 import Engine_0_13


class Engine_0_12(Engine_0_13):
    def drop_keys(self, block_ids: set[int]) -> None:
        for block_id in block_ids:
            self.pool._maybe_evict_cached_block(self.pool.blocks[block_id])
