"""pd-swa-lock-released-twice: a bug of SGLang 0.5.19 (fixed in 0.5.20), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python pd-swa-lock-released-twice-rust.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.19. On 0.5.20, which fixed it, the calls differ (a request's SWA lock is `req.lock_receipt`
there, `req.swa_uuid_for_lock` in 0.5.19): the same trace written for it (`--member
sglang@0.5.20-rust`) passes there.

SGLang 0.5.19's Rust tree core (bug pd-swa-lock-released-twice;
docs/engines/sglang-findings.md): the double release of a PD admission's SWA lock
(vectors/regressions/sglang/pd-swa-lock-released-twice.jsonl), on the core whose tree cannot be
walked. A decode server admits r2 (3 tokens), then r3 (17 tokens), whose match takes r2's path;
pop_preallocated gives the match's SWA lock back, and the admission checkpoint's
cache_unfinished_req releases the old lock whole, SWA included (0.5.19
mem_cache/unified_radix_cache.py:1010, the Python wrapper both tree cores share). On the Python
tree that breaks I11 at r3's admission (r2's node, SWA lock 0). On the Rust core the lock counts
go wrong unseen until r1, whose prompt shares the path, is prefilled in a batch: its
checkpoint's match returns less than the request protects and SGLang's own assertion fires
(cache_protected_len <= len(new_indices) + page_size - 1, :1000). 0.5.19 with 0.5.20's fix
applied by hand (skip_swa=req.swa_prefix_lock_released at :1010) passes it on both trees, as
0.5.20 - 0.5.23 do. Found by the whole matrix (sglang@0.5.19-rust at its default knobs, ci
profile, engine P=2 W=5 I=1, 41 steps), shrunk to 9 by deleting steps while the assertion still
fired.

It checks nothing of its own: SGLang's own assertion is what fails.

Written by kvspec from the trace
vectors/regressions/sglang/pd-swa-lock-released-twice-rust.jsonl (`python -m
kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.19-rust --out
pd-swa-lock-released-twice-rust.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.19
makes for each step, in order, with their arguments, on CPU with tiny pools: page size 2, window
5, UnifiedRadixCache with its Rust tree core, which offers no walk of its nodes (what needs one
is not checked); SGLANG_SWA_EVICTION_INTERVAL=1, SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust.
Replayed there without the checks, SGLang raised an AssertionError of its own in step 9: the
file ends with that call. kvspec's account:
docs/engines/sglang-findings.md#pd-swa-lock-released-twice.
"""

import os
import sys
import types
import warnings
from array import array
from types import SimpleNamespace

# SGLang reads its knobs from the environment: this run's, and the release's defaults for the rest.
os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = "1"
os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "rust"
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
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.mem_cache.allocation import alloc_for_extend
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
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

WINDOW = 5

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=2, attention_backend="torch_native")
reset_context()
publish(server_args, role="scheduler")

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=36, size_swa=16, page_size=2, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
allocator = SWATokenToKVPoolAllocator(size=36, size_swa=16, page_size=2, dtype=torch.bfloat16, device="cpu",
                                      kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=38, device="cpu", enable_memory_saver=False)
cache_init_params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=2, sliding_window_size=5,
                                    eviction_policy="lru",
                                    tree_components=(ComponentType.FULL, ComponentType.SWA))
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


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: admit r1 (14 prompt tokens): the scheduler matches its prompt against the tree and locks the node
# the match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="", origin_input_ids=array("q", [0] * 14),
         sampling_params=sampling_params)
# the prefix match
r1.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(r1.last_node)
r1.swa_uuid_for_lock = None
r1.skip_lock_node_ids = {}

# step 2: a PD decode server takes r2 (3 prompt tokens, their KV computed by a prefill server): match,
# pre-allocate, then checkpoint the prompt into the tree
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r2 = Req(rid="r2", origin_input_text="", origin_input_ids=array("q", [0, 0, 0]),
         sampling_params=sampling_params)
queue = prealloc_queue()
with get_disagg().override(disaggregation_decode_enable_radix_cache=True):  # SGLang's decode-side radix cache on
    decode_prefix_match = queue._match_prefix_and_lock(r2)
    queue._reclaim_swa_tail_capacity(3, "r2")
    queue._pre_alloc(r2, decode_prefix_match.prefix_indices, decode_prefix_match.l1_prefix_len,
                     decode_prefix_match.decode_prefix_len)
    r2.kv.cache_protected_len = decode_prefix_match.decode_prefix_len
    r2.output_ids.append(1)
    r2.swa_branching_seqlen = None
    maybe_cache_unfinished_req(r2, tree_cache, chunked=False)

# step 3: a PD decode server takes r3 (17 prompt tokens, their KV computed by a prefill server): match,
# pre-allocate, then checkpoint the prompt into the tree
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r3 = Req(rid="r3", origin_input_text="",
         origin_input_ids=array("q", [0, 0, 0, 0, 2, 1, 0, 1, 0, 2, 0, 0, 1, 0, 1, 0, 0]),
         sampling_params=sampling_params)
queue = prealloc_queue()
with get_disagg().override(disaggregation_decode_enable_radix_cache=True):  # SGLang's decode-side radix cache on
    decode_prefix_match = queue._match_prefix_and_lock(r3)
    tree_cache.dec_swa_lock_only(r3.last_node, None)
    r3.swa_prefix_lock_released = True
    queue._reclaim_swa_tail_capacity(7, "r3")
    queue._pre_alloc(r3, decode_prefix_match.prefix_indices, decode_prefix_match.l1_prefix_len,
                     decode_prefix_match.decode_prefix_len)
    r3.kv.cache_protected_len = decode_prefix_match.decode_prefix_len
    r3.output_ids.append(1)
    r3.swa_branching_seqlen = None
    maybe_cache_unfinished_req(r3, tree_cache, chunked=False)

# step 4: admit r4 (16 prompt tokens): the scheduler matches its prompt against the tree and locks the node
# the match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r4 = Req(rid="r4", origin_input_text="",
         origin_input_ids=array("q", [0, 0, 0, 0, 1, 1, 1, 2, 0, 2, 2, 0, 2, 1, 1, 1]),
         sampling_params=sampling_params)
# the prefix match
r4.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(r4.last_node)
r4.swa_uuid_for_lock = None
r4.skip_lock_node_ids = {}

# step 5: r2 is aborted: its KV is released
release_kv_cache(r2, tree_cache, is_insert=False)

# step 6: admit r5 (18 prompt tokens): the scheduler matches its prompt against the tree and locks the node
# the match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r5 = Req(rid="r5", origin_input_text="",
         origin_input_ids=array("q", [0, 0, 0, 0, 2, 2, 1, 2, 1, 1, 0, 1, 0, 0, 1, 2, 1, 0]),
         sampling_params=sampling_params)
# the prefix match
r5.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(r5.last_node)
r5.swa_uuid_for_lock = None
r5.skip_lock_node_ids = {}

# step 7: r4 is aborted: its KV is released
tree_cache._dec_req_lock(r4)

# step 8: r3 finishes; its KV goes into the tree
r3.finished_reason = FINISH_LENGTH(length=1)
release_kv_cache(r3, tree_cache, is_insert=True)

# step 9: one extend batch (at most r5: 4 tokens, r1: 10 tokens); the requests whose prompts it completes are
# checkpointed into the tree, or released if their first token ends them
r5._refresh_fill_ids()
r5.set_extend_range(2, 6)
r1._refresh_fill_ids()
r1.set_extend_range(0, 10)
batch = schedule_batch([r5, r1], ForwardMode.EXTEND)
batch.prefix_lens = [2, 0]
batch.extend_lens = [4, 10]
batch.extend_num_tokens = 14
batch.seq_lens = torch.tensor([6, 10])
batch.seq_lens_cpu = torch.tensor([6, 10])
# the eviction an extend's allocation makes first
allocator.evict_to_free_tokens(tree_cache, 18)
alloc_for_extend(batch)
r5.extend_batch_idx = 1
r1.extend_batch_idx = 1
# the batch's results are processed inside one free group
allocator.free_group_begin()
allocator.free_group_end()
# here SGLang raised, on the release this file was written on: AssertionError
maybe_cache_unfinished_req(r5, tree_cache, chunked=True)

print(f"SGLang {__version__}: every check held")
