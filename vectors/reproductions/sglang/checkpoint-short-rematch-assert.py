"""checkpoint-short-rematch: a bug of SGLang 0.5.15 - 0.5.22 (fixed in 0.5.23), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python checkpoint-short-rematch-assert.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.22 and passes on 0.5.23, which fixed it.

SGLang 0.5.15-0.5.22 (bug checkpoint-short-rematch, docs/engines/sglang-findings.md), where the
insert finds part of its key in the tree: r2 (19 tokens, its first page shared with r1's prompt)
is prefilled in chunks of 17 and 2 and finished, so the tree holds its path with the shared page
[0, 4) an SWA tombstone. r1 (16 tokens, admitted before, matching nothing) prefills 15: its
checkpoint's window eviction keeps max(W, P) = 6 tokens, so the cursor is 8, and the insert of
[0, 12) finds [0, 4) in the tree (new_prefix_len = 4) and adds the leaf [4, 12) with 4 live SWA
tokens, fewer than W. The match after the insert cannot pass the tombstone with so few live
tokens above it and returns nothing, and SGLang's own assertion new_prefix_len <=
len(new_indices) fires, on both tree cores. Found by the history table
(sglang@0.5.19-rust+early-swa-unlock, the knob not involved: the same trace crashes the release
at default knobs), shrunk by hand from 11 steps.

It checks nothing of its own: SGLang's own assertion is what fails.

Written by kvspec from the trace
vectors/regressions/sglang/checkpoint-short-rematch-assert.jsonl (`python -m
kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.22-python --out
checkpoint-short-rematch-assert.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.22
makes for each step, in order, with their arguments, on CPU with tiny pools: page size 4, window
6, UnifiedRadixCache with its Python tree core; SGLANG_SWA_EVICTION_INTERVAL=4. Replayed there
without the checks, SGLang raised an AssertionError of its own in step 6: the file ends with
that call. kvspec's account: docs/engines/sglang-findings.md#checkpoint-short-rematch.
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
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.mem_cache.allocation import alloc_for_extend
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
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

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=4, attention_backend="torch_native")
reset_context()
publish(server_args, role="scheduler")

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=96, size_swa=56, page_size=4, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
allocator = SWATokenToKVPoolAllocator(size=96, size_swa=56, page_size=4, dtype=torch.bfloat16, device="cpu",
                                      kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=100, device="cpu", enable_memory_saver=False)
cache_init_params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=4, sliding_window_size=6,
                                    eviction_policy="lru",
                                    tree_components=(ComponentType.FULL, ComponentType.SWA),
                                    tree_core_backend="python")
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


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: admit r1 (16 prompt tokens): the scheduler matches its prompt against the tree and locks the node
# the match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="", origin_input_ids=array("q", [0] * 16),
         sampling_params=sampling_params)
# the prefix match
r1.init_next_round_input(tree_cache)
r1.lock = tree_cache.lock(r1.last_node)

# step 2: admit r2 (19 prompt tokens): the scheduler matches its prompt against the tree and locks the node
# the match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r2 = Req(rid="r2", origin_input_text="",
         origin_input_ids=array("q", [0, 0, 0, 0, 1, 2, 2, 0, 1, 0, 1, 0, 2, 0, 2, 0, 0, 2, 2]),
         sampling_params=sampling_params)
# the prefix match
r2.init_next_round_input(tree_cache)
r2.lock = tree_cache.lock(r2.last_node)

# step 3: extend r2 by its prompt's next chunk (at most 17 tokens), then checkpoint it into the tree
r2.refresh_fill_ids()
r2.extend_end = 17
batch = schedule_batch([r2], ForwardMode.EXTEND)
batch.prefix_lens = [r2.prefix_len]
batch.extend_lens = [17]
batch.extend_num_tokens = 17
batch.seq_lens = torch.tensor([17])
batch.seq_lens_cpu = torch.tensor([17])
# the eviction an extend's allocation makes first
allocator.evict_to_free_tokens(tree_cache, 21)
alloc_for_extend(batch)
r2.extend_batch_idx = 1
checkpoint_kv_cache(r2, tree_cache)

# step 4: extend r2 by its prompt's next chunk (at most 17 tokens), then checkpoint it into the tree
r2.refresh_fill_ids()
r2.extend_end = 19
batch = schedule_batch([r2], ForwardMode.EXTEND)
batch.prefix_lens = [r2.prefix_len]
batch.extend_lens = [2]
batch.extend_num_tokens = 2
batch.seq_lens = torch.tensor([19])
batch.seq_lens_cpu = torch.tensor([19])
# the eviction an extend's allocation makes first
allocator.evict_to_free_tokens(tree_cache, 6)
alloc_for_extend(batch)
r2.extend_batch_idx = 2
checkpoint_kv_cache(r2, tree_cache)
r2.output_ids.append(0)

# step 5: r2 finishes; its KV goes into the tree
r2.finished_reason = FINISH_LENGTH(length=1)
release_kv_cache(r2, tree_cache, checkpoint=True)

# step 6: extend r1 by its prompt's next chunk (at most 15 tokens), then checkpoint it into the tree
r1.refresh_fill_ids()
r1.extend_end = 15
batch = schedule_batch([r1], ForwardMode.EXTEND)
batch.prefix_lens = [r1.prefix_len]
batch.extend_lens = [15]
batch.extend_num_tokens = 15
batch.seq_lens = torch.tensor([15])
batch.seq_lens_cpu = torch.tensor([15])
# the eviction an extend's allocation makes first
allocator.evict_to_free_tokens(tree_cache, 19)
alloc_for_extend(batch)
r1.extend_batch_idx = 1
# here SGLang raised, on the release this file was written on: AssertionError
checkpoint_kv_cache(r1, tree_cache)

print(f"SGLang {__version__}: every check held")
