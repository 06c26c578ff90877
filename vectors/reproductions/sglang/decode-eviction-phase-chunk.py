"""decode-eviction-phase: a bug of SGLang 0.5.14 - 0.5.17 (fixed in 0.5.18), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python decode-eviction-phase-chunk.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.17 and passes on 0.5.18, which fixed it.

SGLang 0.5.14-0.5.17 (bug decode-eviction-phase, docs/engines/sglang-findings.md), on the chunk
cache (--disable-radix-cache): decode eviction runs only in batches whose scheduler count is a
multiple of the interval I, for the chunk cache as for the trees, so a request prefilled in the
first batch and decoded in the next three never releases the SWA that slid out of its window and
holds 16 private SWA slots, past WIN-5's bound of W + I + P - 1 = 13 (I9). Minimised by hand
from the table's counterexample on sglang@0.5.14-chunk (33 steps, bisected to 0.5.14-0.5.17 on
both chunk lines); fails at its last step.

What it checks: a decoding request's SWA KV stays bounded.

Written by kvspec from the trace vectors/regressions/sglang/decode-eviction-phase-chunk.jsonl
(`python -m kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.17-chunk --out
decode-eviction-phase-chunk.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.17 makes
for each step, in order, with their arguments, on CPU with tiny pools: page size 4, window 6,
the radix cache disabled (--disable-radix-cache): no prefix is shared, and nothing is cached;
SGLANG_SWA_EVICTION_INTERVAL=4. kvspec's account:
docs/engines/sglang-findings.md#decode-eviction-phase.
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

# Up to 0.5.19 SGLang registers its qwen3_asr configs without exist_ok, and newer transformers
# ship that model type themselves: let the registration pass, as SGLang 0.5.20 does.
from transformers import AutoConfig

register = AutoConfig.register
AutoConfig.register = staticmethod(lambda model_type, config, exist_ok=False: register(model_type, config, True))

# SGLang warns at import that its quantization kernels need a GPU: true, and beside the point here.
warnings.filterwarnings("ignore", message="Only CUDA")

import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.mem_cache.allocation import alloc_for_decode, alloc_for_extend
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.chunk_cache import SWAChunkCache
from sglang.srt.mem_cache.common import evict_from_tree_cache, maybe_cache_unfinished_req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import publish, reset_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

# Up to 0.5.21 the paged allocator launches Triton kernels, which need a GPU. On CPU, run the
# torch code SGLang 0.5.22 runs instead: the release's own alloc_extend_naive, and for decode 0.5.22's alloc_decode_naive, restated.
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


def alloc_decode(seq_lens, last_loc, free_pages, out_indices, _block, page_size):
    need_new_page = ((seq_lens - 1) % page_size == 0).to(torch.int64)
    num_new_pages = int(need_new_page.sum())
    if num_new_pages == 0:
        out_indices.copy_(last_loc + 1)
    elif num_new_pages <= free_pages.numel():
        rank = (torch.cumsum(need_new_page, 0) - need_new_page).clamp_(max=num_new_pages - 1)
        out_indices.copy_(torch.where(need_new_page.bool(), free_pages[rank] * page_size, last_loc + 1))


paged.alloc_extend_kernel = CpuLaunch(alloc_extend)
paged.alloc_decode_kernel = CpuLaunch(alloc_decode)

PAGE_SIZE = 4
WINDOW = 6
EVICTION_INTERVAL = 4  # decode eviction's, in tokens
WINDOW_BOUND = 13  # WIN-5's, at SGLang 0.5.17's window retention

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=4, attention_backend="torch_native")
reset_context()
publish(server_args, role="scheduler")

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=64, size_swa=64, page_size=4, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
allocator = SWATokenToKVPoolAllocator(size=64, size_swa=64, page_size=4, dtype=torch.bfloat16, device="cpu",
                                      kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=68, device="cpu", enable_memory_saver=False)
cache_init_params = CacheInitParams(disable=True, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=4, sliding_window_size=6)
tree_cache = SWAChunkCache(cache_init_params)


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

# step 1: admit r1 (13 prompt tokens): the scheduler matches its prompt against the tree and locks the node
# the match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="", origin_input_ids=array("q", [1] * 13),
         sampling_params=sampling_params)
# the prefix match
r1.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(None)
r1.swa_uuid_for_lock = None
r1.skip_lock_node_ids = {}
check("after step 1 (admit)", [r1])

# step 2: extend r1 by its prompt's next chunk (at most 13 tokens), then checkpoint it into the tree
r1._refresh_fill_ids()
r1.set_extend_range(0, 13)
batch = schedule_batch([r1], ForwardMode.EXTEND)
batch.prefix_lens = [0]
batch.extend_lens = [13]
batch.extend_num_tokens = 13
batch.seq_lens = torch.tensor([13])
batch.seq_lens_cpu = torch.tensor([13])
# the eviction an extend's allocation makes first
evict_from_tree_cache(tree_cache, 17)
alloc_for_extend(batch)
r1.kv_committed_len = r1.extend_range.end
r1.extend_batch_idx = 1
maybe_cache_unfinished_req(r1, tree_cache, chunked=False)
r1.output_ids.append(0)
check("after step 2 (prefill_chunk)", [r1])

# step 3: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=1)
batch.seq_lens = torch.tensor([13])
batch.seq_lens_cpu = torch.tensor([13])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 1
r1.output_ids.append(0)
r1.kv_committed_len = 14
check("after step 3 (decode)", [r1])

# step 4: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=2)
batch.seq_lens = torch.tensor([14])
batch.seq_lens_cpu = torch.tensor([14])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 2
r1.output_ids.append(0)
r1.kv_committed_len = 15
check("after step 4 (decode)", [r1])

# step 5: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE, forward_iter=3)
batch.seq_lens = torch.tensor([15])
batch.seq_lens_cpu = torch.tensor([15])
batch.req_pool_indices = torch.tensor([1])
batch.req_pool_indices_cpu = torch.tensor([1])
# the scheduler's gate before a decode batch: it evicts what the batch needs
batch.check_decode_mem()
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 3
r1.output_ids.append(0)
r1.kv_committed_len = 16
check("after step 5 (decode)", [r1])

print(f"SGLang {__version__}: every check held")
