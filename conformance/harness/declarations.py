"""What an adapter declares, and what a check is made of: data only.

The harness, the plan of a check, replay and every adapter read these; nothing here runs
an implementation or decides a verdict.

* `Tier`: the three levels at which kvspec drives an implementation.
* `Capability`: what an adapter may declare it has. Each member carries its one-line
  meaning, the tiers whose runs read it, what it turns on in those runs, and which trace
  steps need it. This is the one table: the protocol validates declarations against it,
  the plan lists what a check leaves out from it, and a replay skips a trace needing a
  capability the adapter lacks (docs/writing-an-adapter.md prints it).
* `Run` and the run matrix (`RUNS`): the state machines a check makes, by tier and
  configuration.
* `CRASH`: how a seeded bug declares that it is seen as a crash, not by an invariant.
"""

from dataclasses import dataclass

from kvspec.spec.outcomes import Name


class Tier(Name):
    """[OBS-1] Where kvspec drives an implementation: its allocator's operations (chapter
    02), its engine's request lifecycle (chapter 06), or its scheduler's plans (chapter 10)."""

    ALLOCATOR = "allocator"
    ENGINE = "engine"
    SCHEDULER = "scheduler"


class Capability(Name):
    """A capability an adapter may declare (`capabilities`). Without one, the rules that
    need it are not drawn and the traces that need it are skipped: reported as skipped,
    never as passed."""

    # value, tiers whose runs read it, meaning, what it turns on, which trace steps need it,
    # and the capability it refines (read only where that one is declared)
    PAGE_SIZE_1 = ("page_size_1", (Tier.ALLOCATOR, Tier.ENGINE, Tier.SCHEDULER),
                   "the implementation runs at page size 1 (token granularity)",
                   "the runs at page size 1", "a trace whose configuration has page_size 1")
    PAGE_SIZE_GT_1 = ("page_size_gt_1", (Tier.ALLOCATOR, Tier.ENGINE, Tier.SCHEDULER),
                      "the implementation runs at page sizes above 1",
                      "the runs at page sizes 2, 4 and 16", "a trace whose configuration has page_size > 1")
    SWA_TAIL = ("swa_tail", (Tier.ALLOCATOR,),
                "the allocator offers alloc_extend_swa_tail (ALLOC-5)",
                "SWA-tail allocations in the allocator runs", "a fork step with a tail")
    PREFIX_SHARING = ("prefix_sharing", (),
                      "the engine shares cached prefixes between requests",
                      "nothing: declared for information, no rule of this version reads it", "no step")
    FREE_GROUPS = ("free_groups", (Tier.ALLOCATOR,),
                   "the allocator batches frees between free_group_begin and free_group_end (ALLOC-7)",
                   "free groups in the allocator runs", "a free_group_begin or free_group_end step")
    FULL_FREES = ("full_frees", (Tier.ALLOCATOR,),
                  "the allocator offers free_full, the free of full slots whose SWA is released (ALLOC-6)",
                  "free_full of released ranges in the allocator runs; without it a released range is freed "
                  "with free (SGLang before 0.5.19)", "a refused free_full_with_live_peer step")
    SEGMENT_FREES = ("segment_frees", (Tier.ALLOCATOR,),
                     "the allocator offers free_segment, free_swa_segment and free_full_segment (ALLOC-6)",
                     "segment-shaped frees in the allocator runs; without them every free is set-shaped "
                     "(SGLang before 0.5.20)", "a refused free_swa_of_released or free_unaligned_segment step")
    CHUNKED_PREFILL = ("chunked_prefill", (Tier.ENGINE,),
                       "a prompt may be prefilled in several chunks (LIFE-3)",
                       "chunks shorter than the prompt; without it every prefill is one chunk",
                       "a prefill_chunk step shorter than what is left of its prompt")
    PD_DECODE = ("pd_decode", (Tier.ENGINE,),
                 "the engine offers pd_admit, the decode side's pre-allocation of a prefilled request (LIFE-6)",
                 "PD-decode admissions", "a pd_admit step")
    REFUSES_MISUSE = ("refuses_misuse", (Tier.ALLOCATOR,),
                      "an invalid free raises InvalidFree and changes nothing (ALLOC-6)",
                      "misuse in the allocator runs", "a refused free (free_padding_page, free_a_free_page, ...)")
    ATOMIC_ALLOC_DECODE = ("atomic_alloc_decode", (Tier.ALLOCATOR,),
                           "a failed alloc_decode changes nothing (ALLOC-4)",
                           "the full ALLOC-4 check of a failed alloc_decode; without it what must still hold is "
                           "checked", "no step (it changes what is checked)")
    RECURRENT_STATE = ("recurrent_state", (Tier.ENGINE,),
                       "engines built with state_slots keep a recurrent-state pool and show it (chapter 09)",
                       "the engine+state runs", "an engine trace with state_slots")
    PAGED_RECURRENT_STATE = ("paged_recurrent_state", (Tier.ENGINE,),
                             "recurrent state at page sizes above 1 (STATE-3)",
                             "the engine+state runs at page sizes above 1",
                             "an engine trace with state_slots and page_size > 1", "recurrent_state")
    RELEASES_STATE_AT_STOP = ("releases_state_at_stop", (Tier.ENGINE,),
                              "a finish with a stop past written outputs frees the working state (STATE-9)",
                              "finishes with such a stop in the engine+state runs",
                              "a finish with trim > 0 in a trace with state_slots", "recurrent_state")
    PREEMPTS_ONLY_WHEN_NEEDED = ("preempts_only_when_needed", (Tier.SCHEDULER,),
                                 "a plan preempts a request only when its rows need the pages (SCHED-7)",
                                 "pools too short for every request at once; without it every request has room",
                                 "a scheduler trace whose pool cannot hold all its requests at once")
    STATE_GROUP = ("state_group", (Tier.SCHEDULER,),
                   "the scheduler keeps a recurrent-state group beside the attention groups (SCHED-9)",
                   "the scheduler+state runs", "a scheduler trace with a state group")
    PD_CHECKPOINT_KEEPS_WINDOW = ("pd_checkpoint_keeps_window", (Tier.ENGINE,),
                                  "a PD-decode admission's checkpoint leaves its leaf a window at every window (I10)",
                                  "PD-decode admissions at windows where WIN-6's tail alone keeps none "
                                  "(kvspec.spec.window.pd_checkpoint_at_risk)",
                                  "a pd_admit step at such a window", "pd_decode")
    SHORT_LEAF_CHECKPOINTS = ("short_leaf_checkpoints", (Tier.ENGINE,),
                              "a checkpoint that leaves its new leaf short of a window (its version allows it) "
                              "still leaves the request exactly what lies past the insert (I4)",
                              "under the versions at risk (drop-margin, max-window-page), prefills whose "
                              "checkpoint leaves such a leaf (kvspec.spec.window.checkpoint_leaves_short_leaf); "
                              "without it the runs keep their prefills' ends clear of them, and a replay still "
                              "runs every trace",
                              "no step (it steers the runs only)")
    BATCHED_PREFILL = ("batched_prefill", (Tier.ENGINE,),
                       "the engine offers prefill_batch, one chunk of each of several requests in one step (LIFE-9)",
                       "prefill batches; without it every prefill step is one request's", "a prefill_batch step")
    BATCHED_FINISH = ("batched_finish", (Tier.ENGINE,),
                      "the engine offers finish_batch, the finishes of one decode batch inside one free group (LIFE-10)",
                      "finish batches; without it every finish step is one request's", "a finish_batch step")
    FLUSH = ("flush", (Tier.ENGINE,), "the engine offers flush, dropping its whole prefix cache while idle (LIFE-11)",
             "cache flushes; without it no run flushes", "a flush step")
    WAITING_MATCHES = ("waiting_matches", (Tier.ENGINE,),
                       "the engine offers match, a waiting request's prompt matched without admitting it (LIFE-12)",
                       "matches outside an admission; without them every match is an admission's", "a match step")
    GROUP_LAYOUTS = ("group_layouts", (Tier.ENGINE,),
                     "a shared block pool is built with any layout of attention groups (BLOCK-11)",
                     "layouts other than one full and one sliding-window group in the block-pool runs (full only, "
                     "a window only, several groups of a kind); without it every engine has the default layout",
                     "an engine trace whose configuration has a layout")

    def __new__(cls, value: str, tiers: tuple[Tier, ...], meaning: str, turns_on: str, needed_by: str,
                refines: str | None = None):
        member = str.__new__(cls, value)
        member._value_ = value
        member.tiers, member.meaning, member.turns_on, member.needed_by = tiers, meaning, turns_on, needed_by
        member.refines_name = refines
        return member

    @property
    def refines(self) -> "Capability | None":
        """The capability this one refines: it is read only where that one is declared."""
        return None if self.refines_name is None else Capability(self.refines_name)


OPTIONAL_OPERATIONS = {"prefill_batch": Capability.BATCHED_PREFILL, "finish_batch": Capability.BATCHED_FINISH,
                       "flush": Capability.FLUSH, "match": Capability.WAITING_MATCHES}
"""Engine operations an adapter offers only with a capability: required then, else never called."""


@dataclass(frozen=True)
class Run:
    """One conformance run, as `kvspec check` makes it: the allocator machine at a page
    size, the engine machine at a page size, window and decode eviction interval (with a
    recurrent-state checkpoint grid or not), or the scheduler machine at a page size and
    window (with a state group or not). A plan (kvspec.conformance.runs.plan) makes a run
    at one policy version of an adapter: a planned run."""

    page_size: int
    window: int | None = None
    interval: int | None = None
    state_grid: int | None = None
    """With recurrent state (chapter 09): its checkpoint grid; None: none."""
    scheduler: bool = False
    """The scheduler tier (chapter 10): the implementation's own scheduler plans."""
    state: bool = False
    """At the scheduler tier: a recurrent-state group beside the attention groups (SCHED-9)."""

    @property
    def tier(self) -> Tier:
        return Tier.SCHEDULER if self.scheduler else Tier.ALLOCATOR if self.window is None else Tier.ENGINE

    @property
    def recurrent(self) -> bool:
        """Whether the run keeps recurrent state (an engine+state or scheduler+state run)."""
        return self.state_grid is not None or self.state

    @property
    def settings(self) -> dict[str, int]:
        """Its configuration as the label writes it: P, W, I, G."""
        named = {"P": self.page_size, "W": self.window, "I": self.interval, "G": self.state_grid}
        return {key: value for key, value in named.items() if value is not None}

    @property
    def label(self) -> str:
        """How reports name the run at an adapter's own policy version, e.g. "engine P=4 W=6 I=4"."""
        return self.named(str(self.tier))

    def named(self, kind: str) -> str:
        """The label with `kind` in front (a tier, or another memory model's name)."""
        return f"{kind}{'+state' if self.recurrent else ''} " + " ".join(f"{k}={v}" for k, v in self.settings.items())


PAGE_SIZES = (1, 2, 4, 16)
"""The allocator tier's runs, one per page size."""
ENGINE_CONFIGS = (  # (page size, window, decode eviction interval): W % P == 0, 1..P-2, P-1, and P > W
    (1, 3, 4), (2, 5, 1), (4, 6, 4), (4, 7, 1), (4, 8, 1), (4, 8, 128), (16, 5, 4))
"""The engine tier's runs. The default interval 128 never fires in pools this small (a
request cannot outgrow its cursor by 128 tokens): (4, 8, 128) checks that nothing is
evicted before it is due, and (4, 8, 1) is the page-multiple window with decode
eviction firing."""
STATE_CONFIGS = ((1, 3, 4, 1), (2, 5, 1, 4), (4, 6, 4, 8))
"""The engine tier's runs with recurrent state (page size, window, interval, checkpoint
grid): every position a boundary (SGLang without its extra buffer needs page size 1),
and grids of two pages, so that hits and checkpoints fall on and off the grid."""
SCHEDULER_CONFIGS = ((1, 3), (2, 5), (4, 7), (4, 8), (16, 5))
"""The scheduler tier's runs (page size, window): W % P == 0, 1..P-2, P-1, and P > W."""
SCHEDULER_STATE_CONFIGS = ((1, 3), (4, 7))
"""The scheduler tier's runs with a recurrent-state group (page size, window)."""
RUNS = (*(Run(page_size) for page_size in PAGE_SIZES), *(Run(*config) for config in ENGINE_CONFIGS),
        *(Run(*config) for config in STATE_CONFIGS),
        *(Run(*config, scheduler=True) for config in SCHEDULER_CONFIGS),
        *(Run(*config, scheduler=True, state=True) for config in SCHEDULER_STATE_CONFIGS))
"""Every run a check makes (for the tiers and page sizes an adapter has)."""

CRASH = "crash"
"""The detection a mutant declares when no invariant can see its bug first: the step fails
inside the implementation (a refusal the spec requires of the allocator, ALLOC-6, or an
allocation the bug let through and the pool cannot serve), which the harness reports as
a crash with a shrunk, replayable trace. The mutant's `clause` then names the clause
whose refusal fires, and its `crash_message` the text the crash must show."""
