"""Importing real SGLang 0.5.23 on a CPU-only machine, and the global state it needs.

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


def import_sglang() -> types.SimpleNamespace:
    """SGLang's classes and functions the adapters drive (imports take about 5-15 s)."""
    install_torchvision_stub_if_needed()
    logging.getLogger("sglang").setLevel(logging.CRITICAL)  # a failed allocation logs a page of state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Only CUDA ... support AWQ/GGUF": true, and irrelevant here
        import torch
        from sglang.srt import runtime_context
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
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
    return types.SimpleNamespace(
        torch=torch, runtime_context=runtime_context, FINISH_LENGTH=FINISH_LENGTH, Req=Req, ScheduleBatch=ScheduleBatch,
        alloc_for_decode=alloc_for_decode, alloc_for_extend=alloc_for_extend,
        SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator, EvictParams=EvictParams, CacheInitParams=CacheInitParams,
        checkpoint_kv_cache=checkpoint_kv_cache, release_kv_cache=release_kv_cache, ReqToTokenPool=ReqToTokenPool,
        SWAKVPool=SWAKVPool, ComponentType=ComponentType, UnifiedRadixCache=UnifiedRadixCache,
        ForwardMode=ForwardMode, SamplingParams=SamplingParams, ServerArgs=ServerArgs)


SGLANG = None


def sglang() -> types.SimpleNamespace:
    global SGLANG
    if SGLANG is None:
        SGLANG = import_sglang()
    return SGLANG


def publish_server_args(page_size: int, eviction_interval: int) -> None:
    """SGLang reads its settings from a process-wide context (and a few environment
    variables, read at each use); set them for one engine. SGLang's own invariant
    checks stay at their default (off): kvspec must see what they would."""
    os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = str(eviction_interval)
    s = sglang()
    s.runtime_context.reset_context()
    s.runtime_context.publish(s.ServerArgs(model_path="dummy", page_size=page_size,
                                           attention_backend="torch_native"), role="scheduler")
