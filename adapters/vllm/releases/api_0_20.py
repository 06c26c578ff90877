"""vLLM 0.20.0 - 0.22.1: one block size for the scheduler and the hash.

`KVCacheManager` takes no `scheduler_block_size` (0.23.0 adds it, for groups whose block
sizes differ); every group here has the page size. Everything else as 0.23.0's shim
(api_0_23.py).
"""

from .api_0_23 import Engine_0_23


class Engine_0_20(Engine_0_23):
    def block_sizes(self, scheduler_bs: int) -> dict[str, int]:
        return {"hash_block_size": self.bs}
