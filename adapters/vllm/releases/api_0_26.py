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
        before = os.environ.pop(RETENTION, None)
        if retention is not None:
            os.environ[RETENTION] = str(retention)
        try:
            return super().build_manager(groups, retention, scheduler_bs)
        finally:
            os.environ.pop(RETENTION, None)
            if before is not None:
                os.environ[RETENTION] = before

    def cache_config(self, groups: list, retention: int | None):
        return self.v.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
