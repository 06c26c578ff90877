"""What a trace needs of an implementation beyond its tier and policy version: capabilities.

A trace's header says it (`needs`, front matter that kvspec writes for every trace it
writes, front_matter.py); a trace whose header does not, such as a hand-written one, has
them derived from its configuration and steps by `derived_needs`, the one rule that
also writes the header's. A replay skips a trace that needs a capability its adapter
lacks, and reports it as skipped, never as passed (replay.unmet_requirements).

The header may say more than the steps show: a trace whose steps any engine can run may
still need, say, `atomic_alloc_decode` to mean what it records.
"""

from kvspec.spec.scheduler import STATE, pages_alone
from kvspec.spec.window import pd_checkpoint_at_risk

from .allocator_driver import REFUSALS
from .declarations import Capability
from .trace import Trace

NOT_FROM_STEPS = {
    Capability.PREFIX_SHARING: "declared for information: no rule of this version reads it",
    Capability.ATOMIC_ALLOC_DECODE: "it changes what is checked of a failed alloc_decode, not what can run",
    Capability.CHUNKED_PREFILL: "replay has never skipped a trace for it (every engine adapter kvspec ships "
                                "declares it): deriving it from short chunks would turn an adapter's failures "
                                "into skips, so it is left to a header that says it",
    Capability.SHORT_LEAF_CHECKPOINTS: "it steers the runs clear of a recorded bug's shape; a trace that meets "
                                       "the shape must still replay everywhere, so that bisection sees where it "
                                       "reproduces",
}
"""The capabilities `derived_needs` never derives, and why (the table's `needed_by` says which
steps need each; tests/test_traces.py requires every other capability to have a rule)."""


def derived_needs(trace: Trace) -> tuple[Capability, ...]:
    """[the capability table] The capabilities a replay of the trace needs, from its
    configuration and steps, in the table's order: the page size it runs at, and what its
    steps call (Capability.needed_by), each as replay has always derived it."""
    config, steps = trace.config, trace.steps
    page_size = config["page_size"]
    operations = {step.op for step in steps}
    engine, scheduler = trace.tier == "engine", trace.tier == "scheduler"
    state = engine and bool(config.get("state_slots"))
    needed = {
        Capability.PAGE_SIZE_1: page_size == 1,
        Capability.PAGE_SIZE_GT_1: page_size > 1,
        Capability.SWA_TAIL: any(step.op == "fork" and step.args.get("tail") is not None for step in steps),
        Capability.FREE_GROUPS: any(operation.startswith("free_group") for operation in operations),
        Capability.PD_DECODE: "pd_admit" in operations,
        # an admission checkpoint at such a window can be short (I10)
        Capability.PD_CHECKPOINT_KEEPS_WINDOW: "pd_admit" in operations and page_size > 1
                                               and pd_checkpoint_at_risk(config["window"], page_size),
        Capability.REFUSES_MISUSE: bool(operations & set(REFUSALS)),  # a misuse refused unchanged (ALLOC-6)
        Capability.FULL_FREES: "free_full_with_live_peer" in operations,  # refusals of those very calls
        Capability.SEGMENT_FREES: bool(operations & {"free_swa_of_released", "free_unaligned_segment"}),
        Capability.RECURRENT_STATE: state,
        Capability.PAGED_RECURRENT_STATE: state and page_size > 1,
        # a stop past written outputs (STATE-9)
        Capability.RELEASES_STATE_AT_STOP: state and any(step.op == "finish" and step.args.get("trim")
                                                         for step in steps),
        # its pool cannot hold every request of it at once (SCHED-7)
        Capability.PREEMPTS_ONLY_WHEN_NEEDED: scheduler and pressed(trace),
        # a recurrent-state group beside the attention groups (SCHED-9)
        Capability.STATE_GROUP: scheduler and STATE in config["groups"],
        Capability.BATCHED_PREFILL: "prefill_batch" in operations,
        Capability.BATCHED_FINISH: "finish_batch" in operations,
        Capability.FLUSH: "flush" in operations,
        Capability.WAITING_MATCHES: "match" in operations,
        Capability.GROUP_LAYOUTS: engine and "layout" in config,
    }
    return tuple(capability for capability in Capability if needed.get(capability))


def needs(trace: Trace) -> tuple[str, ...]:
    """What its header says it needs, or, where the header does not say, `derived_needs`."""
    return trace.needs if trace.needs is not None else derived_needs(trace)


def pressed(trace: Trace) -> bool:
    """Whether a scheduler trace's pool is short of holding every request it submits at
    once (pages_alone each): then a scheduler may need to preempt."""
    config = trace.scheduler_config()
    return sum(pages_alone(config, len(step.args["prompt"]), step.args["max_new_tokens"])
               for step in trace.steps if step.op == "submit") > config.pages
