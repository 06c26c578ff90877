"""kvspec.reference: the executable model of hybrid full/SWA KV-cache memory management,
on torch tensors (CPU by default, any torch device works). Every decision calls a
kvspec.spec definition; the tensors only hold the state."""

from .hybrid import HybridAllocator
from .pool import PoolAllocator

__all__ = ["PoolAllocator", "HybridAllocator"]
