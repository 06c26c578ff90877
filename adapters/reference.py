"""The reference model behind the adapter protocol: at the allocator tier the two-pool
allocator's operations, with slot tensors turned into lists of ints so the harness never
sees torch; at the engine tier the engine of either memory model, by policy version."""

from collections.abc import Sequence

from kvspec.conformance.harness.declarations import Capability
from kvspec.reference import HybridAllocator
from kvspec.spec.accounting import AllocatorState
from kvspec.spec.allocator import ALLOCATIONS, AllocatorOperation
from kvspec.spec.lifecycle import EngineOperation
from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.window import BLOCK_POOL_VERSIONS, TWO_POOL_VERSIONS


def as_list(result):
    return result if isinstance(result, OutOfMemory) else result.tolist()


PASSED_THROUGH = frozenset(AllocatorOperation) - ALLOCATIONS - {AllocatorOperation.TRANSLATE}
"""The allocator's frees, free groups and clear: they take lists and return nothing."""


class ReferenceAllocatorAdapter:
    name = "reference"

    def __init__(self, size_full: int, size_swa: int, page_size: int, device: str = "cpu"):
        self.allocator = HybridAllocator(size_full, size_swa, page_size, device=device)

    def state(self) -> AllocatorState:
        return self.allocator.state()

    def available_sizes(self) -> tuple[int, int]:
        return self.allocator.full_available_size(), self.allocator.swa_available_size()

    def alloc(self, num_tokens: int) -> list[int] | OutOfMemory:
        return as_list(self.allocator.alloc(num_tokens))

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_loc: Sequence[int]):
        return as_list(self.allocator.alloc_extend(prefix_lens, seq_lens, last_loc))

    def alloc_decode(self, seq_lens: Sequence[int], last_loc: Sequence[int]):
        return as_list(self.allocator.alloc_decode(seq_lens, last_loc))

    def alloc_extend_swa_tail(self, prefix_len: int, seq_len: int, last_loc: int, swa_tail_len: int):
        return as_list(self.allocator.alloc_extend_swa_tail(prefix_len, seq_len, last_loc, swa_tail_len))

    def translate(self, full_slots: Sequence[int]) -> list[int]:
        return self.allocator.translate(list(full_slots)).tolist()

    def __getattr__(self, operation):
        # Frees, free groups and clear take lists and return nothing: pass them through.
        if operation in PASSED_THROUGH:
            return getattr(self.allocator, operation)
        raise AttributeError(operation)


class ReferenceEngineAdapter:
    """The reference engine behind the engine-tier adapter protocol: operations take and
    return plain data. Its memory model follows from the configuration's policy version:
    the two-pool engine (allocator, prefix tree, request lifecycle; chapters 01-07) or
    the shared block pool (chapter 08)."""

    name = "reference"

    def __init__(self, config, device: str = "cpu"):
        from kvspec.reference.block_pool_engine import BlockPoolEngine
        from kvspec.reference.engine import TwoPoolEngine

        shared = config.policy.version in BLOCK_POOL_VERSIONS
        self.engine = (BlockPoolEngine if shared else TwoPoolEngine)(config, device=device)

    def snapshot(self):
        return self.engine.snapshot()

    def __getattr__(self, operation):
        # the operations, and a partial snapshot (OBS-4) where the engine shows one (the two-pool engine)
        if operation in {*EngineOperation, "partial_snapshot"}:
            return getattr(self.engine, operation)
        raise AttributeError(operation)


def make_scheduler(config, device: str = "cpu"):
    """The reference scheduler (chapter 10) over the reference's shared block pool, with a
    recurrent-state group where the configuration names one (SCHED-9): its operations
    take and return the spec's plain data already."""
    from kvspec.reference.scheduler import ReferenceScheduler

    return ReferenceScheduler(config, device=device)


BLOCK_POOL_CAPABILITIES = (Capability.PAGE_SIZE_1, Capability.PAGE_SIZE_GT_1, Capability.PREFIX_SHARING,
                           Capability.CHUNKED_PREFILL, Capability.PD_DECODE, Capability.PD_CHECKPOINT_KEEPS_WINDOW,
                           Capability.GROUP_LAYOUTS)
"""The shared block pool's engines: no recurrent-state group (chapter 09 is modelled on the two-pool engine)."""


class ADAPTER:
    """kvspec's reference model, as an adapter (see kvspec.conformance.harness.protocol):
    both memory models, the two-pool one first."""

    name = "reference"
    policy_version = "sglang-0.5.23"
    # every version of chapters 01-07 and of chapter 08: kvspec.spec.window decides
    policy_versions = (*TWO_POOL_VERSIONS, *BLOCK_POOL_VERSIONS)
    capabilities = tuple(Capability)  # all of them: the reference implements its whole spec
    """At the scheduler tier: preempts_only_when_needed (SCHED-7) and state_group, the
    reference scheduler's recurrent-state group (the scheduler+state runs, SCHED-9)."""
    version_capabilities = {version: BLOCK_POOL_CAPABILITIES for version in BLOCK_POOL_VERSIONS}
    make_allocator = ReferenceAllocatorAdapter
    make_engine = ReferenceEngineAdapter
    make_scheduler = staticmethod(make_scheduler)
