"""vLLM 0.11.0 - 0.11.2: one block size for the manager and its hashes.

`KVCacheManager` takes no `hash_block_size` (0.12.0 adds it, for groups whose block sizes
differ): every group here has the page size, which is the hash's block size. Everything
else as 0.12.0's shim (api_0_12.py).
"""

from .api_0_12 import Engine_0_12


class Engine_0_11(Engine_0_12):
    def block_sizes(self, scheduler_bs: int) -> dict[str, int]:
        return {}
