"""checkpoint-short-rematch: a bug of SGLang 0.5.22 (fixed in 0.5.23), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python checkpoint-short-rematch-finish.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.22 and passes on 0.5.23, which fixed it.

SGLang 0.5.22 (bug checkpoint-short-rematch, its finish path; docs/engines/sglang-findings.md):
a request decodes until its cursor is at 12, then finishes at a stop 8 tokens back; the finish's
checkpoint inserts [0, 12), all below the cursor, matches again, and the match falls short of
the insert: SGLang's own assertion (new_prefix_len <= len(new_indices)) stops the finish on the
Python tree; on the Rust tree the drain then frees pages twice (I1). Written by hand from a
36-step counterexample of kvspec check.

What it checks: every page is free, once, when nothing holds KV.

Written by kvspec from the trace
vectors/regressions/sglang/checkpoint-short-rematch-finish.jsonl (`python -m
kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.22 --out
checkpoint-short-rematch-finish.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.22
makes for each step, in order, with their arguments, on CPU with tiny pools: page size 4, window
7, UnifiedRadixCache with its Rust tree core, which offers no walk of its nodes (what needs one
is not checked); SGLANG_SWA_EVICTION_INTERVAL=1. kvspec's account:
docs/engines/sglang-findings.md#checkpoint-short-rematch.
"""

import os
import sys
import types
import warnings
from array import array
from types import SimpleNamespace

# SGLang reads its knobs from the environment: this run's, and the release's defaults for the rest.
os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = "1"
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
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.mem_cache.allocation import alloc_for_decode, alloc_for_extend
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import publish, reset_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

PAGE_SIZE = 4

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
cache_init_params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=4, sliding_window_size=7,
                                    eviction_policy="lru",
                                    tree_components=(ComponentType.FULL, ComponentType.SWA),
                                    tree_core_backend="rust")
tree_cache = UnifiedRadixCache(cache_init_params)


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


def free_pages(pool):
    """A pool's free list: its free pages and those freed since it last sorted them."""
    pages = pool.free_pages.tolist()
    return pages if pool.release_pages is None else pages + pool.release_pages.tolist()


def check_drained(after):
    """Every page is free, once, when nothing holds KV: with every request released and the
    whole tree evicted, each pool's free list holds each of its pages once (kvspec I1 - I3)."""
    for name, pool in (("full", allocator.full_attn_allocator), ("SWA", allocator.swa_attn_allocator)):
        free = free_pages(pool)
        twice = sorted({page for page in free if free.count(page) > 1})
        assert not twice, f"{after}: {name} pages {twice} are on the free list twice: freed twice"
        missing = sorted(set(range(1, pool.size // PAGE_SIZE + 1)) - set(free))
        assert not missing, f"{after}: {name} pages {missing} are not free, though nothing holds KV any more"


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: admit r1 (3 prompt tokens): the scheduler matches its prompt against the tree and locks the node the
# match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="", origin_input_ids=array("q", [1, 2, 3]),
         sampling_params=sampling_params)
# the prefix match
r1.init_next_round_input(tree_cache)
r1.lock = tree_cache.lock(r1.last_node)

# step 2: extend r1 by its prompt's next chunk (at most 3 tokens), then checkpoint it into the tree
r1.refresh_fill_ids()
r1.extend_end = 3
batch = schedule_batch([r1], ForwardMode.EXTEND)
batch.prefix_lens = [r1.prefix_len]
batch.extend_lens = [3]
batch.extend_num_tokens = 3
batch.seq_lens = torch.tensor([3])
batch.seq_lens_cpu = torch.tensor([3])
# the eviction an extend's allocation makes first
allocator.evict_to_free_tokens(tree_cache, 7)
alloc_for_extend(batch)
r1.extend_batch_idx = 1
checkpoint_kv_cache(r1, tree_cache)
r1.output_ids.append(0)

# step 3: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([3])
batch.seq_lens_cpu = torch.tensor([3])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 1
r1.output_ids.append(0)

# step 4: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([4])
batch.seq_lens_cpu = torch.tensor([4])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=4, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 2
r1.output_ids.append(0)

# step 5: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([5])
batch.seq_lens_cpu = torch.tensor([5])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 3
r1.output_ids.append(0)

# step 6: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([6])
batch.seq_lens_cpu = torch.tensor([6])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 4
r1.output_ids.append(0)

# step 7: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([7])
batch.seq_lens_cpu = torch.tensor([7])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 5
r1.output_ids.append(0)

# step 8: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([8])
batch.seq_lens_cpu = torch.tensor([8])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=4, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 6
r1.output_ids.append(0)

# step 9: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([9])
batch.seq_lens_cpu = torch.tensor([9])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 7
r1.output_ids.append(0)

# step 10: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([10])
batch.seq_lens_cpu = torch.tensor([10])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 8
r1.output_ids.append(0)

# step 11: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([11])
batch.seq_lens_cpu = torch.tensor([11])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 9
r1.output_ids.append(0)

# step 12: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([12])
batch.seq_lens_cpu = torch.tensor([12])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=4, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 10
r1.output_ids.append(0)

# step 13: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([13])
batch.seq_lens_cpu = torch.tensor([13])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 11
r1.output_ids.append(0)

# step 14: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([14])
batch.seq_lens_cpu = torch.tensor([14])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 12
r1.output_ids.append(0)

# step 15: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([15])
batch.seq_lens_cpu = torch.tensor([15])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 13
r1.output_ids.append(0)

# step 16: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([16])
batch.seq_lens_cpu = torch.tensor([16])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=4, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 14
r1.output_ids.append(0)

# step 17: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([17])
batch.seq_lens_cpu = torch.tensor([17])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 15
r1.output_ids.append(0)

# step 18: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([18])
batch.seq_lens_cpu = torch.tensor([18])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 16
r1.output_ids.append(0)

# step 19: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([19])
batch.seq_lens_cpu = torch.tensor([19])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 17
r1.output_ids.append(0)

# step 20: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([20])
batch.seq_lens_cpu = torch.tensor([20])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=4, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 18
r1.output_ids.append(0)

# step 21: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([21])
batch.seq_lens_cpu = torch.tensor([21])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 19
r1.output_ids.append(0)

# step 22: one decode step of r1
batch = schedule_batch([r1], ForwardMode.DECODE)
batch.seq_lens = torch.tensor([22])
batch.seq_lens_cpu = torch.tensor([22])
batch.req_pool_indices = torch.tensor([4])
batch.req_pool_indices_cpu = torch.tensor([4])
# the scheduler's gate before a decode batch: it evicts what the batch needs
allocator.check_decode_capacity(num_tokens=0, tree_cache=tree_cache, requests=[r1])
alloc_for_decode(batch, token_per_req=1)
r1.decode_batch_idx = 20
r1.output_ids.append(0)

# step 23: r1 finishes at a stop 8 tokens back; its KV goes into the tree
r1.finished_reason = FINISH_LENGTH(length=21)
r1.finished_len = 12
release_kv_cache(r1, tree_cache, checkpoint=True)

# step 24: the end: every request is released (those decoding finish, the others are aborted), then the whole
# tree is evicted
# evict the whole tree
tree_cache.evict(EvictParams(num_tokens=64, swa_num_tokens=64))
check_drained("after step 24 (drain)")

print(f"SGLang {__version__}: every check held")
