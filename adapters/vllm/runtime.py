"""Importing real vLLM 0.33.0's v1 KV cache manager on a CPU-only machine.

The manager is pure Python; nothing of vLLM's CUDA extensions is loaded on the paths
kvspec drives, and no model, GPU or `VllmConfig` is needed. Two pieces of global state
are set once: vLLM's loggers are quieted (a refused `reset_prefix_cache` warns), and the
seed of the chained block hashes (`init_none_hash`) is set, as vLLM's engine does before
it builds any request.

Everything is imported here once, so the adapter reads one namespace and the forkserver
can preload it (preload.py). Importing takes 5-8 s.
"""

import logging
import os
import types
from functools import cache


class VllmMissing(ImportError):
    """vLLM is not installed, or not importable here."""


@cache
def vllm() -> types.SimpleNamespace:
    """vLLM's KV cache manager classes, imported once per process."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import torch
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
        from vllm.sampling_params import SamplingParams
        try:
            from vllm.utils.hashing import sha256
        except ModuleNotFoundError:  # before 0.11.1 (adapters/vllm/releases/api_0_10.py)
            from vllm.utils import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        try:
            from vllm.v1.core.kv_cache_utils import init_none_hash
        except ImportError:  # 0.9.2 seeds the chained hashes at import (releases/api_0_9.py)
            init_none_hash = None
        try:
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        except ImportError:  # 0.10.0: the manager hashes a request's blocks itself (releases/api_0_10_0.py)
            get_request_block_hasher = None
        try:
            from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, maybe_convert_block_hash
        except ImportError:  # before 0.10.2 a key is a named tuple (adapters/vllm/releases/api_0_10_1.py)
            get_block_hash, get_group_id, maybe_convert_block_hash = named_key_readers()
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, MambaManager, SlidingWindowManager
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.request import Request, RequestStatus
    except ImportError as error:
        raise VllmMissing(f"cannot import vLLM's KV cache manager ({error}); install it with "
                          f"`pip install --no-deps -r adapters/vllm/requirements.txt` (README, "
                          f"\"vLLM\")") from error
    logging.getLogger("vllm").setLevel(logging.ERROR)
    if init_none_hash is not None:
        init_none_hash(sha256)  # before any Request with a block hasher is built
    return types.SimpleNamespace(
        torch=torch, AllBlocksCleared=AllBlocksCleared, BlockRemoved=BlockRemoved, BlockStored=BlockStored,
        SamplingParams=SamplingParams, sha256=sha256, KVCacheManager=KVCacheManager, get_block_hash=get_block_hash,
        get_group_id=get_group_id, get_request_block_hasher=get_request_block_hasher,
        maybe_convert_block_hash=maybe_convert_block_hash, FullAttentionManager=FullAttentionManager,
        SlidingWindowManager=SlidingWindowManager, FullAttentionSpec=FullAttentionSpec, KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec, SlidingWindowSpec=SlidingWindowSpec, MambaSpec=MambaSpec,
        MambaManager=MambaManager, Scheduler=Scheduler, Request=Request,
        RequestStatus=RequestStatus)


def named_key_readers():
    """vLLM 0.10.1's readers of a prefix-cache key, `BlockHashWithGroupId(block_hash, group_id)`
    whose `block_hash` is `BlockHash(hash_value, token_ids, extra_keys)`: its hash, its group,
    and the hash as an integer (what its KV events carry: `get_hash_value()`)."""
    return (lambda key: key.block_hash), (lambda key: key.group_id), (lambda block_hash: block_hash.hash_value)
