"""pd-swa-lock-released-twice: a bug of SGLang 0.5.19 (fixed in 0.5.20), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python pd-swa-lock-released-twice.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.19. On 0.5.20, which fixed it, the calls differ (a request's SWA lock is `req.lock_receipt`
there, `req.swa_uuid_for_lock` in 0.5.19): the same trace written for it (`--member
sglang@0.5.20`) passes there.

SGLang 0.5.19 (bug pd-swa-lock-released-twice; docs/engines/sglang-findings.md): a PD decode
server takes r1 (41 tokens), whose admission checkpoint puts its prompt into the tree; r2 (57
tokens, the same first 41) matches r1's prefix and locks it, and pop_preallocated gives the
match's SWA lock back at once (dec_swa_lock_only, swa_prefix_lock_released); the admission
checkpoint's cache_unfinished_req then releases r2's old lock whole, SWA included (0.5.19
mem_cache/unified_radix_cache.py:1010), so the SWA lock of the nodes r1 holds drops to 0 while
r1 runs (I11). 0.5.20 passes skip_swa=req.swa_prefix_lock_released there (:1202) and resets the
flag (:1230). Found by the whole matrix (sglang@0.5.19+evict-lfu, ci profile), shrunk to 3
steps, the refused step dropped by hand.

What it checks: a running request's KV stays allocated; a running request keeps the SWA lock of
the node its prefix ends on until it gives it back (swa_prefix_lock_released).

Written by kvspec from the trace vectors/regressions/sglang/pd-swa-lock-released-twice.jsonl
(`python -m kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.19 --out
pd-swa-lock-released-twice.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.19 makes
for each step, in order, with their arguments, on CPU with tiny pools: page size 16, window 5,
UnifiedRadixCache with its Python tree core; SGLANG_SWA_EVICTION_INTERVAL=4,
SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python. kvspec's account:
docs/engines/sglang-findings.md#pd-swa-lock-released-twice.
"""

import os
import sys
import types
import warnings
from array import array
from types import SimpleNamespace

# SGLang reads its knobs from the environment: this run's, and the release's defaults for the rest.
os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = "4"
os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"
for name in ("SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS", "SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN",
             "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW", "SGLANG_ENABLE_UNIFIED_RADIX_TREE",
             "SGLANG_OPT_RELEASE_PREFILL_SWA", "SGLANG_OPT_SWA_RADIX_CACHE_COMPACT",
             "SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT"):
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
from sglang.srt.disaggregation.decode import DecodePreallocQueue
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import maybe_cache_unfinished_req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_disagg, publish, reset_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

# Up to 0.5.21 the paged allocator launches Triton kernels, which need a GPU. On CPU, run the
# torch code SGLang 0.5.22 runs instead: the release's own alloc_extend_naive.
import sglang.srt.mem_cache.allocator.paged as paged


class CpuLaunch:
    """`kernel[grid](*args)` for a plain function."""

    def __init__(self, function):
        self.function = function

    def __getitem__(self, grid):
        return self.function


def alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, out_indices, _block, page_size):
    new_pages = ((seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size).sum()
    if int(new_pages) <= free_pages.numel():  # else the kernel's output is dropped: the allocation returns None
        paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, "cpu")


paged.alloc_extend_kernel = CpuLaunch(alloc_extend)

PAGE_SIZE = 16
WINDOW = 5

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=16, attention_backend="torch_native")
reset_context()
publish(server_args, role="scheduler")

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=112, size_swa=256, page_size=16, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
allocator = SWATokenToKVPoolAllocator(size=112, size_swa=256, page_size=16, dtype=torch.bfloat16,
                                      device="cpu", kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=128, device="cpu", enable_memory_saver=False)
cache_init_params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=16, sliding_window_size=5,
                                    eviction_policy="lru",
                                    tree_components=(ComponentType.FULL, ComponentType.SWA))
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


def free_pages(pool):
    """A pool's free list: its free pages and those freed since it last sorted them."""
    pages = pool.free_pages.tolist()
    return pages if pool.release_pages is None else pages + pool.release_pages.tolist()


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


def check_rows_are_allocated(after, requests):
    """A running request's KV stays allocated: no full slot of its row is on the free list
    (kvspec I11, I14)."""
    free = set(free_pages(allocator.full_attn_allocator))
    for req in requests:
        if (kv := kv_of(req)) is None:
            continue
        row, _, _, allocated = kv
        freed = [slot for slot in req_to_token_pool.req_to_token[row, :allocated].tolist() if slot // PAGE_SIZE in free]
        assert not freed, f"{after}: request {req.rid} still reads full slots {freed} of its row, but they are free"


def check_swa_locks_held(after, requests):
    """A running request keeps the SWA lock of the node its prefix ends on until it gives it
    back (swa_prefix_lock_released): while it holds it, the node's SWA lock count is at least
    1, so the tree cannot evict the SWA KV the request still reads (kvspec I11)."""
    for req in requests:
        node = req.last_node  # the node, or from 0.5.20 its id in the tree core
        if isinstance(node, int):
            node = tree_cache.tree_core.node_by_id(node)
        if node is None or node.parent is None or getattr(req, "swa_prefix_lock_released", False):
            continue
        locks = node.component(ComponentType.SWA).lock_ref
        assert locks >= 1, (
            f"{after}: request {req.rid} holds the SWA lock of tree node {node.id}, where its prefix ends, but "
            f"the node's SWA lock count is {locks}: another request's release gave back a lock it did not hold, "
            f"and the tree may now evict SWA KV that {req.rid} still reads")


def check(after, requests):
    """What must hold after every step."""
    check_rows_are_allocated(after, requests)
    check_swa_locks_held(after, requests)


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: a PD decode server takes r1 (41 prompt tokens, their KV computed by a prefill server): match,
# pre-allocate, then checkpoint the prompt into the tree
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="", origin_input_ids=array("q", [0] * 41),
         sampling_params=sampling_params)
queue = prealloc_queue()
with get_disagg().override(disaggregation_decode_enable_radix_cache=True):  # SGLang's decode-side radix cache on
    decode_prefix_match = queue._match_prefix_and_lock(r1)
    queue._reclaim_swa_tail_capacity(25, "r1")
    queue._pre_alloc(r1, decode_prefix_match.prefix_indices, decode_prefix_match.l1_prefix_len,
                     decode_prefix_match.decode_prefix_len)
    r1.kv.cache_protected_len = decode_prefix_match.decode_prefix_len
    r1.output_ids.append(0)
    r1.swa_branching_seqlen = None
    maybe_cache_unfinished_req(r1, tree_cache, chunked=False)
check("after step 1 (pd_admit)", [r1])

# step 2: a PD decode server takes r2 (57 prompt tokens, their KV computed by a prefill server): match,
# pre-allocate, then checkpoint the prompt into the tree
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r2 = Req(rid="r2", origin_input_text="", origin_input_ids=array("q", [0] * 57),
         sampling_params=sampling_params)
queue = prealloc_queue()
with get_disagg().override(disaggregation_decode_enable_radix_cache=True):  # SGLang's decode-side radix cache on
    decode_prefix_match = queue._match_prefix_and_lock(r2)
    tree_cache.dec_swa_lock_only(r2.last_node, r2.swa_uuid_for_lock)
    r2.swa_prefix_lock_released = True
    queue._reclaim_swa_tail_capacity(25, "r2")
    queue._pre_alloc(r2, decode_prefix_match.prefix_indices, decode_prefix_match.l1_prefix_len,
                     decode_prefix_match.decode_prefix_len)
    r2.kv.cache_protected_len = decode_prefix_match.decode_prefix_len
    r2.output_ids.append(0)
    r2.swa_branching_seqlen = None
    maybe_cache_unfinished_req(r2, tree_cache, chunked=False)
check("after step 2 (pd_admit)", [r1, r2])

print(f"SGLang {__version__}: every check held")
