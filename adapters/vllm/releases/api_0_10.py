"""vLLM 0.10.2: attention specs name whether the layer is MLA.

`FullAttentionSpec` and `SlidingWindowSpec` take `use_mla` without a default (0.10.2
`v1/kv_cache_interface.py`; 0.11.0 drops it): False, as for a model without multi-head
latent attention. Everything else as 0.11.0's shim (api_0_11.py).
"""

from .api_0_11 import Engine_0_11


class Engine_0_10(Engine_0_11):
    LAYER = {"use_mla": False}
