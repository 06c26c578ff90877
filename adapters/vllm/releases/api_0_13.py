"""vLLM 0.13.0 - 0.16.0: a request names its end-of-sequence token.

`Request` takes `eos_token_id` as a positional argument after `pooling_params` (0.16.0
`v1/request.py`; 0.17.0 drops it, reading it from the sampling parameters): None here,
where the engine tier decides when a request finishes. Everything else as 0.17.0's shim
(api_0_17.py).
"""

from .api_0_17 import Engine_0_17


class Engine_0_13(Engine_0_17):
    def new_request(self, rid: str, prompt: list[int]):
        return self.v.Request(rid, list(prompt), self.sampling.clone(), None, None, block_hasher=self.hasher)
