"""swa-cache-parent-null: a bug of vLLM 0.9.2 - 0.13.0 (fixed in 0.14.0), shown with vLLM alone.

    PYTHONPATH=<the folder holding vLLM's vllm/> python swa-cache-parent-null.py

Exit status 0: vLLM cached the request's blocks. An AssertionError raised inside vLLM: the bug.

A hybrid model's KV cache: one full-attention and one sliding-window group (a window of 6
tokens as vLLM counts it, the current one included), blocks of 16 tokens, prefix caching on,
KV cache events on (as a KV-aware router or a KV connector turns them on). One request of 32
tokens is prefilled in two chunks, 29 tokens and then 3, as vLLM's scheduler allocates them.
After the first chunk the sliding-window group gives back its block 0 (tokens 0 - 15, all before
the window) and puts the null block in its place. The second chunk fills block 1; caching it
for the KV event (`BlockPool.cache_full_blocks`) reads the hash of its parent, entry 0 of the
table: the null block, which has none, and `assert parent_block.block_hash is not None` (0.13.0
`v1/core/block_pool.py:274`) fails inside `allocate_slots`, in the engine's scheduler loop.
0.14.0 skips null blocks there and takes the parent's hash from the request's own block hashes.
It fails the same way on every release from 0.10.0 to 0.13.0 (0.9.2, the first with a hybrid
manager, has 0.10.0's lines, but imports only beside the transformers of its time), and it
passes on 0.14.0 and after; 0.10.0 fails with KV events off too (its `cache_full_blocks`
reads the previous block's hash whether or not it publishes an event, `v1/core/block_pool.py:137-138`).

kvspec found it running `vllm@0.13.0` (quick profile, the run `engine P=16 W=5 I=4`), shrunk to
3 steps: vectors/regressions/vllm/swa-cache-parent-null.jsonl; `kvspec bisect` on every member:
0.9.2 - 0.13.0. kvspec's account:
docs/engines/vllm-findings.md#swa-cache-parent-null. Written by hand from that trace, with the
calls kvspec's adapter of vLLM makes for it (adapters/vllm/engine.py); it imports vLLM, torch
and the standard library only.
"""

import inspect

import torch
from vllm import __version__
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request

try:
    from vllm.utils.hashing import sha256
except ModuleNotFoundError:  # before 0.11.1
    from vllm.utils import sha256
try:
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
except ImportError:  # 0.10.0: the manager hashes a request's blocks itself
    get_request_block_hasher = None

BLOCK_SIZE = 16
WINDOW = 6  # vLLM's sliding_window: the 5 tokens before the current one, and it
NUM_BLOCKS = 11  # 7 full-attention blocks' worth and 3 sliding-window ones, and the null block

init_none_hash(sha256)  # as vLLM's engine does before it builds a request
# 0.10.2's attention specs say whether the layer is MLA (it is not)
mla = {"use_mla": False} if "use_mla" in inspect.signature(FullAttentionSpec).parameters else {}
layer = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float16, **mla}
# the block size of the hashes (from 0.12.0) and of the scheduler (from 0.23.0): every group's here
sizes = {name: BLOCK_SIZE for name in ("hash_block_size", "scheduler_block_size")
         if name in inspect.signature(KVCacheManager).parameters}
manager = KVCacheManager(
    KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["full.0"], FullAttentionSpec(BLOCK_SIZE, **layer)),
        KVCacheGroupSpec(["swa.0"], SlidingWindowSpec(BLOCK_SIZE, **layer, sliding_window=WINDOW))]),
    max_model_len=7 * BLOCK_SIZE, enable_caching=True, enable_kv_cache_events=True, **sizes)

# a request of 32 tokens (0.10.0 - 0.10.1.1 take its multimodal inputs before the sampling parameters;
# they and 0.13.0 - 0.16.0 take its end-of-sequence token after pooling_params: none of either here)
parameters = inspect.signature(Request).parameters
multimodal = [None] * 3 if "multi_modal_hashes" in parameters else []
eos = [None] if "eos_token_id" in parameters else []
hasher = {"block_hasher": get_request_block_hasher(BLOCK_SIZE, sha256)} if get_request_block_hasher else {}
request = Request("r1", [0] * 32, *multimodal, SamplingParams(max_tokens=1 << 30), None, *eos, **hasher)
blocks, hit = manager.get_computed_blocks(request)[:2]
assert hit == 0  # nothing cached yet

# the first chunk: 29 tokens; the forward pass computes them
assert manager.allocate_slots(request, 29) is not None
request.num_computed_tokens += 29

# the second chunk: 3 tokens, which fill block 1: caching it fails on 0.13.0
assert manager.allocate_slots(request, 3) is not None
request.num_computed_tokens += 3

print(f"vLLM {__version__}: the request's blocks were cached")
