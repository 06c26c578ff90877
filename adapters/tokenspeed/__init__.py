"""TokenSpeed's scheduler (tokenspeed-scheduler 0.1.42, compiled C++) behind kvspec's
scheduler tier (see docs/scheduler-tier.md and docs/engines/tokenspeed.md).

`TOKENSPEED` builds it with a snapshot pool, so that it retracts a request (its KV set
aside, restored later) where it must; `TOKENSPEED_ABORTS` without one, so that it aborts
a victim instead. Both with full, sliding-window and (the scheduler+state runs) `State`
groups. Both preempt a request where the plan's own page dedup would have made room
(divergence TOKENSPEED-1, SCHED-7), the retracting build far more often: its runs give
every request room of its own, and only `TOKENSPEED_ABORTS` presses on the pool (CI checks
it at a fixed seed, so that the gate does not turn on the recorded divergence). The scheduler
tier only: TokenSpeed's memory cannot be driven operation by operation. Nothing of
TokenSpeed is imported until an adapter builds one.
"""

from functools import partial

from kvspec.conformance.harness.built_for import BuiltFor
from kvspec.conformance.harness.declarations import Capability


def make_scheduler(config, retract: bool = True, force_retraction_every: int = 0):
    from .scheduler import TokenSpeedScheduler

    return TokenSpeedScheduler(config, retract, force_retraction_every)


class TOKENSPEED:
    """TokenSpeed 0.1.42 with a snapshot pool: it retracts where it must. Not
    preempts_only_when_needed (TOKENSPEED-1): its runs give every request room."""

    name = "tokenspeed"
    policy_version = "vllm-0.33"  # the one policy of the shared block pool (chapter 08), its closest model
    memory_model = "block-pool"
    capabilities = (Capability.PAGE_SIZE_1, Capability.PAGE_SIZE_GT_1, Capability.PREFIX_SHARING,
                    Capability.CHUNKED_PREFILL, Capability.STATE_GROUP)
    """state_group: a `State` group beside full and sliding window (the scheduler+state runs, SCHED-9)."""
    preload = "kvspec.adapters.tokenspeed.runtime"
    built_for = BuiltFor("tokenspeed-scheduler", ("0.1.42",), "TokenSpeed",
                         install="pip install --no-deps -r adapters/tokenspeed/requirements.txt")
    make_scheduler = staticmethod(make_scheduler)


class TOKENSPEED_ABORTS(TOKENSPEED):
    """TokenSpeed 0.1.42 without a snapshot pool: it aborts a victim under pressure. Its runs
    press on the pool: it aborts the newest resident, more often a request whose pages the
    plan needs, and meets TOKENSPEED-1 rarely (none of 38 ci-profile checks)."""

    name = "tokenspeed-aborts"
    capabilities = (*TOKENSPEED.capabilities, Capability.PREEMPTS_ONLY_WHEN_NEEDED)
    make_scheduler = staticmethod(partial(make_scheduler, retract=False))
