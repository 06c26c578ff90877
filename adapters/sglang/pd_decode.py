"""SGLang's PD-decode pre-allocation (`sglang/srt/disaggregation/decode.py`) behind
kvspec's `pd_admit` (LIFE-6, WIN-6).

A decode server receives a request whose prompt KV a prefill server computed. SGLang's
`DecodePreallocQueue.pop_preallocated` matches the prompt against the decode-side radix
cache (`_match_prefix_and_lock`, the match capped at `fill_len - _swa_tail_len(fill_len)`),
checks its budgets (`prealloc_fits`), reclaims SWA (`_reclaim_swa_tail_capacity`) and
pre-allocates (`_pre_alloc` -> `alloc_for_decode_prealloc` ->
`allocator.alloc_extend_swa_tail`, the cursor set to `fill_len - swa_tail_len`). When the
KV has arrived, `DecodeTransferQueue._commit_transfer_to_req` appends the prefill
server's first output token, and the prebuilt batch's `process_prebuilt` checkpoints the
prompt into the decode radix cache before the request joins the running batch.

`prealloc_queue` builds the queue as the adapter builds a `ScheduleBatch`: with
`object.__new__` and exactly the attributes those methods read, so SGLang's own methods
run. The scheduler it points at is a stand-in holding what they read of it: no other
request in the running batch, transfer or waiting queue (the adapter plays SGLang's
scheduler one request per batch), no HiCache, no HiSparse, a hybrid SWA model.

The decode radix cache is SGLang's server argument
`disaggregation_decode_enable_radix_cache` (`arg_groups/fields/disagg.py:88`), published
into the runtime context's "disagg" namespace and read through `get_disagg()`
(`runtime_context.py:1342`); `decode_radix_cache()` turns it on, for the duration of
the pre-allocation, with the namespace's scoped `override` (`runtime_context.py:849`).
kvspec's engine always has a prefix-sharing radix cache, so the decode side has one too.
"""

import contextlib
import importlib
import types
from typing import NamedTuple

from .runtime import sglang

NUM_RESERVED_DECODE_TOKENS = 0
"""SGLang's `--num-reserved-decode-tokens` (decode headroom reserved per active request,
default 512): kvspec's engine reserves none; each decode step allocates or fails itself."""


class PdMatch(NamedTuple):
    """What the decode-side match leaves for the pre-allocation: the device prefix (capped
    clear of the SWA tail), the prefix promised to the prefill server, the length to
    fill, and whether the match took a lock (to give back if the request does not fit)."""

    prefix_indices: object
    prefix_len: int
    total_prefix_len: int
    fill_len: int
    locked: bool


def decode_module():
    """`sglang.srt.disaggregation.decode`, imported once SGLang is (runtime.py's stub first)."""
    sglang()
    return importlib.import_module("sglang.srt.disaggregation.decode")


@contextlib.contextmanager
def decode_radix_cache():
    """SGLang's decode-side radix cache on (`--disaggregation-decode-enable-radix-cache`)."""
    from sglang.srt.runtime_context import get_disagg
    with get_disagg().override(disaggregation_decode_enable_radix_cache=True):
        yield


def prealloc_queue(engine):
    """A `DecodePreallocQueue` over the engine's allocator, request-to-token pool and tree,
    with the attributes `_match_prefix_and_lock`, the budget methods, `_pre_alloc` and
    `_reclaim_swa_tail_capacity` read (`disaggregation/decode.py:392-493`)."""
    decode = decode_module()
    queue = object.__new__(decode.DecodePreallocQueue)
    queue.req_to_token_pool = engine.req_to_token_pool
    queue.token_to_kv_pool_allocator = engine.allocator
    queue.token_to_kv_pool = engine.allocator.get_kvcache()
    queue.tree_cache = engine.cache
    queue.num_reserved_decode_tokens = NUM_RESERVED_DECODE_TOKENS
    queue.retracted_queue = []
    queue.transfer_queue = types.SimpleNamespace(queue=[])
    queue.scheduler = types.SimpleNamespace(
        sliding_window_size=engine.config.window,
        enable_decode_hicache=False,
        enable_hisparse=False,
        running_batch=types.SimpleNamespace(reqs=[]),
        waiting_queue=[],
        last_batch=None,
        tp_worker=types.SimpleNamespace(is_hybrid_swa=True),
        # up to 0.5.19 the decode radix cache is read off the server arguments (0.5.19 `:466, 1200`)
        server_args=types.SimpleNamespace(disaggregation_decode_enable_radix_cache=True),
    )
    return queue
