"""Importing real SGLang (0.5.23, or the release a `sglang@` adapter activated) on a CPU-only machine, and the global state it needs.

Importing SGLang's memory-cache modules pulls in its model configs, some of which
import `torchvision` at module level. PyPI only has CUDA builds of torchvision: next to
the CPU torch it is missing or fails to import ("operator torchvision::nms does not
exist"). When, and only when, the real torchvision cannot be imported, a stub module
tree stands in for it: every attribute is a placeholder class, and calling anything
in it raises. No path kvspec drives calls torchvision; the stub only lets the imports
finish. (`triton`, which SGLang also imports at module level, is installed for real: a
stub would have to fool torch's own triton detection too.)

Everything SGLang needs is imported here once, so the adapters read one namespace and
the forkserver can preload it (`PRELOAD`).
"""

import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import types
import warnings

STUBBED = "torchvision"


class _Unavailable(type):
    """A placeholder class: any attribute is another placeholder, calling one raises."""

    def __getattr__(cls, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Unavailable(f"{cls.__name__}.{attribute}", (), {})

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__name__} is part of kvspec's torchvision stub; the real torchvision "
                           f"is not importable here, and kvspec's SGLang adapter never needs it")


class _StubModule(types.ModuleType):
    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Unavailable(f"{self.__name__}.{attribute}", (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `torchvision` and its submodules as stub modules."""

    def find_spec(self, name, path, target=None):
        if name == STUBBED or name.startswith(STUBBED + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+kvspec.stub"
        return module

    def exec_module(self, module):
        pass


def torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or a CUDA build that fails to load beside CPU torch
        for name in [m for m in sys.modules if m == STUBBED or m.startswith(STUBBED + ".")]:
            del sys.modules[name]  # a half-imported real torchvision must not linger
        return False
    return True


def install_torchvision_stub_if_needed() -> bool:
    """Put the stub on the import path unless the real torchvision imports; True if it did."""
    if any(isinstance(finder, _StubFinder) for finder in sys.meta_path):
        return True
    if torchvision_importable():
        return False
    sys.meta_path.insert(0, _StubFinder())
    return True


SYMBOLS = {
    # name: where it is, newest release first ("module:attribute"; the releases moved some)
    "torch": ("torch",),
    "runtime_context": ("sglang.srt.runtime_context",),
    "server_args": ("sglang.srt.server_args",),
    "FINISH_LENGTH": ("sglang.srt.managers.schedule_batch:FINISH_LENGTH",),
    "Req": ("sglang.srt.managers.schedule_batch:Req",),
    "ScheduleBatch": ("sglang.srt.managers.schedule_batch:ScheduleBatch",),
    "alloc_for_decode": ("sglang.srt.mem_cache.allocation:alloc_for_decode", "sglang.srt.mem_cache.common:alloc_for_decode"),
    "ensure_mamba_capacity": ("sglang.srt.mem_cache.allocation:ensure_mamba_capacity",),
    "alloc_for_extend": ("sglang.srt.mem_cache.allocation:alloc_for_extend", "sglang.srt.mem_cache.common:alloc_for_extend"),
    "SWATokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator.swa:SWATokenToKVPoolAllocator",
                                  "sglang.srt.mem_cache.swa_memory_pool:SWATokenToKVPoolAllocator"),
    "paged": ("sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.allocator"),
    "EvictParams": ("sglang.srt.mem_cache.base_prefix_cache:EvictParams",),
    "CacheInitParams": ("sglang.srt.mem_cache.cache_init_params:CacheInitParams",),
    "common": ("sglang.srt.mem_cache.common",),
    "checkpoint_kv_cache": ("sglang.srt.mem_cache.common:checkpoint_kv_cache",),
    "release_kv_cache": ("sglang.srt.mem_cache.common:release_kv_cache",),
    # a waiting request's match: the cache-aware policies' (0.5.22 moved it from the policy)
    "match_waiting": ("sglang.srt.mem_cache.common:match_kv_cache",
                      "sglang.srt.managers.schedule_policy:match_prefix_for_req"),
    "ReqToTokenPool": ("sglang.srt.mem_cache.memory_pool:ReqToTokenPool",),
    "SWAKVPool": ("sglang.srt.mem_cache.swa_memory_pool:SWAKVPool",),
    "ComponentType": ("sglang.srt.mem_cache.unified_cache.component_type:ComponentType",
                      "sglang.srt.mem_cache.unified_cache_components:ComponentType"),
    "UnifiedRadixCache": ("sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache",),
    "SWARadixCache": ("sglang.srt.mem_cache.swa_radix_cache:SWARadixCache",),
    "SWAChunkCache": ("sglang.srt.mem_cache.chunk_cache:SWAChunkCache",),
    "ForwardMode": ("sglang.srt.model_executor.forward_batch_info:ForwardMode",),
    "SamplingParams": ("sglang.srt.sampling.sampling_params:SamplingParams",),
    "ServerArgs": ("sglang.srt.server_args:ServerArgs",),
}
"""What the adapters drive. A name a release does not have is None there (the release
adapters know which generation has what; 0.5.23 has all but SWARadixCache and SWAChunkCache)."""


def locate(candidates: tuple[str, ...]):
    for candidate in candidates:
        module, _, attribute = candidate.partition(":")
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if not (error.name and module.startswith(error.name)):
                raise  # the module exists but something it imports does not
            continue
        if not attribute:
            return found
        if hasattr(found, attribute):
            return getattr(found, attribute)
    return None


BEFORE_IMPORT: list = []
"""Functions run just before this process imports SGLang: a release adapter's workarounds
for an import that fails beside kvspec's pinned packages (adapters/sglang/releases/)."""


def import_sglang() -> types.SimpleNamespace:
    """SGLang's classes and functions the adapters drive (imports take about 5-15 s)."""
    install_torchvision_stub_if_needed()
    for hook in BEFORE_IMPORT:
        hook()
    logging.getLogger("sglang").setLevel(logging.CRITICAL)  # a failed allocation logs a page of state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Only CUDA ... support AWQ/GGUF": true, and irrelevant here
        found = types.SimpleNamespace(**{name: locate(candidates) for name, candidates in SYMBOLS.items()})
    found.version = importlib.import_module("sglang.version").__version__
    return found


SGLANG = None


def sglang() -> types.SimpleNamespace:
    global SGLANG
    if SGLANG is None:
        SGLANG = import_sglang()
    return SGLANG


def publish_server_args(page_size: int, eviction_interval: int, mamba_chunk_size: int | None = None) -> None:
    """SGLang reads its settings from a process-wide context (and a few environment
    variables, read at each use); set them for one engine. SGLang's own invariant
    checks stay at their default (off): kvspec must see what they would.

    `mamba_chunk_size`, for a model with recurrent layers: the model's Mamba chunk size,
    which SGLang otherwise reads from the model's HF config (arg_groups/overrides.py:1907,
    a pre-seeded `_mamba_cache_chunk_size` is honoured as-is, as SGLang's own fixtures do)."""
    os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = str(eviction_interval)
    s = sglang()
    server_args = s.ServerArgs(model_path="dummy", page_size=page_size, attention_backend="torch_native")
    if mamba_chunk_size is not None:
        server_args._mamba_cache_chunk_size = mamba_chunk_size
    if hasattr(s.runtime_context, "publish"):  # from 0.5.17
        s.runtime_context.reset_context()
        s.runtime_context.publish(server_args, role="scheduler")
    else:  # 0.5.14 - 0.5.16: a module global
        if hasattr(s.runtime_context, "reset_context"):
            s.runtime_context.reset_context()
        s.server_args.set_global_server_args_for_scheduler(server_args)
