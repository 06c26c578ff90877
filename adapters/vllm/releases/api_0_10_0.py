"""vLLM 0.10.0: the manager hashes a request's blocks itself.

There is no request block hasher (`get_request_block_hasher`, 0.10.1): `KVCacheManager`
hashes a request's tokens at its first `get_computed_blocks` and keeps them per request id
(`req_to_block_hashes`, 0.10.0 `v1/core/kv_cache_manager.py:120`), with the hash function of
its `caching_hash_algo` (the engine's default, Python's `hash`), and its scheduler drops
them when a request finishes, not when it is preempted (`free_block_hashes`,
`v1/core/sched/scheduler.py:1027`), as finish and abort do here. `Request` takes no block
hasher. Everything else as 0.10.1's shim (api_0_10_1.py).
"""

from .api_0_10_1 import Engine_0_10_1


class Engine_0_10_0(Engine_0_10_1):
    def block_hasher(self):
        return None

    def new_request(self, rid: str, prompt: list[int]):
        return self.v.Request(rid, list(prompt), None, None, None, self.sampling.clone(), None, None)

    def finish(self, rid: str, trim: int = 0) -> None:
        req = self.requests.get(rid)
        super().finish(rid, trim)
        self.manager.free_block_hashes(req)

    def abort(self, rid: str) -> None:
        req = self.requests.get(rid)
        super().abort(rid)
        self.manager.free_block_hashes(req)
