"""vLLM 0.10.1 - 0.10.1.1: prefix-cache keys are named tuples, and a request names its
multimodal inputs.

A key is `BlockHashWithGroupId(block_hash, group_id)` around `BlockHash(hash_value,
token_ids, extra_keys)` (0.10.1.1 `v1/core/kv_cache_utils.py:24-49`; 0.10.2 makes both
`bytes`): adapters/vllm/runtime.py reads them with `named_key_readers`, the chained hash
being `hash_value` (an int: `sha256` returns one before 0.10.2). `Request` takes the
multimodal kwargs, hashes and placeholders before its sampling parameters (`v1/request.py:25-43`):
none here. Everything else as 0.10.2's shim (api_0_10.py).
"""

from .api_0_10 import Engine_0_10


class Engine_0_10_1(Engine_0_10):
    def new_request(self, rid: str, prompt: list[int]):
        return self.v.Request(rid, list(prompt), None, None, None, self.sampling.clone(), None, None,
                              block_hasher=self.hasher)
