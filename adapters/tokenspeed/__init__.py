"""TokenSpeed's scheduler (tokenspeed-scheduler 0.1.42, compiled C++) behind kvspec's
scheduler tier (see README, "TokenSpeed's scheduler"; docs/engines/tokenspeed.md).

`TOKENSPEED` builds it with a snapshot pool, so that it retracts a request (its KV set
aside, restored later) where it must; `TOKENSPEED_ABORTS` without one, so that it aborts
a victim instead. Both with full, sliding-window and (the scheduler+state runs) `State`
groups. Only `TOKENSPEED_ABORTS` presses on the pool: the retracting build retracts a
request where its own page dedup in the same plan would have made room (divergence
TOKENSPEED-1, SCHED-7), so its runs give every request room of its own. The scheduler
tier only: TokenSpeed's memory cannot be driven operation by operation. Nothing of
TokenSpeed is imported until an adapter builds one.
"""

from functools import partial


def make_scheduler(config, retract: bool = True, force_retraction_every: int = 0):
    from .scheduler import TokenSpeedScheduler

    return TokenSpeedScheduler(config, retract, force_retraction_every)


class TOKENSPEED:
    """TokenSpeed 0.1.42 with a snapshot pool: it retracts where it must. Not
    preempts_only_when_needed (TOKENSPEED-1): its runs give every request room."""

    name = "tokenspeed"
    policy_version = "vllm-0.33"  # the one policy of the shared block pool (chapter 08), its closest model
    memory_model = "block-pool"
    capabilities = ("page_size_1", "page_size_gt_1", "prefix_sharing", "chunked_prefill", "state_group")
    """state_group: a `State` group beside full and sliding window (the scheduler+state runs, SCHED-9)."""
    preload = "kvspec.adapters.tokenspeed.runtime"
    make_scheduler = staticmethod(make_scheduler)


class TOKENSPEED_ABORTS(TOKENSPEED):
    """TokenSpeed 0.1.42 without a snapshot pool: it aborts a victim under pressure. Its runs
    press on the pool (TOKENSPEED-1 was not met without a snapshot pool)."""

    name = "tokenspeed-aborts"
    capabilities = (*TOKENSPEED.capabilities, "preempts_only_when_needed")
    make_scheduler = staticmethod(partial(make_scheduler, retract=False))
