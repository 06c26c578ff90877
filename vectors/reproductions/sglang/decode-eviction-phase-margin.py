"""decode-eviction-phase: a bug of SGLang 0.5.14 (fixed in 0.5.15), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python decode-eviction-phase-margin.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.14 and passes on 0.5.15, which fixed it.

SGLang 0.5.14 (bug decode-eviction-phase, its shape under 0.5.14's page margin,
docs/engines/sglang-findings.md): one request decodes in every batch; eviction runs every I-th
batch and keeps W + P tokens, so between two evictions the request holds W + P + I private SWA
slots, one page past WIN-5's bound. From 0.5.15 the retention is max(W, P) and this shape stays
within the bound (the phase gate itself is fixed in 0.5.18). Written by hand from the history
table's counterexample (19 steps); fails at its last step.

What it checks: a decoding request's SWA KV stays bounded.

Written by kvspec from the trace vectors/regressions/sglang/decode-eviction-phase-margin.jsonl
(`python -m kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.14 --out
decode-eviction-phase-margin.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.14 makes
for each step, in order, with their arguments, on CPU with tiny pools: page size 1, window 3,
the legacy SWARadixCache; SGLANG_SWA_EVICTION_INTERVAL=4. kvspec's account:
docs/engines/sglang-findings.md#decode-eviction-phase.
"""

import os
import inspect
import sys
import types
import warnings
from array import array
from types import SimpleNamespace

# SGLang reads its knobs from the environment: this run's, and the release's defaults for the rest.
os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = "4"
for name in ("SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS", "SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN",
             "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW", "SGLANG_ENABLE_UNIFIED_RADIX_TREE",
             "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "SGLANG_OPT_RELEASE_PREFILL_SWA",
             "SGLANG_OPT_SWA_RADIX_CACHE_COMPACT", "SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT"):
    os.environ.pop(name, None)

# SGLang imports torchvision at module level for its vision models, which nothing here runs.
# Where it cannot be imported (a CPU torch beside PyPI's CUDA torchvision), a stand-in module
# lets those imports finish; calling anything in it raises.
try:
    import torchvision  # noqa: F401
except Exception:  # missing, or a build that fails to load beside this torch
    import importlib.abc
    import importlib.machinery

    class Absent(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Absent(name, (), {})

        def __call__(cls, *args, **kwargs):
            raise RuntimeError("torchvision is not installed")

    class AbsentModule(types.ModuleType):
        __getattr__ = Absent.__getattr__

    class AbsentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "torchvision":
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = AbsentModule(spec.name)
            module.__path__, module.__version__ = [], "0.0.0"
            return module

        def exec_module(self, module):
            pass

    for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
        del sys.modules[name]
    sys.meta_path.insert(0, AbsentFinder())

# Up to 0.5.19 SGLang registers its qwen3_asr configs without exist_ok, and newer transformers
# ship that model type themselves: let the registration pass, as SGLang 0.5.20 does.
from transformers import AutoConfig

register = AutoConfig.register
AutoConfig.register = staticmethod(lambda model_type, config, exist_ok=False: register(model_type, config, True))

# SGLang warns at import that its quantization kernels need a GPU: true, and beside the point here.
warnings.filterwarnings("ignore", message="Only CUDA")

import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import (
    alloc_for_decode, alloc_for_extend, evict_from_tree_cache, maybe_cache_unfinished_req,
)
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache
from sglang.srt.mem_cache.unified_cache_components.tree_component import ComponentType
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.version import __version__

PAGE_SIZE = 1
WINDOW = 3
EVICTION_INTERVAL = 4  # decode eviction's, in tokens
WINDOW_BOUND = 7  # WIN-5's, at SGLang 0.5.14's window retention

# 0.5.14's SWAKVPool requires enable_kvcache_transpose (and asserts it is off); later releases have no such
# argument: pass it where SWAKVPool takes it, as kvspec's adapter does.
KVCACHE_TRANSPOSE = {"enable_kvcache_transpose": False} \
    if "enable_kvcache_transpose" in inspect.signature(SWAKVPool).parameters else {}

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=1, attention_backend="torch_native")
set_global_server_args_for_scheduler(server_args)

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=64, size_swa=64, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu",
                    **KVCACHE_TRANSPOSE)
allocator = SWATokenToKVPoolAllocator(size=64, size_swa=64, page_size=1, dtype=torch.bfloat16, device="cpu",
                                      kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=65, device="cpu", enable_memory_saver=False)
cache_init_params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=1, sliding_window_size=3,
                                    eviction_policy="lru")
tree_cache = SWARadixCache(params=cache_init_params)


def schedule_batch(reqs, forward_mode, forward_iter=0):
    """A ScheduleBatch with the fields SGLang's allocation paths read, as the scheduler's are
    (no overlap, no speculative decoding, a decoder-only model); `forward_iter` is the
    scheduler's count of the batches it ran before this one."""
    batch = object.__new__(ScheduleBatch)
    batch.reqs = list(reqs)
    batch.tree_cache = tree_cache
    batch.token_to_kv_pool_allocator = allocator
    batch.req_to_token_pool = req_to_token_pool
    batch.forward_mode = forward_mode
    batch.device = "cpu"
    batch.enable_overlap = False
    batch.hisparse_coordinator = None
    batch.dllm_config = None
    batch.forward_iter = forward_iter
    batch.model_config = SimpleNamespace(is_encoder_decoder=False)
    batch.spec_algorithm = SimpleNamespace(is_none=lambda: True)
    return batch


def set_extend_range(req, start, end):
    """This round's extend of the request, tokens [start, end): SGLang 0.5.15 sets it with
    set_extend_range, 0.5.14 with set_extend_input_len and fill_len."""
    req._refresh_fill_ids()
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(start, end)
    else:
        req.set_extend_input_len(end - start)
        req.fill_len = end


# -- what must hold ------------------------------------------------------------------------------------------


def kv_of(req):
    """What a request holds: (its row of req_to_token_pool, cache_protected_len, its SWA cursor,
    kv_allocated_len), or None before its first extend. A release keeps these on the request or
    in `req.kv`, which took them over one by one (0.5.17 - 0.5.19)."""
    kv = getattr(req, "kv", None)

    def read(name):
        return getattr(kv, name) if hasattr(kv, name) else getattr(req, name)

    if read("req_pool_idx") is None:
        return None
    if hasattr(kv, "get_evicted_seqlen"):  # from 0.5.22
        cursor = kv.get_evicted_seqlen(ComponentType.SWA)
    else:
        cursor = read("swa_evicted_seqlen")
    return read("req_pool_idx"), read("cache_protected_len"), cursor, read("kv_allocated_len")


def check_window_bound(after, requests):
    """A decoding request's SWA KV stays bounded: from its third decode step on it holds at
    most WINDOW_BOUND SWA slots from its cursor on (kvspec I9; WIN-5's bound, the window plus
    the tokens decoded between two decode evictions, in whole pages)."""
    for req in requests:
        if (kv := kv_of(req)) is None or req.decode_batch_idx < 3:
            continue
        _, protected, cursor, allocated = kv
        start = max(cursor, protected)
        held = -(-allocated // PAGE_SIZE) * PAGE_SIZE - start
        assert held <= WINDOW_BOUND, (
            f"{after}: request {req.rid} holds {held} SWA slots (positions {start}..{allocated - 1}) after "
            f"{req.decode_batch_idx} decode steps; with window {WINDOW} and decode eviction every "
            f"{EVICTION_INTERVAL} tokens it holds at most {WINDOW_BOUND}")


def check(after, requests):
    """What must hold after every step."""
    check_window_bound(after, requests)


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: admit r1 (6 prompt tokens): the scheduler matches its prompt against the tree and locks the node the
# match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="", origin_input_ids=array("q", [0] * 6),
         sampling_params=sampling_params)
# the prefix match
r1.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(r1.last_node)
r1.swa_uuid_for_lock = None
check("after step 1 (admit)", [r1])

# step 2: extend r1 by its prompt's next chunk (at most 8 tokens), then checkpoint it into the tree
set_extend_range(r1, 0, 6)
batch = schedule_batch([r1], ForwardMode.EXTEND)
batch.prefix_lens = [0]
batch.extend_lens = [6]
batch.extend_num_tokens = 6
batch.seq_lens = torch.tensor([6])
batch.seq_lens_cpu = torch.tensor([6])
# the eviction an extend's allocation makes first
evict_from_tree_cache(tree_cache, 6)
alloc_for_extend(batch)
r1.kv_committed_len = 6
r1.kv_allocated_len = 6
r1.extend_batch_idx = 1
maybe_cache_unfinished_req(r1, tree_cache, chunked=False)
r1.output_ids.append(2)
check("after step 2 (prefill_chunk)", [r1])

# step 3: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=1)
batch.seq_lens = torch.tensor([6])
batch.seq_lens_cpu = torch.tensor([6])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 1
r1.output_ids.append(1)
r1.kv_committed_len = 7
r1.kv_allocated_len = 7
check("after step 3 (decode)", [r1])

# step 4: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=2)
batch.seq_lens = torch.tensor([7])
batch.seq_lens_cpu = torch.tensor([7])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 2
r1.output_ids.append(1)
r1.kv_committed_len = 8
r1.kv_allocated_len = 8
check("after step 4 (decode)", [r1])

# step 5: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=3)
batch.seq_lens = torch.tensor([8])
batch.seq_lens_cpu = torch.tensor([8])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 3
r1.output_ids.append(1)
r1.kv_committed_len = 9
r1.kv_allocated_len = 9
check("after step 5 (decode)", [r1])

# step 6: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=4)
batch.seq_lens = torch.tensor([9])
batch.seq_lens_cpu = torch.tensor([9])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 4
r1.output_ids.append(1)
r1.kv_committed_len = 10
r1.kv_allocated_len = 10
check("after step 6 (decode)", [r1])

# step 7: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=5)
batch.seq_lens = torch.tensor([10])
batch.seq_lens_cpu = torch.tensor([10])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 5
r1.output_ids.append(1)
r1.kv_committed_len = 11
r1.kv_allocated_len = 11
check("after step 7 (decode)", [r1])

# step 8: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=6)
batch.seq_lens = torch.tensor([11])
batch.seq_lens_cpu = torch.tensor([11])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 6
r1.output_ids.append(1)
r1.kv_committed_len = 12
r1.kv_allocated_len = 12
check("after step 8 (decode)", [r1])

# step 9: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=7)
batch.seq_lens = torch.tensor([12])
batch.seq_lens_cpu = torch.tensor([12])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 7
r1.output_ids.append(1)
r1.kv_committed_len = 13
r1.kv_allocated_len = 13
check("after step 9 (decode)", [r1])

# step 10: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=8)
batch.seq_lens = torch.tensor([13])
batch.seq_lens_cpu = torch.tensor([13])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 8
r1.output_ids.append(1)
r1.kv_committed_len = 14
r1.kv_allocated_len = 14
check("after step 10 (decode)", [r1])

# step 11: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=9)
batch.seq_lens = torch.tensor([14])
batch.seq_lens_cpu = torch.tensor([14])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 9
r1.output_ids.append(1)
r1.kv_committed_len = 15
r1.kv_allocated_len = 15
check("after step 11 (decode)", [r1])

# step 12: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=10)
batch.seq_lens = torch.tensor([15])
batch.seq_lens_cpu = torch.tensor([15])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 10
r1.output_ids.append(1)
r1.kv_committed_len = 16
r1.kv_allocated_len = 16
check("after step 12 (decode)", [r1])

# step 13: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=11)
batch.seq_lens = torch.tensor([16])
batch.seq_lens_cpu = torch.tensor([16])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 11
r1.output_ids.append(1)
r1.kv_committed_len = 17
r1.kv_allocated_len = 17
check("after step 13 (decode)", [r1])

print(f"SGLang {__version__}: every check held")
