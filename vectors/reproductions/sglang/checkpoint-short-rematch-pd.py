"""checkpoint-short-rematch: a bug of SGLang 0.5.19 - 0.5.22 (fixed in 0.5.23), shown with SGLang alone.

    PYTHONPATH=<the folder holding SGLang's sglang/> python checkpoint-short-rematch-pd.py

Exit status 0: every check held. An AssertionError: the bug, in plain terms. It fails on SGLang
0.5.22 and passes on 0.5.23, which fixed it.

SGLang 0.5.19 - 0.5.22 (bug checkpoint-short-rematch, reached by a PD-decode admission;
docs/engines/sglang-findings.md): a decode server takes a 15-token prompt at W = 6, P = 4; its
SWA tail starts at floor_page(15 - 1 - max(W, P)) = 8 (pd-tail-not-rounded's arithmetic), and
process_prebuilt's checkpoint inserts [0, 12) with live SWA on [8, 12) only, short of a window.
These releases match again after the insert and trust the match, which stops at 0: the request
keeps the 12 slots the tree now owns (a page owned twice: I2, I3, I4 on the Python tree), and on
the Rust tree the drain frees them twice (I1, or the allocator's assertion). 0.5.23 re-points
the request to the tree and shows the short leaf itself (I10, SGL-11). Written by hand from
SGL-11's admission.

What it checks: the tree's KV is allocated; no full KV slot has two owners.

Written by kvspec from the trace vectors/regressions/sglang/checkpoint-short-rematch-pd.jsonl
(`python -m kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.22-python --out
checkpoint-short-rematch-pd.py`): the SGLang calls that kvspec's adapter of SGLang 0.5.22 makes
for each step, in order, with their arguments, on CPU with tiny pools: page size 4, window 6,
UnifiedRadixCache with its Python tree core; SGLANG_SWA_EVICTION_INTERVAL=4. Replayed there
without the checks, SGLang raised an AssertionError of its own in step 2: the file ends with
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
from sglang.srt.disaggregation.decode import DecodePreallocQueue
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_disagg, publish, reset_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

PAGE_SIZE = 4
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
check("after step 1 (pd_admit)", [r1])

# step 2: the end: every request is released (those decoding finish, the others are aborted), then the whole
# tree is evicted
# r1 finishes
r1.finished_reason = FINISH_LENGTH(length=1)
# here SGLang raised, on the release this file was written on: AssertionError
release_kv_cache(r1, tree_cache, checkpoint=True)

print(f"SGLang {__version__}: every check held")
