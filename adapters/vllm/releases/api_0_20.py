"""vLLM 0.20.0 - 0.22.1: one block size for the scheduler and the hash.

`KVCacheManager` takes no `scheduler_block_size` (0.23.0 adds it, for groups whose block
sizes differ); every group here has the page size. Everything else as 0.23.0's shim
(api_0_23.py).
"""

from .api_0_23 import Engine_0_23


class Engine_0_20(Engine_0_23):
    def build_manager(self, groups: list, retention: int | None, scheduler_bs: int):
        v = self.v
        return v.KVCacheManager(
            v.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups),
            max_model_len=self.config.size_full, hash_block_size=self.bs, enable_caching=True,
            enable_kv_cache_events=True)
