"""The request lifecycle [LIFE-1 .. LIFE-8]: an engine that admits requests, runs their
prefill chunks and decode steps, releases them, and evicts from the prefix cache,
as SGLang 0.5.23's scheduler drives its KV cache.

A request owns a row of the req-to-token pool: `row[p]` is the full slot of position p.
The prefix cache owns positions [0, cache_protected_len) (the row points at the tree's
slots there); the request owns the rest, up to kv_allocated_len. Its SWA cursor
`swa_evicted_seqlen` marks how far its own SWA KV has been released (WIN-3).

Operations return None when done, or an `OutOfMemory` outcome (after evicting what the
prefix cache could give) with the request left as it was; misuse raises
`InvalidRequest`. `check_invariants` runs every spec invariant and, on a violation,
raises with a dump of the state that explains it.
"""

from dataclasses import dataclass

import torch

from kvspec.spec.invariants import engine_violations
from kvspec.spec.lifecycle import (
    EngineOperation,
    RunningRequest,
    admission_match_limit,
    insert_end,
    pages_to_evict,
    refusal,
    release_segments,
)
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest, OutOfMemory
from kvspec.spec.pages import new_pages_for_decode, new_pages_for_extend, pages_for
from kvspec.spec.snapshot import EngineConfig, RequestView, Step, TwoPoolSnapshot, held_full_slots
from kvspec.spec.state import HybridStateSnapshot, is_checkpoint_boundary, min_state_slots, validate_state_grid
from kvspec.spec.window import EVERY_GROUP, TWO_POOL_VERSIONS, decode_eviction_due, swa_tail_len, validate_window_config

from .components import free_swa_out_of_window_slots
from .hybrid import HybridAllocator
from .state import StatePool
from .tree import Node, PrefixTree, TreeLock


@dataclass(eq=False)
class Request:
    """[LIFE-2] One request's KV state (SGLang's ReqKvInfo plus the fields of Req it uses)."""

    rid: str
    tokens: list[int]
    """Prompt and outputs so far; the last output's KV is written by the next decode step."""
    engine: "TwoPoolEngine"
    row_index: int | None = None
    cache_protected_len: int = 0
    swa_evicted_seqlen: int = 0
    kv_allocated_len: int = 0
    kv_committed_len: int = 0
    decode_steps: int = 0
    finished_prefill: bool = False
    lock: TreeLock | None = None
    state_slot: int | None = None
    """[STATE-2] Its working state slot, in a model with recurrent layers."""

    @property
    def last_node(self) -> Node | None:
        return None if self.lock is None else self.lock.node

    def slots(self, start: int, end: int) -> torch.Tensor:
        return self.engine.req_to_token[self.row_index, start:end]

    def view(self) -> RequestView:
        return RequestView(self.rid, tuple(self.slots(0, self.kv_allocated_len).tolist()),
                           self.cache_protected_len, self.swa_evicted_seqlen, self.kv_allocated_len,
                           self.kv_committed_len, len(self.tokens), self.decode_steps, self.finished_prefill,
                           None if self.last_node is None else self.last_node.node_id)


class TwoPoolEngine:
    def __init__(self, config: EngineConfig, device: str | torch.device = "cpu"):
        problems = validate_window_config(config.window, config.page_size, config.policy)
        if config.max_requests < 1:
            problems.append(f"max_requests must be >= 1 (got {config.max_requests})")
        if config.policy.version not in TWO_POOL_VERSIONS:
            problems.append(f"the reference implements the two-pool model ({', '.join(TWO_POOL_VERSIONS)}); "
                            f"{config.policy.version!r} is a shared block pool, checked by chapter 08's clauses")
        if tuple(config.layout) != EVERY_GROUP:
            problems.append(f"the two-pool model has one full and one SWA pool; a layout of other groups "
                            f"({list(config.layout)}) is a shared block pool's (BLOCK-11)")
        if config.state_slots and config.state_slots < min_state_slots(config.max_requests):
            problems.append(f"a state pool needs at least {min_state_slots(config.max_requests)} slots for "
                            f"{config.max_requests} requests (STATE-2; got {config.state_slots})")
        if config.state_slots:
            problems += validate_state_grid(config.state_grid, config.page_size)
        if problems:
            raise InvalidConfig("invalid engine configuration: " + "; ".join(problems))
        self.config = config
        self.page_size = config.page_size
        self.window = config.window
        self.policy = config.policy
        self.allocator = HybridAllocator(config.size_full, config.size_swa, config.page_size, device=device)
        self.max_context_len = config.size_full + config.page_size
        # row 0 is padding, as in SGLang's ReqToTokenPool
        self.req_to_token = torch.zeros(config.max_requests + 1, self.max_context_len, dtype=torch.int64,
                                        device=self.allocator.device)
        self.free_rows = list(range(config.max_requests, 0, -1))
        self.states, self.tree = self.empty_cache()
        self.requests: dict[str, Request] = {}
        self.waiting: dict[str, list[int]] = {}
        """Retracted requests: their tokens, ready to be admitted again."""

    # -- helpers --------------------------------------------------------------------------

    def empty_cache(self) -> tuple[StatePool | None, PrefixTree | None]:
        """A state pool with every slot free and an empty prefix tree over it."""
        config = self.config
        states = StatePool(config.state_slots, config.state_grid, self.allocator.device) if config.state_slots else None
        tree = (PrefixTree(self.allocator, config.page_size, config.window, config.policy.version, states)
                if config.policy.supports_prefix_sharing else None)
        return states, tree

    def refuse_misuse(self, operation: EngineOperation, **args) -> None:
        """[LIFE-1] Raise InvalidRequest, before anything changes, for a call the lifecycle forbids."""
        running = {rid: RunningRequest(r.finished_prefill, len(r.tokens), r.kv_committed_len - r.cache_protected_len,
                                      r.kv_committed_len)
                   for rid, r in self.requests.items()}
        if why := refusal(operation, args, running, self.waiting, self.config.size_full):
            raise InvalidRequest(why)

    def make_room(self, full_pages: int, swa_pages: int) -> OutOfMemory | None:
        """[LIFE-7] Evict from the prefix cache until each pool has the pages an
        allocation needs; the outcome if it still cannot."""
        if self.tree is not None:
            full_short = pages_to_evict(full_pages, self.allocator.full.available_pages())
            swa_short = pages_to_evict(swa_pages, self.allocator.swa.available_pages())
            if full_short or swa_short:
                self.tree.evict(full_short * self.page_size, swa_short * self.page_size)
        return self.allocator.capacity_shortfall(full_pages, swa_pages)

    def set_row(self, request: Request, start: int, slots: torch.Tensor) -> None:
        self.req_to_token[request.row_index, start:start + len(slots)] = slots

    def adopt_prefix(self, request: Request, max_prefix_len: int) -> None:
        """Adopt the longest acceptable cached prefix of at most `max_prefix_len` tokens
        and lock it (SGLang: match_prefix, then the lock taken at admission)."""
        if self.tree is None:
            return
        node, length = self.tree.match(request.tokens[:max_prefix_len])
        request.lock = self.tree.lock(node)
        self.set_row(request, 0, self.tree.path_values(node))
        request.cache_protected_len = request.kv_allocated_len = request.kv_committed_len = length
        if self.states is not None and node.state is not None:
            self.states.copy(node.state, request.state_slot)  # [STATE-5] copy-on-write

    def take_row(self, rid: str, tokens: list[int]) -> Request | OutOfMemory:
        """A row, and in a model with recurrent layers a working state slot (STATE-2)."""
        if not self.free_rows:
            return OutOfMemory("requests", 1, 0)
        state_slot = None
        if self.states is not None:
            state_slot = self.tree.state.alloc() if self.tree is not None else self.states.alloc()
            if state_slot is None:
                return OutOfMemory("state", 1, 0)
        request = Request(rid, list(tokens), self, row_index=self.free_rows.pop(), state_slot=state_slot)
        self.requests[rid] = request
        return request

    def compute(self, request: Request, start: int, end: int) -> None:
        """The forward of positions [start, end): the recurrent layers read those tokens (STATE-4)."""
        if request.state_slot is not None:
            self.states.advance(request.state_slot, request.tokens[start:end])

    def drop(self, request: Request) -> None:
        """Give the request's row back (its KV is already released), and its working
        state unless it became a checkpoint (STATE-9)."""
        if request.state_slot is not None:
            self.states.free(request.state_slot)
            request.state_slot = None
        self.req_to_token[request.row_index].zero_()
        self.free_rows.append(request.row_index)
        request.row_index = None
        del self.requests[request.rid]

    def undo_admission(self, request: Request) -> None:
        if request.lock is not None:
            self.tree.unlock(request.lock)
        self.drop(request)

    # -- admission ------------------------------------------------------------------------

    def admit(self, rid: str, prompt: list[int] | None = None) -> OutOfMemory | None:
        """[LIFE-3] Take a row, match the longest cached prefix (leaving at least one
        token to compute) and lock it. `prompt` None re-admits a retracted request."""
        self.refuse_misuse(EngineOperation.ADMIT, rid=rid, prompt=prompt)
        request = self.take_row(rid, self.waiting[rid] if prompt is None else prompt)
        if isinstance(request, OutOfMemory):
            return request
        self.waiting.pop(rid, None)
        self.adopt_prefix(request, admission_match_limit(len(request.tokens)))
        return None

    def pd_admit(self, rid: str, prompt: list[int], first_output: int) -> OutOfMemory | None:
        """[LIFE-6] PD-decode: the prompt's KV arrives from a prefill server; allocate it
        with full KV for every token and SWA KV for the tail only (page_size > 1), and
        set the cursor to the tail's start so the head is never freed as SWA."""
        self.refuse_misuse(EngineOperation.PD_ADMIT, rid=rid, prompt=prompt)
        request = self.take_row(rid, list(prompt) + [first_output])
        if isinstance(request, OutOfMemory):
            return request
        fill = len(prompt)
        tail = (swa_tail_len(fill, self.window, self.page_size, self.tree is not None)
                if self.page_size > 1 else fill)
        self.adopt_prefix(request, fill - tail)
        prefix = request.kv_allocated_len
        last_loc = int(request.slots(prefix - 1, prefix)[0]) if prefix else -1
        if self.page_size > 1:
            outcome = self.make_room(new_pages_for_extend(prefix, fill, self.page_size), pages_for(tail, self.page_size))
            slots = outcome or self.allocator.alloc_extend_swa_tail(prefix, fill, last_loc, tail)
        else:
            outcome = self.make_room(fill - prefix, fill - prefix)
            slots = outcome or self.allocator.alloc_extend([prefix], [fill], [last_loc])
        if isinstance(slots, OutOfMemory):
            self.undo_admission(request)
            return slots
        self.set_row(request, prefix, slots)
        request.kv_allocated_len = request.kv_committed_len = fill
        request.swa_evicted_seqlen = fill - tail
        request.finished_prefill = True
        self.compute(request, prefix, fill)  # the state arrives with the KV
        return None

    # -- prefill and decode ---------------------------------------------------------------

    def prefill_chunk(self, rid: str, chunk_len: int, next_token: int = 0) -> OutOfMemory | None:
        """[LIFE-4] Compute the next `chunk_len` prompt tokens (fewer at the end), then
        checkpoint them into the prefix cache. The last chunk samples `next_token`."""
        self.refuse_misuse(EngineOperation.PREFILL_CHUNK, rid=rid, chunk=chunk_len)
        return self.prefill([(self.requests[rid], chunk_len, next_token)])

    def prefill_batch(self, chunks: list[dict]) -> OutOfMemory | None:
        """[LIFE-9] One chunk of each of several requests in one step: every extend is
        allocated (all or none), then the chunks that end their prompts are checkpointed in
        order inside one free group, as a scheduler processes a batch's results, then the
        others (a scheduler checkpoints a request still being chunked at its next round)."""
        self.refuse_misuse(EngineOperation.PREFILL_BATCH, chunks=chunks)
        return self.prefill([(self.requests[c["rid"]], c["chunk"], c["token"]) for c in chunks],
                            finishing={c["rid"] for c in chunks if c.get("finish")})

    def prefill(self, chunks: list[tuple[Request, int, int]], finishing: set[str] = frozenset()) -> OutOfMemory | None:
        """Allocate every chunk's extend at once (LIFE-7 eviction first), compute, then checkpoint;
        a request of `finishing` (its chunk completes its prompt) is released there instead."""
        extents = [(request, request.kv_committed_len, min(request.kv_committed_len + chunk_len, len(request.tokens)))
                   for request, chunk_len, _ in chunks]
        if self.tree is None and self.policy.chunk_release:  # no prefix cache: the scheduler evicts before each extend
            for request, start, _ in extents:
                free_swa_out_of_window_slots(self.allocator, request, start, self.window, self.page_size,
                                             self.policy.version, eviction_interval=1)
        pages = sum(new_pages_for_extend(start, end, self.page_size) for _, start, end in extents)
        last_locs = [int(request.slots(start - 1, start)[0]) if start else -1 for request, start, _ in extents]
        slots = self.make_room(pages, pages) or self.allocator.alloc_extend(
            [start for _, start, _ in extents], [end for _, _, end in extents], last_locs)
        if isinstance(slots, OutOfMemory):
            return slots
        offset = 0
        for request, start, end in extents:
            self.set_row(request, start, slots[offset:offset + end - start])
            offset += end - start
            request.kv_allocated_len = request.kv_committed_len = end
            self.compute(request, start, end)
        completing = [(request, end) for request, _, end in extents if end == len(request.tokens)]
        next_tokens = {request: token for request, _, token in chunks}
        self.allocator.free_group_begin()
        for request, end in completing:
            if request.rid in finishing:  # [LIFE-9] its first token ends it: released, not checkpointed
                self.release(request, checkpoint=True, owned=end)
            elif self.tree is not None:
                self.checkpoint(request, end, finished=False)
        self.allocator.free_group_end()
        if self.tree is not None:
            for request, _, end in extents:
                if end < len(request.tokens):
                    self.checkpoint(request, end, finished=False)
        for request, _ in completing:
            if request.rid not in finishing:
                request.finished_prefill = True
                request.tokens.append(next_tokens[request])
        return None

    def decode(self, rid: str, next_token: int = 0) -> OutOfMemory | None:
        """[LIFE-8] Window eviction when due (never on the first decode step), then one
        slot for the last sampled token, whose KV the step writes; samples `next_token`."""
        self.refuse_misuse(EngineOperation.DECODE, rid=rid)
        request = self.requests[rid]
        seq_len = len(request.tokens)
        if request.decode_steps >= 1 and decode_eviction_due(seq_len, request.swa_evicted_seqlen, self.window,
                                                             self.policy.decode_eviction_interval):
            self.allocator.free_group_begin()
            free_swa_out_of_window_slots(self.allocator, request, seq_len - 1, self.window, self.page_size,
                                         self.policy.version, eviction_interval=1)
            self.allocator.free_group_end()
        pages = new_pages_for_decode(seq_len, self.page_size)
        last_loc = int(request.slots(seq_len - 2, seq_len - 1)[0])
        slots = self.make_room(pages, pages) or self.allocator.alloc_decode([seq_len], [last_loc])
        if isinstance(slots, OutOfMemory):
            return slots
        self.set_row(request, seq_len - 1, slots)
        request.kv_allocated_len = request.kv_committed_len = seq_len
        self.compute(request, seq_len - 1, seq_len)
        request.tokens.append(next_token)
        request.decode_steps += 1
        return None

    # -- the prefix cache -----------------------------------------------------------------

    def checkpoint(self, request: Request, up_to: int, finished: bool) -> None:
        """[LIFE-4] Cache `[0, floor_page(up_to))` in the tree. An unfinished request
        first releases the SWA KV that slid out of its window, so the insert tombstones
        it. The request's row then points at the tree's slots, and its lock moves to
        the new last node."""
        tree = self.tree
        if not finished and self.policy.chunk_release:  # the release hook of every component: only SWA's frees
            for component in tree.components:
                component.free_out_of_window_slots(request, up_to - 1, eviction_interval=1)
        end = insert_end(up_to, self.page_size)
        node = tree.insert(request.tokens[:end], request.slots(0, end).clone(),
                           request.cache_protected_len, request.swa_evicted_seqlen)
        self.checkpoint_state(request, node, finished)
        values = tree.path_values(node)
        assert len(values) == end, "the inserted key ends at the returned node"
        self.set_row(request, request.cache_protected_len, values[request.cache_protected_len:])
        tree.unlock(request.lock)
        request.lock = tree.lock(node)
        request.cache_protected_len = end

    def checkpoint_state(self, request: Request, node: Node, finished: bool) -> None:
        """[STATE-3, STATE-9] Where the insert ends at the request's computed tokens, on
        the grid, and the node holds no checkpoint yet: keep the working state there, a
        copy of it while the request runs, the slot itself at a finish."""
        state = self.tree.state
        if (state is None or node.state is not None or node.end != request.kv_committed_len
                or not is_checkpoint_boundary(node.end, self.states.grid)):
            return
        if finished:
            state.set_checkpoint(node, request.state_slot)
            request.state_slot = None
        elif (slot := state.alloc()) is not None:
            self.states.copy(request.state_slot, slot)
            state.set_checkpoint(node, slot)

    # -- release ----------------------------------------------------------------------

    def release(self, request: Request, checkpoint: bool, owned: int) -> None:
        """[LIFE-5] Cache what the request owns (if `checkpoint`), free its private KV
        (full only where its SWA is already released), unlock, and free the pages
        allocated past what it owns."""
        if checkpoint and self.tree is not None:
            self.checkpoint(request, owned, finished=True)
        for segment in release_segments(request.cache_protected_len, request.swa_evicted_seqlen, owned,
                                        request.kv_allocated_len, self.page_size):
            free = self.allocator.free_segment if segment.with_swa else self.allocator.free_full_segment
            free(request.slots(segment.start, segment.end), segment.start)
        if request.lock is not None:
            self.tree.unlock(request.lock)
            request.lock = None
        self.drop(request)

    def finish(self, rid: str, trim: int = 0) -> None:
        """[LIFE-5] A finished request: its KV (less `trim` tokens after a stop, which are
        not kept) goes into the prefix cache, the rest is freed."""
        self.refuse_misuse(EngineOperation.FINISH, rid=rid, trim=trim)
        request = self.requests[rid]
        self.release(request, checkpoint=True, owned=request.kv_committed_len - trim)

    def finish_batch(self, finishes: list[dict]) -> None:
        """[LIFE-10] The requests one decode batch finishes, each as `finish` releases it, in
        order inside one free group, as a scheduler processes a decode batch's results."""
        self.refuse_misuse(EngineOperation.FINISH_BATCH, finishes=finishes)
        self.allocator.free_group_begin()
        for finish in finishes:
            request = self.requests[finish["rid"]]
            self.release(request, checkpoint=True, owned=request.kv_committed_len - finish["trim"])
        self.allocator.free_group_end()

    def abort(self, rid: str) -> None:
        """[LIFE-5] Release without caching."""
        self.refuse_misuse(EngineOperation.ABORT, rid=rid)
        request = self.requests[rid]
        self.release(request, checkpoint=False, owned=request.kv_committed_len)

    def retract(self, rid: str) -> None:
        """[LIFE-5] Release without caching, and keep the request waiting to be admitted
        again with every token it has."""
        self.refuse_misuse(EngineOperation.RETRACT, rid=rid)
        request = self.requests[rid]
        tokens = request.tokens
        self.release(request, checkpoint=False, owned=request.kv_committed_len)
        self.waiting[rid] = tokens

    def evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        """[LIFE-7] Evict from the prefix cache; returns the tokens freed per pool."""
        self.refuse_misuse(EngineOperation.EVICT, full_tokens=full_tokens, swa_tokens=swa_tokens)
        return (0, 0) if self.tree is None else self.tree.evict(full_tokens, swa_tokens)

    def match(self, prompt: list[int]) -> None:
        """[LIFE-12] A waiting request's prompt matched as the scheduler orders its queue: the
        tree's walk, which may split the node it ends in and makes the path it matched the
        most recent; no row, no lock."""
        self.refuse_misuse(EngineOperation.MATCH, prompt=prompt)
        if self.tree is not None:
            self.tree.match(prompt)

    def flush(self) -> None:
        """[LIFE-11] An idle engine forgets its prefix cache: an empty tree, every page and
        state slot free. Retracted requests stay waiting; they hold nothing."""
        self.refuse_misuse(EngineOperation.FLUSH)
        self.allocator.clear()
        self.states, self.tree = self.empty_cache()

    # -- observation ------------------------------------------------------------------

    def snapshot(self) -> TwoPoolSnapshot:
        return self.snapshot_with(self.allocator.state(), tuple(r.view() for r in self.requests.values()),
                                  () if self.tree is None else self.tree.views())

    def partial_snapshot(self) -> TwoPoolSnapshot:
        """[OBS-4] The same, but the allocator shows free counts and the mapping of the
        slots the requests and nodes hold only: its cost does not grow with the pools."""
        requests = tuple(r.view() for r in self.requests.values())
        nodes = () if self.tree is None else self.tree.views()
        return self.snapshot_with(self.allocator.partial_state(held_full_slots(requests, nodes)), requests, nodes)

    def snapshot_with(self, allocator, requests, nodes) -> TwoPoolSnapshot:
        ledgers = None if self.tree is None else self.tree.ledgers()
        if self.states is None:
            return TwoPoolSnapshot(self.config, allocator, requests, nodes, ledgers)
        working = [(r.rid, r.tokens, r.state_slot) for r in self.requests.values()]
        checkpoints, locks, state_ledgers = self.tree.state.views() if self.tree is not None else ([], [], None)
        return HybridStateSnapshot(self.config, allocator, requests, nodes, ledgers,
                                   state=self.states.view(working, checkpoints, locks, state_ledgers))

    def check_invariants(self, previous: TwoPoolSnapshot | None = None, step: Step | None = None) -> TwoPoolSnapshot:
        """Check every invariant; on a violation raise with the state that explains it.
        Returns the snapshot, to pass as `previous` next time."""
        now = self.snapshot()
        violations = engine_violations(previous, step, now)
        if violations:
            raise AssertionError("invariants violated after " + (str(step) if step else "this step") + ":\n  "
                                 + "\n  ".join(map(str, violations)) + "\n" + describe(now))
        return now


def describe(snapshot: TwoPoolSnapshot) -> str:
    """A readable dump: pools, requests, and the tree."""
    a = snapshot.allocator
    lines = [f"{name} pool: {pool.free_count}/{pool.num_pages} pages free "
             f"{'(list not shown)' if pool.free_pages is None else sorted(pool.free_pages)}"
             for name, pool in (("full", a.full), ("SWA", a.swa))]
    for r in snapshot.requests:
        lines.append(f"request {r.rid}: protected {r.cache_protected_len}, cursor {r.swa_evicted_seqlen}, "
                     f"allocated {r.kv_allocated_len}, committed {r.kv_committed_len}, seq {r.seq_len}, "
                     f"decode steps {r.decode_steps}, node {r.last_node}, row {list(r.row)}")
    for n in snapshot.nodes:
        swa = "tombstone" if n.swa_value is None else list(n.swa_value)
        lines.append(f"node {n.node_id} (parent {n.parent}) [{n.start}, {n.end}) locks {n.full_lock_ref}/"
                     f"{n.swa_lock_ref} full {list(n.full_value)} swa {swa}")
    if snapshot.ledgers:
        lines.append(f"ledgers {snapshot.ledgers}")
    if isinstance(snapshot, HybridStateSnapshot):
        view = snapshot.state
        lines.append(f"state pool: {len(view.free_slots)}/{view.num_slots} slots free {sorted(view.free_slots)}, "
                     f"grid {view.grid}, ledgers {view.evictable}/{view.protected}")
        lines += [f"state of request {r.rid}: {list(r.values)}" for r in view.requests]
        lines += [f"checkpoint of node {node_id}: {value}" for node_id, value in view.checkpoints]
    return "\n".join(lines)
