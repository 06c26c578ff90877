"""Adapters for the CLI tests, loaded by `module:attribute` as a third party's would be."""

from dataclasses import replace

from kvspec.adapters.reference import ADAPTER as REFERENCE
from kvspec.adapters.reference import ReferenceAllocatorAdapter, ReferenceEngineAdapter
from kvspec.reference.engine import TwoPoolEngine
from kvspec.reference.hybrid import HybridAllocator
from kvspec.spec.window import TWO_POOL_VERSIONS


class LeakyHybridAllocator(HybridAllocator):
    """A realistic bug: the segment free forgets the last page of a multi-page segment."""

    def free_segment(self, full_slots, start_pos):
        full_slots = self.as_slots(full_slots)
        if full_slots.numel() > self.page_size:
            full_slots = full_slots[:-1]
        super().free_segment(full_slots, start_pos)


class LeakyAllocatorAdapter(ReferenceAllocatorAdapter):
    def __init__(self, size_full, size_swa, page_size):
        self.allocator = LeakyHybridAllocator(size_full, size_swa, page_size)


class LEAKY:
    name = "leaky"
    policy_version = "sglang-0.5.23"
    capabilities = ("page_size_1", "page_size_gt_1", "full_frees", "segment_frees")
    make_allocator = LeakyAllocatorAdapter


class IncompleteAllocator:
    def __init__(self, size_full, size_swa, page_size):
        pass

    def state(self):
        raise AssertionError("never called: the adapter is refused before")


class INCOMPLETE:
    name = "incomplete"
    policy_version = "sglang-0.5.23"
    capabilities = ("page_size_1",)
    make_allocator = IncompleteAllocator


# -- engines for the harness's own tests: crash, hang, a divergence no invariant sees ----------

class CrashingEngine(ReferenceEngineAdapter):
    """Dies like a native extension with a null pointer: a segmentation fault in decode."""

    def decode(self, rid, token):
        import ctypes
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test's directory
        ctypes.string_at(0)


class HangingEngine(ReferenceEngineAdapter):
    """Deadlocks in decode."""

    def decode(self, rid, token):
        import threading

        threading.Event().wait()


class GreedyEvictionEngine(TwoPoolEngine):
    """Evicts twice what it is asked: every invariant holds, but the free counts differ
    from the spec's (LIFE-7), which only a comparison with the reference sees (OBS-3)."""

    def evict(self, full_tokens, swa_tokens):
        return super().evict(2 * full_tokens, 2 * swa_tokens)


class GreedyEvictionAdapter(ReferenceEngineAdapter):
    def __init__(self, config):
        self.engine = GreedyEvictionEngine(config)


def engine_adapter(name, make_engine, **extra):
    """An adapter of the reference's engine with one change: every version it implements."""
    return type(name, (), {"name": name.lower(), "policy_version": "sglang-0.5.23",
                           "policy_versions": TWO_POOL_VERSIONS, "make_engine": make_engine,
                           "capabilities": ("page_size_1", "page_size_gt_1", "pd_decode", "chunked_prefill"),
                           **extra})


CRASHING = engine_adapter("CRASHING", CrashingEngine)
HANGING = engine_adapter("HANGING", HangingEngine)
GREEDY_EVICTION = engine_adapter("GREEDY_EVICTION", GreedyEvictionAdapter)
class TreelessEngineAdapter(ReferenceEngineAdapter):
    """Shows no tree at all, as SGLang's Rust tree core cannot: no nodes, no ledgers."""

    def snapshot(self):
        return replace(self.engine.snapshot(), nodes=(), ledgers=None)


NO_TREE_DUMP = engine_adapter("NO_TREE_DUMP", TreelessEngineAdapter, observables=("free_sets", "mapping", "rows"))
"""An engine that cannot show its prefix tree: the checks that read it are skipped."""


def highest_pages_first(allocator: HybridAllocator) -> HybridAllocator:
    """The same allocator handing out its pages in the opposite order (MODEL-5: no check
    may care which free page an allocation returns)."""
    for pool in (allocator.full, allocator.swa):
        pool.free_stack[:pool.free_top] = pool.free_stack[:pool.free_top].flip(0).clone()
    return allocator


class HighestPagesFirstAllocatorAdapter(ReferenceAllocatorAdapter):
    def __init__(self, size_full, size_swa, page_size):
        self.allocator = highest_pages_first(HybridAllocator(size_full, size_swa, page_size))


class HighestPagesFirstEngineAdapter(ReferenceEngineAdapter):
    def __init__(self, config):
        super().__init__(config)
        highest_pages_first(self.engine.allocator)


HIGHEST_PAGES_FIRST = engine_adapter("HIGHEST_PAGES_FIRST", HighestPagesFirstEngineAdapter,
                                     make_allocator=HighestPagesFirstAllocatorAdapter,
                                     capabilities=REFERENCE.capabilities)


class TwoBugsHybridAllocator(LeakyHybridAllocator):
    """Two bugs at once, of distinct clauses: the leaky segment free (I2) and a decode
    that allocates each pool on its own (I15), the bug zoo's non-atomic-decode."""

    def alloc_decode(self, seq_lens, last_loc):
        from kvspec.adapters.mutants.allocator import NonAtomicDecodeAllocator

        return NonAtomicDecodeAllocator.alloc_decode(self, seq_lens, last_loc)


class TwoBugsAllocatorAdapter(ReferenceAllocatorAdapter):
    def __init__(self, size_full, size_swa, page_size):
        self.allocator = TwoBugsHybridAllocator(size_full, size_swa, page_size)


class TWO_BUGS(LEAKY):
    name = "two-bugs"
    capabilities = (*LEAKY.capabilities, "atomic_alloc_decode")
    make_allocator = TwoBugsAllocatorAdapter
