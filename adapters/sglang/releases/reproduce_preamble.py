"""What a reproduction (reproduce.py) sets up before the trace's steps, as the text it writes:
what the adapter does once per process rather than per engine (adapters/sglang/runtime.py and
the release shims: the torchvision stand-in, the config registration of SGLang <= 0.5.19, the
CPU allocation kernels of SGLang <= 0.5.21), the helpers the adapter's `batch()`, PD queue and
0.5.14 extend range stand for (checked against them by reproduce_replay.py), and the arguments
it passes only where a release has them (`PORTABLE`)."""

import re

PORTABLE = {
    # an argument the adapter passes only where the release has it, as the file passes it
    "enable_kvcache_transpose": ("KVCACHE_TRANSPOSE", '''
# 0.5.14's SWAKVPool requires enable_kvcache_transpose (and asserts it is off); later releases have no such
# argument: pass it where SWAKVPool takes it, as kvspec's adapter does.
KVCACHE_TRANSPOSE = {"enable_kvcache_transpose": False} \\
    if "enable_kvcache_transpose" in inspect.signature(SWAKVPool).parameters else {}
'''),
}

TORCHVISION = '''
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
'''

WARNINGS = '''
# SGLang warns at import that its quantization kernels need a GPU: true, and beside the point here.
warnings.filterwarnings("ignore", message="Only CUDA")
'''

SHIPPED_CONFIGS = '''
# Up to 0.5.19 SGLang registers its qwen3_asr configs without exist_ok, and newer transformers
# ship that model type themselves: let the registration pass, as SGLang 0.5.20 does.
from transformers import AutoConfig

register = AutoConfig.register
AutoConfig.register = staticmethod(lambda model_type, config, exist_ok=False: register(model_type, config, True))
'''

CPU_KERNELS = '''
# Up to 0.5.21 the paged allocator launches Triton kernels, which need a GPU. On CPU, run the
# torch code SGLang 0.5.22 runs instead: the release's own alloc_extend_naive{and_decode}.
import {paged} as paged


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
'''

CPU_DECODE_KERNEL = '''

def alloc_decode(seq_lens, last_loc, free_pages, out_indices, _block, page_size):
    need_new_page = ((seq_lens - 1) % page_size == 0).to(torch.int64)
    num_new_pages = int(need_new_page.sum())
    if num_new_pages == 0:
        out_indices.copy_(last_loc + 1)
    elif num_new_pages <= free_pages.numel():
        rank = (torch.cumsum(need_new_page, 0) - need_new_page).clamp_(max=num_new_pages - 1)
        out_indices.copy_(torch.where(need_new_page.bool(), free_pages[rank] * page_size, last_loc + 1))
'''

BATCH = '''

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
'''
BATCH_FIELDS = frozenset(re.findall(r"batch\.(\w+) =", BATCH))
"""What BATCH sets: exactly what the adapter's `batch()` sets (checked at each batch)."""


EXTEND_RANGE = '''

def set_extend_range(req, start, end):
    """This round's extend of the request, tokens [start, end): SGLang 0.5.15 sets it with
    set_extend_range, 0.5.14 with set_extend_input_len and fill_len."""
    req._refresh_fill_ids()
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(start, end)
    else:
        req.set_extend_input_len(end - start)
        req.fill_len = end
'''

PD_QUEUE = '''

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
'''
PD_QUEUE_FIELDS = frozenset(re.findall(r"queue\.(\w+) =", PD_QUEUE))
"""What PD_QUEUE sets: exactly what pd_decode.prealloc_queue sets (checked at each admission)."""

HELPERS = "\0helpers"
"""Where the file's helpers go among the recorded lines: after the tree is built."""
