"""grouped-swa-free-remap: a bug of SGLang 0.5.18 (fixed in 0.5.19), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python grouped-swa-free-remap.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.18 and passes on 0.5.19, which fixed it.

SGLang 0.5.18 (bug grouped-swa-free-remap, docs/engines/sglang-findings.md): a and b, b's prompt
the first 22 of a's 28 tokens, prefilled in one batch; the batch's results are checkpointed
inside one free group. a's checkpoint releases the SWA of [0, 16) (cursor 16), queued with its
full slots, their mapping not yet read; b's (cursor 12) revives [12, 16), which a's lock holds
full, by mapping those full slots onto b's SWA; the group's end then reads the mapping and frees
b's SWA page under the live node (I3, I5, I13). 0.5.19 resolves the mapping when the free is
queued: it passes, as 0.5.17 (no group) and later releases do.

What it checks: the tree's KV is allocated; no full KV slot has two owners.

Written by kvspec from the trace vectors/regressions/sglang/grouped-swa-free-remap.jsonl
(`python -m kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.18 --out
grouped-swa-free-remap.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.18 makes for
each step, in order, with their arguments, on CPU with tiny pools: page size 4, window 8,
UnifiedRadixCache with its Python tree core; SGLANG_SWA_EVICTION_INTERVAL=1,
SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python. kvspec's account:
docs/engines/sglang-findings.md#grouped-swa-free-remap.
"""

import os
import sys
import types
import warnings
from array import array
from types import SimpleNamespace

# SGLang reads its knobs from the environment: this run's, and the release's defaults for the rest.
os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = "1"
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
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.mem_cache.allocation import alloc_for_extend
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import evict_from_tree_cache, maybe_cache_unfinished_req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import publish, reset_context
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

PAGE_SIZE = 4

# SGLang reads its settings from a process-wide context, which its scheduler publishes
server_args = ServerArgs(model_path="dummy", page_size=4, attention_backend="torch_native")
reset_context()
publish(server_args, role="scheduler")

# The KV pools of a model with a sliding-window layer and a full-attention layer (one head of dimension 1:
# what is checked is which slots hold KV, not the KV), and the request-to-token pool
kvcache = SWAKVPool(size=128, size_swa=64, page_size=4, dtype=torch.bfloat16, head_num=1, head_dim=1,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu")
allocator = SWATokenToKVPoolAllocator(size=128, size_swa=64, page_size=4, dtype=torch.bfloat16, device="cpu",
                                      kvcache=kvcache, need_sort=False)
req_to_token_pool = ReqToTokenPool(size=4, max_context_len=132, device="cpu", enable_memory_saver=False)
cache_init_params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                                    token_to_kv_pool_allocator=allocator, page_size=4, sliding_window_size=8,
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


# -- what must hold ------------------------------------------------------------------------------------------


def free_pages(pool):
    """A pool's free list: its free pages and those freed since it last sorted them."""
    pages = pool.free_pages.tolist()
    return pages if pool.release_pages is None else pages + pool.release_pages.tolist()


def tree_nodes():
    """Every node of the prefix tree but its root: (node, its full slots, its SWA slots or None
    where its SWA KV was released (a tombstone), its full lock count)."""
    stack = list(tree_cache.tree_core.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        full, swa = node.component(ComponentType.FULL), node.component(ComponentType.SWA)
        yield node, full.value.tolist(), None if swa.value is None else swa.value.tolist(), full.lock_ref


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


def check(after, requests):
    """What must hold after every step."""
    check_tree_is_allocated(after, requests)
    check_one_owner(after, requests)


# -- the trace's steps ----------------------------------------------------------------------------------------

# step 1: admit a (28 prompt tokens): the scheduler matches its prompt against the tree and locks the node the
# match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
a = Req(rid="a", origin_input_text="", origin_input_ids=array("q", [0] * 28), sampling_params=sampling_params)
# the prefix match
a.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(a.last_node)
a.swa_uuid_for_lock = None
a.skip_lock_node_ids = {}
check("after step 1 (admit)", [a])

# step 2: admit b (22 prompt tokens): the scheduler matches its prompt against the tree and locks the node the
# match ends on
sampling_params = SamplingParams(temperature=0, max_new_tokens=1073741824)
sampling_params.normalize(None)
b = Req(rid="b", origin_input_text="", origin_input_ids=array("q", [0] * 22), sampling_params=sampling_params)
# the prefix match
b.init_next_round_input(tree_cache)
tree_cache.inc_lock_ref(b.last_node)
b.swa_uuid_for_lock = None
b.skip_lock_node_ids = {}
check("after step 2 (admit)", [a, b])

# step 3: one extend batch (at most a: 28 tokens, b: 22 tokens); the requests whose prompts it completes are
# checkpointed into the tree, or released if their first token ends them
a._refresh_fill_ids()
a.set_extend_range(0, 28)
b._refresh_fill_ids()
b.set_extend_range(0, 22)
batch = schedule_batch([a, b], ForwardMode.EXTEND)
batch.prefix_lens = [0, 0]
batch.extend_lens = [28, 22]
batch.extend_num_tokens = 50
batch.seq_lens = torch.tensor([28, 22])
batch.seq_lens_cpu = torch.tensor([28, 22])
# the eviction an extend's allocation makes first
evict_from_tree_cache(tree_cache, 58)
alloc_for_extend(batch)
a.kv_committed_len = a.extend_range.end
a.extend_batch_idx = 1
b.kv_committed_len = b.extend_range.end
b.extend_batch_idx = 1
# the batch's results are processed inside one free group
allocator.free_group_begin()
maybe_cache_unfinished_req(a, tree_cache, chunked=False)
a.output_ids.append(0)
maybe_cache_unfinished_req(b, tree_cache, chunked=False)
b.output_ids.append(0)
allocator.free_group_end()
check("after step 3 (prefill_batch)", [a, b])

print(f"SGLang {__version__}: every check held")
