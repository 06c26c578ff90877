"""TokenSpeed's scheduler (tokenspeed-scheduler 0.1.42, compiled C++) behind kvspec's
scheduler tier (see README, "TokenSpeed's scheduler"; docs/engines/tokenspeed.md).

`TOKENSPEED` builds it with a snapshot pool, so that under page pressure it retracts a
request (its KV set aside, restored later); `TOKENSPEED_ABORTS` without one, so that it
aborts a victim instead; both with full and sliding-window groups. `TOKENSPEED_STATE`
adds a `State` group (the scheduler+state runs) and, since TokenSpeed then preempts
where its own page dedup would have made room (divergence TOKENSPEED-1, SCHED-7), runs
without page pressure. The scheduler tier only: TokenSpeed's memory cannot be driven
operation by operation. Nothing of TokenSpeed is imported until an adapter builds one.
"""

from functools import partial


def make_scheduler(config, retract: bool = True, force_retraction_every: int = 0):
    from .scheduler import TokenSpeedScheduler

    return TokenSpeedScheduler(config, retract, force_retraction_every)


class TOKENSPEED:
    """TokenSpeed 0.1.42 with a snapshot pool: it retracts under pressure."""

    name = "tokenspeed"
    policy_version = "vllm-0.33"  # the one policy of the shared block pool (chapter 08), its closest model
    memory_model = "block-pool"
    capabilities = ("page_size_1", "page_size_gt_1", "prefix_sharing", "chunked_prefill", "preempts_only_when_needed")
    preload = "kvspec.adapters.tokenspeed.runtime"
    make_scheduler = staticmethod(make_scheduler)


class TOKENSPEED_ABORTS(TOKENSPEED):
    """TokenSpeed 0.1.42 without a snapshot pool: it aborts a victim under pressure."""

    name = "tokenspeed-aborts"
    make_scheduler = staticmethod(partial(make_scheduler, retract=False))


class TOKENSPEED_STATE(TOKENSPEED):
    """TokenSpeed 0.1.42 with a snapshot pool and a `State` group beside full and sliding
    window (the scheduler+state runs, SCHED-9). Not preempts_only_when_needed: with a state
    group its decodes need fresh pages, and under pressure it retracts a request where the
    pages its own dedup frees in the same plan would have served the rows (TOKENSPEED-1),
    so its runs give every request room of its own."""

    name = "tokenspeed-state"
    capabilities = ("page_size_1", "page_size_gt_1", "prefix_sharing", "chunked_prefill", "state_group")
