"""pd-tail-not-rounded: a bug of SGLang 0.5.23, shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python pd-tail-not-rounded.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.23; no release fixed it.

With the decode-side radix cache, SGLang starts a PD request's SWA tail at floor_page(fill - 1 -
max(W, P)) and checkpoints the received prompt, [0, floor_page(fill)), before the first decode
step (SGL-9). Its comment's intent is a complete window before that insert boundary, but max(W,
P) is not rounded to a page: where W > P and 1 <= W % P <= P - 2 the new leaf keeps fewer than W
live SWA tokens below a tombstoned head and no later match reaches it (W = 6, P = 4, a 15-token
prompt: cursor 8, leaf [8, 12), and the same prompt admitted again matches nothing). A bug of
SGLang (0.5.19 - 0.5.23 share the arithmetic; on 0.5.19 - 0.5.22 the short leaf meets
checkpoint-short-rematch first), not a difference of models: 0.5.23 re-points the request to the
tree's slots, so the leaf is merely unmatchable; the releases that match again after the insert
meet checkpoint-short-rematch (docs/engines/sglang-findings.md, pd-tail-not-rounded). The spec's
WIN-6 tail is the same arithmetic, sound for the reference, which does not checkpoint there.
Steered: the sglang adapters do not declare pd_checkpoint_keeps_window, so pd_admit is not drawn
at those windows.

What it checks: what a checkpoint put into the tree can be matched again.

Written by kvspec from the trace vectors/divergences/sglang/SGL-11.jsonl (`python -m
kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.23-python --out
pd-tail-not-rounded.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.23 makes for each
step, in order, with their arguments, on CPU with tiny pools: page size 4, window 6,
UnifiedRadixCache with its Python tree core; SGLANG_SWA_EVICTION_INTERVAL=4. kvspec's account:
docs/engines/sglang-findings.md#pd-tail-not-rounded.
"""

import os
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

# SGLang warns at import that its quantization kernels need a GPU: true, and beside the point here.
warnings.filterwarnings("ignore", message="Only CUDA")

import torch
from sglang.srt.disaggregation.decode import DecodePreallocQueue
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_disagg, publish, reset_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

WINDOW = 6

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=4, attention_backend="torch_native")
reset_context()
publish(server_args, role="scheduler")

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=64, size_swa=32, page_size=4, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
allocator = SWATokenToKVPoolAllocator(size=64, size_swa=32, page_size=4, dtype=torch.bfloat16, device="cpu",
                                      kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=68, device="cpu", enable_memory_saver=False)
cache_init_params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=4, sliding_window_size=6,
                                    eviction_policy="lru",
                                    tree_components=(ComponentType.FULL, ComponentType.SWA),
                                    tree_core_backend="python")
tree_cache = UnifiedRadixCache(cache_init_params)


def prealloc_queue():
    """SGLang's DecodePreallocQueue over these pools and this tree, with what its pre-allocation
    reads of the scheduler: no other request running, in transfer or waiting, no HiCache, no
    HiSparse, a hybrid SWA model, and no decode tokens reserved per request."""
    queue = object.__new__(DecodePreallocQueue)
    queue.req_to_token_pool = req_to_token_pool
    queue.token_to_kv_pool_allocator = allocator
    queue.token_to_kv_pool = allocator.get_kvcache()
    queue.tree_cache = tree_cache
    queue.num_reserved_decode_tokens = 0
    queue.retracted_queue = []
    queue.transfer_queue = SimpleNamespace(queue=[])
    queue.scheduler = SimpleNamespace(
        sliding_window_size=WINDOW, enable_decode_hicache=False, enable_hisparse=False,
        running_batch=SimpleNamespace(reqs=[]), waiting_queue=[], last_batch=None,
        tp_worker=SimpleNamespace(is_hybrid_swa=True),
        server_args=SimpleNamespace(disaggregation_decode_enable_radix_cache=True))  # what 0.5.19 reads
    return queue


# -- what must hold ------------------------------------------------------------------------------------------


def check_checkpoint_matches(after, req, inserted):
    """What a checkpoint put into the tree can be matched again: the request's first `inserted`
    tokens match all of them (kvspec I10: the inserted leaf keeps a window of live SWA KV)."""
    key = RadixKey(req.origin_input_ids[:inserted])
    matched = tree_cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
    assert matched == inserted, (
        f"{after}: the checkpoint put {inserted} tokens of request {req.rid} into the tree, but a match of them "
        f"finds {matched}: the new leaf keeps fewer than a window ({WINDOW}) of live SWA tokens")


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: a PD decode server takes r1 (15 prompt tokens, their KV computed by a prefill server): match,
# pre-allocate, then checkpoint the prompt into the tree
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="",
         origin_input_ids=array("q", [2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1]),
         sampling_params=sampling_params)
queue = prealloc_queue()
with get_disagg().override(disaggregation_decode_enable_radix_cache=True):  # SGLang's decode-side radix cache on
    decode_prefix_match = queue._match_prefix_and_lock(r1)
    queue._reclaim_swa_tail_capacity(7, "r1", full_len=16)
    queue._pre_alloc(r1, decode_prefix_match.prefix_indices, decode_prefix_match.l1_prefix_len,
                     decode_prefix_match.decode_prefix_len)
    r1.kv.cache_protected_len = decode_prefix_match.decode_prefix_len
    r1.output_ids.append(0)
    r1.swa_branching_seqlen = None
    checkpoint_kv_cache(r1, tree_cache)
check_checkpoint_matches("after step 1 (pd_admit)", r1, 12)

print(f"SGLang {__version__}: every check held")
