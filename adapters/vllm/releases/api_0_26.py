"""vLLM 0.26.0 - 0.28.0 (and 0.24.0 - 0.25.1, through api_0_23.py): prefix-cache retention
from the environment.

`KVCacheConfig` has no `prefix_cache_retention_interval` yet (0.29.0 adds it): the
coordinator reads `VLLM_PREFIX_CACHE_RETENTION_INTERVAL` when it is built (0.24.0
`kv_cache_coordinator.py:125`, `envs.py:1056-1060`), unset by default, which is dense
retention (None: every whole sliding-window block cached); 0.29.0 made 0 the engine's
default (`config/cache.py:60-66`). The variable is set for the coordinator's construction
only. Admission adopts a hit as 0.29.0's shim does (api_0_29.py).
"""

import os

from .api_0_29 import Engine_0_29

RETENTION = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"


class Engine_0_26(Engine_0_29):
    def build_manager(self, groups: list, retention: int | None, scheduler_bs: int):
        v = self.v
        before = os.environ.pop(RETENTION, None)
        if retention is not None:
            os.environ[RETENTION] = str(retention)
        try:
            return v.KVCacheManager(
                v.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups),
                max_model_len=self.config.size_full, scheduler_block_size=scheduler_bs, hash_block_size=self.bs,
                enable_caching=True, enable_kv_cache_events=True)
        finally:
            os.environ.pop(RETENTION, None)
            if before is not None:
                os.environ[RETENTION] = before
