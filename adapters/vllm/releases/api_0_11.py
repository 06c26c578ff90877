"""vLLM 0.11.0 - 0.11.2: one block size for the manager and its hashes.

`KVCacheManager` takes no `hash_block_size` (0.12.0 adds it, for groups whose block sizes
differ): every group here has the page size, which is the hash's block size. Everything
else as 0.12.0's shim (api_0_12.py).
"""

from .api_0_12 import Engine_0_12


class Engine_0_11(Engine_0_12):
    def build_manager(self, groups: list, retention: int | None, scheduler_bs: int):
        v = self.v
        return v.KVCacheManager(
            v.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups),
            max_model_len=self.config.size_full, enable_caching=True, enable_kv_cache_events=True)
