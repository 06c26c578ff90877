"""Recurrent-state bugs (chapter 09): the state pool, copy-on-write, checkpoints, state
locks and the release of a request's state, one seeded bug per clause."""

from kvspec.conformance.harness.declarations import Run
from kvspec.reference.engine import TwoPoolEngine
from kvspec.reference.state import StateComponent

from .seeding import Mutant, with_names

GRID_1 = Run(page_size=1, window=3, interval=4, state_grid=1)
GRID_4 = Run(page_size=2, window=5, interval=1, state_grid=4)


def engine_with_state_component(component_class: type[StateComponent]) -> type[TwoPoolEngine]:
    """The reference engine whose prefix tree keeps its checkpoints with a seeded component."""

    class SeededEngine(TwoPoolEngine):
        def __init__(self, config, device="cpu"):
            super().__init__(config, device)
            if self.tree is not None and self.tree.state is not None:  # still empty here
                self.tree.state = component_class(self.tree, self.states)
                self.tree.components = (self.tree.full, self.tree.swa, self.tree.state)

    return SeededEngine


class LeakOnFailedAdmissionEngine(TwoPoolEngine):
    def undo_admission(self, request):
        request.state_slot = None  # BUG: the slot taken for the admission is forgotten, not freed
        super().undo_admission(request)


class LEAK_STATE_ON_FAILED_ADMISSION(Mutant, slug="leak-state-on-failed-admission",
                                     engine=LeakOnFailedAdmissionEngine):
    """An admission that takes a working state slot and then fails for want of KV pages
    (a PD-decode pre-allocation here) gives its row back but not its state slot: the
    slot is neither free nor held (STATE-1)."""

    clause, invariant_class = "STATE-1", "leak"
    exposed_by = GRID_4
    reverts = ("sgl-project/sglang #16067: a state slot leaked when a request failed to be scheduled "
               "after its mamba slot was allocated")


class SharedStateOnHitEngine(TwoPoolEngine):
    def adopt_prefix(self, request, max_prefix_len):
        super().adopt_prefix(request, max_prefix_len)
        node = request.last_node
        if node is not None and node.state is not None:
            # BUG: no copy-on-write: the request runs on the checkpoint's own slot
            self.states.free(request.state_slot)
            request.state_slot = node.state


class SHARED_STATE_ON_HIT(Mutant, slug="shared-state-on-hit", engine=SharedStateOnHitEngine):
    """A prefix hit adopts the checkpoint's slot as the request's working state instead
    of copying it into a slot of its own (STATE-5): the next forward writes into the
    checkpoint, and the slot has two holders (STATE-2)."""

    clause, invariant_class = "STATE-2", "ownership"
    exposed_by = GRID_1
    reverts = "copy-on-write at a match (SGLang 0.5.23 MambaComponent.finalize_match_result_in_cache)"


class CheckpointOffGridEngine(TwoPoolEngine):
    # BUG: every computed prefix counts as a checkpoint boundary, whatever the grid
    checkpoint_state = with_names(TwoPoolEngine.checkpoint_state,
                                  is_checkpoint_boundary=lambda position, grid: position > 0)


class CHECKPOINT_OFF_GRID(Mutant, slug="checkpoint-off-grid", engine=CheckpointOffGridEngine):
    """A checkpoint is taken at every prefill chunk's page-aligned end, not only on the
    checkpoint grid (STATE-3): an engine that tracks its state only at grid boundaries
    would key a state it never kept."""

    clause, invariant_class = "STATE-3", "alignment"
    exposed_by = GRID_4


class NoCopyOnHitEngine(TwoPoolEngine):
    def adopt_prefix(self, request, max_prefix_len):
        super().adopt_prefix(request, max_prefix_len)
        if request.state_slot is not None:
            self.states.contents[request.state_slot] = 0  # BUG: the copied state is cleared again


class NO_COPY_ON_HIT(Mutant, slug="no-copy-on-hit", engine=NoCopyOnHitEngine):
    """A prefix hit reuses the KV of the hit but starts the request's state empty (the
    copy is dropped, as a state flagged to be cleared would be): the request computes
    only the tokens after the hit, so its working state has not read the hit (STATE-4)."""

    clause, invariant_class = "STATE-4", "state"
    exposed_by = GRID_1
    reverts = "SGLang 0.5.23 MambaComponent.finalize_match_result_in_cache sets mamba_needs_clear = False"


class AcceptAnyNode(StateComponent):
    def match_validator(self):
        return lambda node: True  # BUG: a match may end where no checkpoint is


class HIT_WITHOUT_CHECKPOINT(Mutant, slug="hit-without-checkpoint",
                             engine=engine_with_state_component(AcceptAnyNode)):
    """The state component accepts every node as a match end, so a hit ends where the
    full and SWA KV allow, with no checkpoint there (STATE-5): the request starts from
    an empty state as if it had read the hit."""

    clause, invariant_class = "STATE-5", "state"
    exposed_by = GRID_4


class LockWholePath(StateComponent):
    def lock(self, node):
        for n in node.path_to_root():  # BUG: the state of every node above is locked too
            super().lock(n)

    def unlock(self, node):
        for n in node.path_to_root():
            super().unlock(n)


class STATE_LOCK_ON_PATH(Mutant, slug="state-lock-on-path", engine=engine_with_state_component(LockWholePath)):
    """The state component locks the whole path as the full component does (STATE-6):
    a state is not a prefix of its descendants' states, so the ancestors' checkpoints
    stay locked for nothing and cannot be evicted under pressure."""

    clause, invariant_class = "STATE-6", "locks"
    exposed_by = GRID_1


class ReleaseHookFreesState(StateComponent):
    def free_out_of_window_slots(self, request, pre_len, eviction_interval):
        if request.state_slot is not None and pre_len >= self.tree.window:
            self.pool.free(request.state_slot)  # BUG: the state is released like out-of-window KV


class WINDOW_RELEASE_FREES_STATE(Mutant, slug="window-release-frees-state",
                                 engine=engine_with_state_component(ReleaseHookFreesState)):
    """The release hook of the state component frees the request's working state once
    the request is longer than the window, as SWA's frees what slid out (STATE-7): the
    state of a running request is free while it still runs on it. At grid 1 the seed-0
    search, since the machine draws flushes, waiting matches and finishes in a prefill batch,
    first meets the freed slot taken again by a checkpoint (two holders, STATE-2, and a state
    of 0 tokens, STATE-3/4) in a step where the request no longer runs; at grid 4 STATE-7 is
    met with it."""

    clause, invariant_class = "STATE-7", "ownership"
    exposed_by = GRID_4
    reverts = ("the component hook free_out_of_window_slots is a no-op for every component but SWA "
               "(SGLang 0.5.23 unified_cache/components/base.py)")


class EvictLockedCheckpoints(StateComponent):
    def evict(self, num_slots):
        # BUG: the locks are not looked at
        candidates = sorted((n for n in self.tree.nodes() if n.state is not None), key=lambda n: n.state_access)
        for node in candidates[:num_slots]:
            self.drop_checkpoint(node)
        return min(num_slots, len(candidates))


class EVICT_LOCKED_CHECKPOINT(Mutant, slug="evict-locked-checkpoint",
                              engine=engine_with_state_component(EvictLockedCheckpoints)):
    """Checkpoint eviction takes the least recently used checkpoint whether or not a
    request locks it (STATE-8)."""

    clause, invariant_class = "STATE-8", "locks"
    exposed_by = GRID_1


class RetractKeepsStateEngine(TwoPoolEngine):
    def retract(self, rid):
        self.requests[rid].state_slot = None  # BUG: the working slot is dropped without a free
        super().retract(rid)


class RETRACT_KEEPS_STATE(Mutant, slug="retract-keeps-state", engine=RetractKeepsStateEngine):
    """A retracted request's working state slot is not given back (STATE-9): a retracted
    request waits with no state, and its old slot is lost."""

    clause, invariant_class = "STATE-9", "leak"
    exposed_by = GRID_1
