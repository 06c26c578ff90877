"""Real SGLang 0.5.23 behind kvspec's adapter protocol (see docs/engines/sglang.md, section 10).

`SGLANG` drives SGLang's default Rust tree core, `SGLANG_PYTHON` its Python tree core;
both drive the same real allocator, request-to-token pool, requests and scheduler
allocation paths. Nothing of SGLang is imported until an adapter builds something.
"""

from functools import partial

from kvspec.conformance.harness.built_for import BuiltFor
from kvspec.conformance.harness.declarations import Capability

from .allocator import SglangAllocatorAdapter
from .engine import SglangEngine

CAPABILITIES = (Capability.PAGE_SIZE_1, Capability.PAGE_SIZE_GT_1, Capability.SWA_TAIL, Capability.PREFIX_SHARING,
                Capability.FREE_GROUPS, Capability.FULL_FREES, Capability.SEGMENT_FREES, Capability.CHUNKED_PREFILL,
                Capability.BATCHED_PREFILL, Capability.BATCHED_FINISH, Capability.FLUSH, Capability.WAITING_MATCHES,
                Capability.PD_DECODE, Capability.RECURRENT_STATE,
                Capability.SHORT_LEAF_CHECKPOINTS)
"""Not refuses_misuse, not atomic_alloc_decode, not releases_state_at_stop, not
pd_checkpoint_keeps_window: see the known divergences. recurrent_state: FULL + SWA + MAMBA
at page size 1 (adapters/sglang/state.py; not paged_recurrent_state: without its extra
buffer SGLang keeps a state at page size 1 only). short_leaf_checkpoints: 0.5.23's checkpoint
repoints from the node its insert ended on (adapters/sglang/releases/findings.py,
checkpoint-short-rematch)."""


class SGLANG:
    """SGLang 0.5.23 with its default (Rust) tree core."""

    name = "sglang"
    policy_version = "sglang-0.5.23"
    capabilities = CAPABILITIES
    observables = ("free_sets", "mapping", "rows")
    """The Rust tree core cannot be walked (see tree_view.py): its state view shows the
    slots of the checkpoints, not their nodes (state.py, UNKNOWN_NODE)."""
    preload = "kvspec.adapters.sglang.preload"
    built_for = BuiltFor("sglang", ("0.5.23",), "SGLang", family="sglang@",
                         install="pip install --no-deps -r adapters/sglang/requirements.txt")
    make_allocator = SglangAllocatorAdapter
    make_engine = staticmethod(partial(SglangEngine, tree="rust"))


class SGLANG_PYTHON(SGLANG):
    """SGLang 0.5.23 with its Python tree core."""

    name = "sglang-python"
    observables = ("free_sets", "mapping", "rows", "tree")
    make_engine = staticmethod(partial(SglangEngine, tree="python"))
