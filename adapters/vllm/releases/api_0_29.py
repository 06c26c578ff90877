"""vLLM 0.29.0 - 0.30.0: an allocation must compute a token.

Their `KVCacheManager.allocate_slots` raises ValueError for a call with no new token and
no externally computed one (0.30.0 `kv_cache_manager.py:466-471`); 0.31.0 also lets a call
adopt computed tokens alone (`:471-478`), which is how kvspec's adapter takes a prefix
hit at admission. Their scheduler adopts a hit in the allocation of the request's first
chunk; here admission adopts it with the first token of the rest of the prompt, one slot
ahead of what it computed (its slots are the hit plus one until its first chunk), as
that allocation would. A prompt always has a token past its hit (the hit leaves at least
one to compute).
"""

from ..engine import VllmEngine


class Engine_0_29(VllmEngine):
    def adopt_hit(self, rid: str, req, hit: int, hit_blocks) -> bool:
        return self.allocate(rid, req, 1, hit, hit_blocks)
