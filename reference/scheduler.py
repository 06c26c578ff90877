"""The reference scheduler [SCHED-1 .. SCHED-9]: chapter 10's tier over the reference's
shared block pool (block_pool_engine.py), as plain a scheduler as the chapter allows.
Its groups are full attention and sliding window, and, for a model with recurrent
layers, a state group after them (scheduler_state.py: SCHED-9).

A plan is made in three passes:

1. every running request releases what its window no longer reads (BLOCK-6), before any
   allocation, so that no preemption is decided while a release would still make room
   (SCHED-7; vLLM releases only in each request's own allocation: divergence VLLM-3);
2. the running requests, in arrival order, each get a row while the budget lasts: a
   decode step, or the longest next chunk of what it has not computed that the free
   blocks hold; a request for which even one token does not fit preempts running requests
   from the back of the line (the latest arrived, not yet forwarded in this plan), each by
   recompute (its blocks freed, it waits to be computed again from a prefix hit), or,
   when all of them would not make room, stalls, keeping its blocks (never preempting
   itself: vLLM does, divergence VLLM-2). The rows and victims are decided on counts
   first, and a victim the plan turns out not to need is spared, so every preemption
   gives back more than the plan leaves free (SCHED-7);
3. waiting requests (new, or preempted in an earlier plan), in arrival order, are
   admitted with their prefix hit (BLOCK-9) and a first chunk while the budget lasts and
   the blocks are free; the first that does not fit ends the pass (admission never
   preempts).

The engine allocates each row's slots when the plan is made (as vLLM's `allocate_slots`
does) and takes the row's result when it comes: its tokens are then computed, and a row
that reaches the last known token appends the sampled output. Every block decision is
the engine's, and so the spec's; this module only orders the requests. With a state
group, the state pages a row takes are counted with its blocks, a prefix hit ends at a
cached state, and a prefill chunk ends at the request's checkpoint (StateGroup).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.spec.block_pool import NULL_BLOCK
from kvspec.spec.lifecycle import admission_match_limit
from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.scheduler import (
    STATE,
    PagePool,
    Plan,
    Preempted,
    Preemption,
    Row,
    SchedulerConfig,
    SchedulerView,
    pages_alone,
)
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import EVERY_GROUP, VLLM_0_33, Policy

from .block_pool_engine import BlockPoolEngine, BlockRequest
from .scheduler_state import StateGroup


def engine_config(config: SchedulerConfig) -> EngineConfig:
    """The engine of one pool of `pages` blocks (and the null block) that a request may fill alone."""
    return EngineConfig(config.page_size, config.window, config.pages * config.page_size, 0,
                        max_requests=config.pages, policy=Policy(VLLM_0_33),
                        layout=config.attention_groups)


@dataclass
class Budget:
    """What is left of one plan's rows and tokens."""

    rows: int
    tokens: int

    def allows(self, tokens: int = 1) -> bool:
        return self.rows > 0 and self.tokens >= tokens

    def spend(self, tokens: int) -> None:
        self.rows -= 1
        self.tokens -= tokens


class ReferenceScheduler:
    engine_class = BlockPoolEngine
    state_class = StateGroup

    def __init__(self, config: SchedulerConfig, device: str = "cpu"):
        if tuple(config.groups) not in (EVERY_GROUP, (*EVERY_GROUP, STATE)):
            raise ValueError(f"the reference scheduler's engine has the groups {EVERY_GROUP}, and a {STATE!r} group "
                             f"after them for a model with recurrent layers; got {config.groups}: build it with "
                             f"groups {EVERY_GROUP} or {(*EVERY_GROUP, STATE)}")
        self.config = config
        self.engine = self.engine_class(engine_config(config), device)
        self.state = self.state_class(self.engine) if STATE in config.groups else None
        """The recurrent-state group (SCHED-9), or None."""
        self.arrivals: list[str] = []
        """Every request not ended, in arrival order: the order of every pass."""
        self.waiting: dict[str, BlockRequest] = {}
        """Requests to admit: new ones, and those preempted to be computed again."""
        self.rows: dict[str, Row] = {}
        """The rows of the plan in progress that have no result yet."""

    # -- the tier --------------------------------------------------------------------------

    def submit(self, rid: str, prompt: Sequence[int], max_new_tokens: int) -> OutOfMemory | None:
        """Refused (OutOfMemory) when it needs more pages than the pool holds (pages_alone)."""
        if (needed := pages_alone(self.config, len(prompt), max_new_tokens)) > self.config.pages:
            return OutOfMemory("blocks", needed, self.config.pages)
        self.waiting[rid] = self.engine.new_request(rid, list(prompt), len(prompt))
        self.arrivals.append(rid)
        return None

    def plan(self) -> Plan:
        budget = Budget(self.config.max_batch_size, self.config.max_scheduled_tokens)
        running = [self.engine.requests[rid] for rid in self.arrivals if rid in self.engine.requests]
        for request in running:  # 1. release every window first: an allocation's first step (BLOCK-6)
            self.engine.release_window(request, request.computed)
            request.processed = request.computed
        planned, victims = self.plan_running(running, budget)  # 2. the running requests
        for victim in victims:
            self.preempt(victim)
        rows = []
        for request, tokens in planned:
            assert self.engine.allocate(request, tokens), "the plan counted the blocks its rows take"
            rows.append(self.row(request, request.computed, tokens))
        preempted = [victim.rid for victim in victims]
        for rid in [rid for rid in self.arrivals if rid in self.waiting and rid not in preempted]:  # 3. admissions
            if not budget.allows() or not self.admit(self.waiting[rid], budget, rows):
                break
        self.rows = {row.rid: row for row in rows}
        return Plan(tuple(rows), tuple(Preemption(rid, Preempted.RECOMPUTE) for rid in preempted))

    def plan_running(self, running: list[BlockRequest], budget: Budget
                     ) -> tuple[list[tuple[BlockRequest, int]], list[BlockRequest]]:
        """The running requests' rows (request, tokens) and the victims they need, decided
        on counts before any block moves: each row takes the longest chunk (or decode) the
        free blocks hold; one that does not fit at one token marks victims from the back of
        the line (the latest arrived that the plan has not forwarded, never itself) until
        they would give back enough, or stalls, keeping its blocks, when all of them would
        not. Last, a marked victim whose blocks the plan turns out not to need is spared:
        every victim left gives back more than the plan leaves free (SCHED-7)."""
        free = self.engine.pool.free_count
        planned: list[tuple[BlockRequest, int]] = []
        victims: list[BlockRequest] = []
        for request in running:
            if request in victims or not budget.allows():
                continue
            tokens = min(len(request.tokens) - request.computed, budget.tokens)
            state_pages = 0
            if self.state:
                tokens = self.state.chunk(request, request.computed, tokens)
                state_pages = self.state.pages_needed(request, request.computed)
            while tokens > 1 and self.engine.blocks_needed(request, tokens) + state_pages > free:
                tokens -= 1
            need = self.engine.blocks_needed(request, tokens) + state_pages
            forwarded = {planned_request.rid for planned_request, _ in planned}
            candidates = [other for other in running if other is not request and other.rid not in forwarded
                          and other not in victims]
            marked: list[BlockRequest] = []
            while need > free + self.freed(victims + marked, victims) and candidates:
                marked.append(candidates.pop())
            if need > free + self.freed(victims + marked, victims):
                continue  # it stalls: preempting every candidate would not make room
            free += self.freed(victims + marked, victims) - need
            victims += marked
            planned.append((request, tokens))
            budget.spend(tokens)
        return planned, self.spare(victims, free)

    def spare(self, victims: list[BlockRequest], free: int) -> list[BlockRequest]:
        """The victims less those the plan turns out not to need, `free` blocks being left
        once every victim's are counted: the latest marked first (SCHED-7)."""
        for victim in reversed(list(victims)):
            spared = [other for other in victims if other is not victim]
            if free >= self.freed(victims, spared):
                free -= self.freed(victims, spared)
                victims = spared
        return victims

    def freed(self, victims: list[BlockRequest], already: list[BlockRequest]) -> int:
        """The blocks preempting `victims` frees beyond what preempting `already` (a part of
        them) frees: those no request but the victims holds (spec: freed_by)."""
        tables = {rid: self.tables(request) for rid, request in self.engine.requests.items()}

        def free_after(chosen: list[BlockRequest]) -> int:
            rids = {request.rid for request in chosen}
            kept = {block for rid, held in tables.items() if rid not in rids for table in held for block in table}
            return len({block for rid in rids for table in tables[rid] for block in table
                        if block != NULL_BLOCK} - kept)

        return free_after(victims) - free_after(already)

    def result(self, rid: str, token: int | None) -> None:
        row = self.rows.pop(rid)
        request = self.engine.requests[rid]
        if self.state:
            self.state.write(request, row.start, row.tokens)
        request.computed = row.start + row.tokens
        if request.computed == len(request.tokens):  # it reached the last known token: an output
            if request.finished_prefill:
                request.decode_steps += 1
            request.finished_prefill = True
            self.engine.sample(request, token)

    def finish(self, rid: str) -> None:
        self.release(self.engine.requests[rid])
        self.arrivals.remove(rid)

    def abort(self, rid: str) -> None:
        if rid in self.engine.requests:
            self.release(self.engine.requests[rid])
        self.waiting.pop(rid, None)
        self.arrivals.remove(rid)

    def snapshot(self) -> SchedulerView:
        free = self.engine.pool.free_count
        tables = tuple((rid, self.tables(request))
                       for rid, request in sorted(self.engine.requests.items()) if request.holds_tables())
        memory = self.engine.snapshot()
        if self.state:
            memory = self.state.attention_snapshot(memory)
        return SchedulerView(PagePool(self.config.pages, free, self.config.pages - free), tables, memory)

    def tables(self, request: BlockRequest) -> tuple[tuple[int, ...], ...]:
        """Its table per group: the engine's attention tables, and its state table."""
        attention = tuple(tuple(request.table(g)) for g in range(len(self.engine.groups)))
        return (*attention, self.state.table(request.rid)) if self.state else attention

    def release(self, request: BlockRequest) -> None:
        """Give back every page it holds: its blocks in release order (BLOCK-10), then its states."""
        self.engine.release(request)
        if self.state:
            self.state.release(request)

    # -- the passes ------------------------------------------------------------------------

    def preempt(self, victim: BlockRequest) -> None:
        """By recompute: its blocks freed, it waits with every token it has (BLOCK-10 order)."""
        self.release(victim)
        self.waiting[victim.rid] = self.engine.new_request(victim.rid, victim.tokens, victim.prompt_len)

    def admit(self, request: BlockRequest, budget: Budget, rows: list[Row]) -> bool:
        """Admit with its prefix hit and a first chunk; False when the blocks are short."""
        engine = self.engine
        limit = admission_match_limit(len(request.tokens))
        if self.state:
            hit, blocks, request.junction, checkpoint = self.state.find_hit(request, limit)
            tokens = self.state.chunk(request, hit, min(len(request.tokens) - hit, budget.tokens))
            if (engine.blocks_needed(request, tokens, hit, blocks) + self.state.pages_needed(request, hit, checkpoint)
                    > engine.pool.free_count):
                return False
            self.state.adopt(request, checkpoint)
        else:
            hit, blocks, request.junction = engine.find_hit(request, limit)
            tokens = min(len(request.tokens) - hit, budget.tokens)
        if not engine.allocate(request, tokens, hit, blocks):
            return False
        request.computed = hit
        engine.requests[request.rid] = request
        del self.waiting[request.rid]
        rows.append(self.row(request, hit, tokens))
        budget.spend(tokens)
        return True

    def row(self, request: BlockRequest, start: int, tokens: int) -> Row:
        """The row, with the state it reads where there is a state group (its pages taken)."""
        state_read = self.state.open_row(request, start) if self.state else None
        return Row(request.rid, start, tokens, self.tables(request), state_read)
