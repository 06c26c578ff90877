"""revive-frees-locked-full: a bug of SGLang 0.5.14 (fixed in 0.5.15), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python revive-frees-locked-full.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.14 and passes on 0.5.15, which fixed it.

SGLang 0.5.14, both trees (bug revive-frees-locked-full, docs/engines/sglang-findings.md): r2's
chunks leave a tombstoned node whose full KV r2 still locks and reads; r1's insert of the same
prefix revives it by freeing the node's full slots and putting r1's in their place, so a running
request's full KV is freed under it (I11, I14). Shrunk by kvspec check on 0.5.14.

What it checks: the tree's KV is allocated; no full KV slot has two owners; a running request's
KV stays allocated.

Written by kvspec from the trace vectors/regressions/sglang/revive-frees-locked-full.jsonl
(`python -m kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.14 --out
revive-frees-locked-full.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.14 makes for
each step, in order, with their arguments, on CPU with tiny pools: page size 1, window 3, the
legacy SWARadixCache; SGLANG_SWA_EVICTION_INTERVAL=4. kvspec's account:
docs/engines/sglang-findings.md#revive-frees-locked-full.
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
from sglang.srt.mem_cache.common import alloc_for_extend, evict_from_tree_cache, maybe_cache_unfinished_req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache
from sglang.srt.mem_cache.unified_cache_components.tree_component import ComponentType
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.version import __version__

PAGE_SIZE = 1

# 0.5.14's SWAKVPool requires enable_kvcache_transpose (and asserts it is off); later releases have no such
# argument: pass it where SWAKVPool takes it, as kvspec's adapter does.
KVCACHE_TRANSPOSE = {"enable_kvcache_transpose": False} \
    if "enable_kvcache_transpose" in inspect.signature(SWAKVPool).parameters else {}

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=1, attention_backend="torch_native")
set_global_server_args_for_scheduler(server_args)

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=21, size_swa=6, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu",
                    **KVCACHE_TRANSPOSE)
allocator = SWATokenToKVPoolAllocator(size=21, size_swa=6, page_size=1, dtype=torch.bfloat16, device="cpu",
                                      kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=22, device="cpu", enable_memory_saver=False)
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


def free_pages(pool):
    """A pool's free list: its free pages and those freed since it last sorted them."""
    pages = pool.free_pages.tolist()
    return pages if pool.release_pages is None else pages + pool.release_pages.tolist()


def tree_nodes():
    """Every node of the prefix tree but its root: (node, its full slots, its SWA slots or None
    where its SWA KV was released (a tombstone), its full lock count)."""
    stack = list(tree_cache.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        yield (node, node.value.tolist(), None if node.swa_tombstone else
               allocator.full_to_swa_index_mapping[node.value].tolist(), node.full_lock_ref)


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


def check_tree_is_allocated(after, requests):
    """The tree's KV is allocated: no full slot of a tree node is on the free list, nor the SWA
    slot of a position whose SWA KV is live (a node that is no tombstone), and that SWA slot is
    the one the allocator maps the position's full slot to (kvspec I2 - I5, I13)."""
    free_full = set(free_pages(allocator.full_attn_allocator))
    free_swa = set(free_pages(allocator.swa_attn_allocator))
    mapping = allocator.full_to_swa_index_mapping.tolist()
    for node, full, swa, _ in tree_nodes():
        freed = [slot for slot in full if slot // PAGE_SIZE in free_full]
        assert not freed, (f"{after}: tree node {node.id} holds full slots {freed}, but their pages are free: "
                           f"the next allocation hands them to another request")
        for full_slot, swa_slot in zip(full, swa or ()):
            assert swa_slot // PAGE_SIZE not in free_swa, (
                f"{after}: tree node {node.id} holds live SWA slot {swa_slot} (for full slot {full_slot}), "
                f"but its page {swa_slot // PAGE_SIZE} is free: the next allocation hands it to another request")
            assert mapping[full_slot] == swa_slot, (
                f"{after}: tree node {node.id} holds full slot {full_slot} with live SWA slot {swa_slot}, "
                f"but the allocator maps full slot {full_slot} to SWA slot {mapping[full_slot]}")


def check_one_owner(after, requests):
    """No full KV slot has two owners: what a request owns (its row from cache_protected_len
    on) the tree does not hold too, or both free it (kvspec I4)."""
    in_tree = {slot for _, full, _, _ in tree_nodes() for slot in full}
    for req in requests:
        if (kv := kv_of(req)) is None:
            continue
        row, protected, _, allocated = kv
        both = sorted(in_tree.intersection(req_to_token_pool.req_to_token[row, protected:allocated].tolist()))
        assert not both, (f"{after}: request {req.rid} owns full slots {both} (its row from cache_protected_len "
                          f"{protected} on), and the tree holds them too: two owners, which both free them")


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


def check(after, requests):
    """What must hold after every step."""
    check_tree_is_allocated(after, requests)
    check_one_owner(after, requests)
    check_rows_are_allocated(after, requests)


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: admit r1 (1 prompt tokens): the scheduler matches its prompt against the tree and locks the node the
# match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r1 = Req(rid="r1", origin_input_text="", origin_input_ids=array("q", [0]), sampling_params=sampling_params)
# the prefix match
r1.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(r1.last_node)
r1.swa_uuid_for_lock = None
check("after step 1 (admit)", [r1])

# step 2: admit r2 (6 prompt tokens): the scheduler matches its prompt against the tree and locks the node the
# match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
r2 = Req(rid="r2", origin_input_text="", origin_input_ids=array("q", [0] * 6),
         sampling_params=sampling_params)
# the prefix match
r2.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(r2.last_node)
r2.swa_uuid_for_lock = None
check("after step 2 (admit)", [r1, r2])

# step 3: extend r2 by its prompt's next chunk (at most 3 tokens), then checkpoint it into the tree
set_extend_range(r2, 0, 3)
batch = schedule_batch([r2], ForwardMode.EXTEND)
batch.prefix_lens = [0]
batch.extend_lens = [3]
batch.extend_num_tokens = 3
batch.seq_lens = torch.tensor([3])
batch.seq_lens_cpu = torch.tensor([3])
# the eviction an extend's allocation makes first
evict_from_tree_cache(tree_cache, 3)
alloc_for_extend(batch)
r2.kv_committed_len = 3
r2.kv_allocated_len = 3
r2.extend_batch_idx = 1
maybe_cache_unfinished_req(r2, tree_cache, chunked=True)
check("after step 3 (prefill_chunk)", [r1, r2])

# step 4: extend r2 by its prompt's next chunk (at most 3 tokens), then checkpoint it into the tree
set_extend_range(r2, 3, 6)
batch = schedule_batch([r2], ForwardMode.EXTEND, forward_iter=1)
batch.prefix_lens = [3]
batch.extend_lens = [3]
batch.extend_num_tokens = 3
batch.seq_lens = torch.tensor([6])
batch.seq_lens_cpu = torch.tensor([6])
# the eviction an extend's allocation makes first
evict_from_tree_cache(tree_cache, 3)
alloc_for_extend(batch)
r2.kv_committed_len = 6
r2.kv_allocated_len = 6
r2.extend_batch_idx = 2
maybe_cache_unfinished_req(r2, tree_cache, chunked=False)
r2.output_ids.append(0)
check("after step 4 (prefill_chunk)", [r1, r2])

# step 5: extend r1 by its prompt's next chunk (at most 1 tokens), then checkpoint it into the tree
set_extend_range(r1, 0, 1)
batch = schedule_batch([r1], ForwardMode.EXTEND, forward_iter=2)
batch.prefix_lens = [0]
batch.extend_lens = [1]
batch.extend_num_tokens = 1
batch.seq_lens = torch.tensor([1])
batch.seq_lens_cpu = torch.tensor([1])
# the eviction an extend's allocation makes first
evict_from_tree_cache(tree_cache, 1)
alloc_for_extend(batch)
r1.kv_committed_len = 1
r1.kv_allocated_len = 1
r1.extend_batch_idx = 1
maybe_cache_unfinished_req(r1, tree_cache, chunked=False)
r1.output_ids.append(0)
check("after step 5 (prefill_chunk)", [r1, r2])

print(f"SGLang {__version__}: every check held")
