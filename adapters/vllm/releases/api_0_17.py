"""vLLM 0.17.0 - 0.19.1: KV events that name no group.

`BlockStored` and `BlockRemoved` carry the blocks' hashes but not their group (0.19.1
`distributed/kv_events.py:49-66`; 0.20.0 adds `group_idx`, `:70`), and a full-attention
and a sliding-window block of the same prefix carry the same hash: replaying the events
cannot give the cache map group by group. These members do not show the `kv_events`
observable, so BLOCK-8 is reported skipped on them, never passed (docs/engines/
vllm-releases.md); the events are still taken, as a consumer would. Everything else as
0.20.0's shim (api_0_20.py).
"""

from .api_0_20 import Engine_0_20


class Engine_0_17(Engine_0_20):
    def replay_events(self) -> None:
        self.new_events()
