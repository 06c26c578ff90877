"""Real vLLM 0.33.0 (pinned) and 0.34.0 behind kvspec's adapter protocol (see
docs/engines/vllm.md, sections 6a and 11).

`VLLM` drives vLLM's v1 KV cache manager with the prefix-cache retention its engine
uses by default (`prefix_cache_retention_interval = 0`: a sliding-window group caches
only the blocks a later hit at the prompt's end can use); `VLLM_DENSE` with dense
retention (`None`, `KVCacheConfig`'s default: every full block is cached). The engine
tier only: vLLM has no two-pool allocator to drive.

`VLLM_SCHEDULER` and `VLLM_SCHEDULER_DENSE` put vLLM's own v1 `Scheduler` at the
scheduler tier (spec chapter 10; scheduler.py), with the same two retentions: its plans
are checked, and the memory of its KV cache manager as chapter 08 states it. Nothing of
vLLM is imported until an adapter builds something.
"""

from functools import partial

from kvspec.conformance.harness.built_for import BuiltFor
from kvspec.conformance.harness.declarations import Capability

from .engine import VllmEngine


def make_scheduler(config, retention="engine"):
    from .scheduler import VllmScheduler

    return VllmScheduler(config, retention)


CAPABILITIES = (Capability.PAGE_SIZE_1, Capability.PAGE_SIZE_GT_1, Capability.PREFIX_SHARING, Capability.CHUNKED_PREFILL,
                Capability.RECURRENT_STATE, Capability.PAGED_RECURRENT_STATE, Capability.RELEASES_STATE_AT_STOP,
                Capability.GROUP_LAYOUTS, Capability.PD_DECODE, Capability.PD_CHECKPOINT_KEEPS_WINDOW)
"""recurrent_state: a Mamba group (align mode) in the same block pool (spec chapter 09,
STATE-10..14), at every page size; a finish frees every state block the request holds.
group_layouts: the attention groups of any layout (BLOCK-11), a Mamba group after them.
pd_decode: a request whose prompt's KV a KV connector loads (LIFE-6: engine.py's pd_admit);
pd_checkpoint_keeps_window only lets those admissions be drawn at every window (I10 is the
two-pool model's). Not swa_tail or free_groups (allocator tier only); the two-pool
observables are not shown: one shared block pool is."""

BUILT_FOR = BuiltFor("vllm", ("0.33.0", "0.34.0"), "vLLM", family="vllm@",
                     install="pip install --no-deps -r adapters/vllm/requirements.txt")


class VLLM:
    """vLLM 0.33.0, its engine's default prefix-cache retention (0)."""

    name = "vllm"
    policy_version = "vllm-0.33"
    memory_model = "block-pool"
    capabilities = CAPABILITIES
    observables = ("rows", "block_pool", "kv_events")
    preload = "kvspec.adapters.vllm.preload"
    built_for = BUILT_FOR
    make_engine = staticmethod(partial(VllmEngine, retention=0))


class VLLM_DENSE(VLLM):
    """vLLM 0.33.0 with dense prefix-cache retention (None): policy vllm-0.33-dense (BLOCK-9)."""

    name = "vllm-dense"
    policy_version = "vllm-0.33-dense"
    make_engine = staticmethod(partial(VllmEngine, retention=None))


class VLLM_REPORT_FULL(VLLM):
    """vLLM 0.33.0 whose requests ask for `kv_cache_report_mode="full"` KV events: known
    divergence VLLM-1 (BLOCK-8). Not a built-in: `--adapter kvspec.adapters.vllm:VLLM_REPORT_FULL`."""

    name = "vllm-report-full"
    make_engine = staticmethod(partial(VllmEngine, retention=0, report_mode="full"))


class VLLM_SCHEDULER:
    """vLLM 0.33.0's own v1 Scheduler at the scheduler tier, its engine's default
    prefix-cache retention (CacheConfig's, 0)."""

    name = "vllm-scheduler"
    policy_version = VLLM.policy_version
    memory_model = VLLM.memory_model
    capabilities = (Capability.PAGE_SIZE_1, Capability.PAGE_SIZE_GT_1, Capability.PREFIX_SHARING,
                    Capability.CHUNKED_PREFILL)
    """Not preempts_only_when_needed: vLLM preempts for a request that then preempts itself,
    or before the same step's window releases (divergences VLLM-2, VLLM-3, SCHED-7)."""
    observables = VLLM.observables
    preload = VLLM.preload
    built_for = BUILT_FOR
    make_scheduler = staticmethod(make_scheduler)


class VLLM_SCHEDULER_DENSE(VLLM_SCHEDULER):
    """vLLM 0.33.0's own v1 Scheduler with dense prefix-cache retention (None: every
    full block of the sliding-window group is cached)."""

    name = "vllm-scheduler-dense"
    make_scheduler = staticmethod(partial(make_scheduler, retention=None))
