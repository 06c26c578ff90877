"""The request lifecycle on one shared block pool [BLOCK-1 .. BLOCK-10, LIFE-1 .. LIFE-8]:
an engine of chapter 08's model, as vLLM 0.33's KV cache manager keeps its KV and its
scheduler drives it in synchronous mode (one request per step, nothing in flight).

The layer groups of the configuration's layout (BLOCK-11; by default full attention, group
0, and sliding window, group 1) draw from one `BlockPool` of `(size_full + size_swa) / P + 1`
blocks (the null block included), the block size being the page size. A request has one positional table per group (a row of a
tensor): entry `i` covers tokens `[i * P, (i + 1) * P)`; a sliding-window table keeps
its length and puts the null block in the entries that left the window.

Every operation is one allocation, as vLLM's `allocate_slots` makes it:

1. release the sliding-window blocks wholly before `p - W` (`released_swa_blocks`,
   BLOCK-6), `p` the tokens computed when it runs, even if it then fails;
2. the capacity check: the blocks the tables grow by, and the free blocks a prefix hit
   adopts; short: OutOfMemory, nothing else changed;
3. adopt the hit (new requests): one reference per block, null entries before the window;
4. take new blocks from the free queue's head (BLOCK-10) for the slots asked;
5. cache the blocks it made whole, each under its chained hash and group (BLOCK-9: every
   one of the full group, those the retention keeps of the sliding-window group).

Admission finds the prefix hit (BLOCK-9) and, if there is one, allocates it; a prefill
chunk and a decode step allocate their tokens; finish, abort and retract give every
block back in release order (BLOCK-10); evict drops the keys of the least recently
released cached free blocks. Each decision is a kvspec.spec definition; the tensors only
hold the state. vLLM evicts lazily and never asks its prefix cache to make room: an
allocation takes free blocks, cached or not, and fails only when too few are free.
"""

import hashlib
from dataclasses import dataclass, field

import torch

from kvspec.spec.block_pool import (
    FULL,
    NULL_BLOCK,
    PREFIX_CACHE_RETENTION,
    SWA,
    BlockPoolSnapshot,
    BlockPoolView,
    RequestBlocks,
    null_prefix_length,
    release_order,
    released_swa_blocks,
    swa_block_cached,
    swa_hit_run,
)
from kvspec.spec.group_layouts import kind_cached, layout_hit_blocks, layout_problems
from kvspec.spec.invariants import engine_violations
from kvspec.spec.lifecycle import EngineOperation, RunningRequest, admission_match_limit, refusal
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest, OutOfMemory
from kvspec.spec.pages import pages_for
from kvspec.spec.snapshot import EngineConfig, RequestView, Step
from kvspec.spec.window import BLOCK_POOL_VERSIONS, validate_window_config

from .block_pool import BlockPool


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """The chained hash of one whole block: its tokens and its parent's hash, so a key
    names the whole prefix up to the block's end (vLLM: sha256 of the same; any
    collision-free hash will do, only equality matters)."""
    digest = hashlib.blake2b(repr((parent, tokens)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(eq=False)
class BlockRequest:
    """[LIFE-2, BLOCK-4] One request: its tokens and their block hashes, its tables, and
    its last allocation."""

    rid: str
    tokens: list[int]
    prompt_len: int
    """Where a resend of the prompt resumes counts from it (BLOCK-9's retention)."""
    tables: torch.Tensor
    """One row per group: the block of each entry, the null block where released."""
    lengths: list[int] = field(init=False)
    """Each table's entries (0: the request holds no table)."""
    cached: list[int] = field(init=False)
    """Per group, the leading entries already offered to the prefix cache."""
    hashes: list[int] = field(default_factory=list)
    """The chained hash of each whole block of `tokens`."""
    computed: int = 0
    """Tokens whose KV is written (vLLM's num_computed_tokens)."""
    processed: int = 0
    slots: int = 0
    """(p, N) of its last allocation (BLOCK-4)."""
    junction: int = 0
    """Where its hit stopped short of the full group's (vLLM's shared_prefix_boundary), or 0."""
    decode_steps: int = 0
    finished_prefill: bool = False

    def __post_init__(self):
        self.lengths, self.cached = [0] * len(self.tables), [0] * len(self.tables)

    def table(self, group: int) -> list[int]:
        return self.tables[group, :self.lengths[group]].tolist()

    def holds_tables(self) -> bool:
        return any(self.lengths)

    def hash_whole_blocks(self, block_size: int) -> None:
        """The hash of every whole block of its tokens (after the tokens grow)."""
        for index in range(len(self.hashes), len(self.tokens) // block_size):
            parent = self.hashes[-1] if self.hashes else None
            self.hashes.append(block_hash(parent, tuple(self.tokens[index * block_size:(index + 1) * block_size])))


class BlockPoolEngine:
    def __init__(self, config: EngineConfig, device: str | torch.device = "cpu"):
        problems = validate_window_config(config.window, config.page_size, config.policy)
        if config.policy.version not in BLOCK_POOL_VERSIONS:
            problems.append(f"the shared block pool implements {', '.join(BLOCK_POOL_VERSIONS)}; "
                            f"{config.policy.version!r} is a version of the two-pool model (chapters 01-07)")
        for name in ("size_full", "size_swa"):
            if getattr(config, name) < 0 or getattr(config, name) % max(config.page_size, 1):
                problems.append(f"{name} must be a non-negative multiple of the page size (got {getattr(config, name)})")
        problems += layout_problems(config.layout)
        if config.state_slots:
            problems.append("the reference's shared block pool has no recurrent-state group (state_slots must be 0; "
                            "recurrent state is modelled on the two-pool reference)")
        if problems:
            raise InvalidConfig("invalid engine configuration: " + "; ".join(problems))
        self.config = config
        self.groups = tuple(config.layout)
        """[BLOCK-11] The kind of each layer group, by group id."""
        self.bs = config.page_size
        self.window = config.window
        self.retention = PREFIX_CACHE_RETENTION[config.policy.version]
        self.pool = BlockPool((config.size_full + config.size_swa) // self.bs + 1, device)
        self.uncached_first = config.policy.uncached_first
        """[BLOCK-10] The groups whose releases queue the blocks they free without a key first."""
        self.max_blocks = pages_for(config.size_full, self.bs) + 1
        self.requests: dict[str, BlockRequest] = {}
        self.waiting: dict[str, BlockRequest] = {}
        """Retracted requests, ready to be admitted again with every token they had."""

    # -- helpers ------------------------------------------------------------------------------

    def refuse_misuse(self, operation: EngineOperation, **args) -> None:
        """[LIFE-1] Raise InvalidRequest, before anything changes, for a call the lifecycle forbids."""
        running = {rid: RunningRequest(r.finished_prefill, len(r.tokens), r.computed, r.computed)
                   for rid, r in self.requests.items()}
        if why := refusal(operation, args, running, self.waiting, self.config.size_full):
            raise InvalidRequest(why)

    def new_request(self, rid: str, tokens: list[int], prompt_len: int) -> BlockRequest:
        request = BlockRequest(rid, list(tokens), prompt_len, torch.zeros(
            len(self.groups), self.max_blocks, dtype=torch.int64, device=self.pool.device))
        request.hash_whole_blocks(self.bs)
        return request

    def out_of_memory(self, needed: int) -> OutOfMemory:
        return OutOfMemory("blocks", needed, self.pool.free_count)

    def set_table(self, request: BlockRequest, group: int, start: int, blocks: list[int]) -> None:
        if blocks:
            request.tables[group, start:start + len(blocks)] = torch.tensor(blocks, dtype=torch.int64,
                                                                            device=self.pool.device)
        request.lengths[group] = max(request.lengths[group], start + len(blocks))

    # -- prefix hits ----------------------------------------------------------------------------

    def find_hit(self, request: BlockRequest, limit_tokens: int) -> tuple[int, list[list[int]], int]:
        """[BLOCK-9] The prefix hit of at most `limit_tokens` tokens: its length, per group
        the blocks it adopts (the null block before the window) and the junction."""
        limit = limit_tokens // self.bs
        keys = [[(h, group) for h in request.hashes[:limit]] for group in range(len(self.groups))]
        cached = [[key in self.pool.cache for key in group_keys] for group_keys in keys]
        hit = layout_hit_blocks(self.groups, cached, swa_hit_run(self.window, self.bs), limit)
        skipped = self.skipped(hit * self.bs)
        blocks = [[NULL_BLOCK] * skipped[g] + [self.pool.cached_block(key) for key in keys[g][skipped[g]:hit]]
                  for g in range(len(self.groups))]
        junction = 0  # where the full groups' run goes on past the hit, if the layout has both kinds
        if FULL in self.groups and SWA in self.groups:
            full = kind_cached(self.groups, cached, FULL, len(keys[0]))
            full_run = next((i for i, c in enumerate(full) if not c), len(full))
            junction = full_run * self.bs if full_run > hit else 0
        return hit * self.bs, blocks, junction

    def admit_with_hit(self, request: BlockRequest, limit_tokens: int, external: int = 0) -> bool:
        """Find the hit and allocate it with `external` tokens more whose KV arrives from
        elsewhere (PD decode); False when the blocks it needs are not free."""
        hit, blocks, request.junction = self.find_hit(request, limit_tokens)
        if hit or external:
            return self.allocate(request, 0, hit, blocks, external)
        return True

    # -- the allocation -----------------------------------------------------------------------

    def allocate(self, request: BlockRequest, new_tokens: int, hit: int = 0,
                 hit_blocks: list[list[int]] | None = None, external: int = 0) -> bool:
        """One allocation (the module docstring's steps 1-5): slots for `new_tokens` after
        the computed ones, adopting a hit of `hit` tokens and `external` tokens that arrive
        computed; False, after the window release only, when too few blocks are free."""
        processed = request.computed + hit + external
        slots = processed + new_tokens
        self.release_window(request, processed)
        hit_blocks = hit_blocks or [[] for _ in self.groups]
        skipped = self.skipped(processed)
        adopted = [hit_blocks[g][skipped[g]:] for g in range(len(self.groups))]
        if self.blocks_needed(request, new_tokens, hit, hit_blocks, external) > self.pool.free_count:
            if request.rid in self.requests:
                request.processed = processed
            return False
        if hit or external:  # a new request: its tables start with what it adopts
            for g in range(len(self.groups)):
                self.pool.claim(adopted[g])
                self.set_table(request, g, 0, [NULL_BLOCK] * skipped[g] + adopted[g])
                request.cached[g] = request.lengths[g]
        for g in range(len(self.groups)):
            length = request.lengths[g]
            self.set_table(request, g, length, self.pool.take(pages_for(slots, self.bs) - length))
        self.cache_blocks(request, min(slots, len(request.tokens)))
        request.processed, request.slots = processed, slots
        return True

    def skipped(self, processed: int) -> list[int]:
        """[BLOCK-6] Per group, the leading entries released after `processed` tokens."""
        return [released_swa_blocks(processed, self.window, self.bs) if kind == SWA else 0 for kind in self.groups]

    def blocks_needed(self, request: BlockRequest, new_tokens: int, hit: int = 0,
                      hit_blocks: list[list[int]] | None = None, external: int = 0) -> int:
        """[BLOCK-6] The free blocks an allocation takes once its window is released: the
        blocks its tables grow by, and the free ones its hit adopts."""
        processed = request.computed + hit + external
        slots = processed + new_tokens
        hit_blocks = hit_blocks or [[] for _ in self.groups]
        skipped = self.skipped(processed)
        adopted = [block for g in range(len(self.groups)) for block in hit_blocks[g][skipped[g]:]]
        return self.pool.free_among(adopted) + sum(
            max(0, pages_for(slots, self.bs) - max(skipped[g], request.lengths[g] + len(hit_blocks[g])))
            for g in range(len(self.groups)))

    def release_window(self, request: BlockRequest, processed: int) -> None:
        """[BLOCK-6] Give back the sliding-window blocks wholly before `processed - W`."""
        if not request.holds_tables():
            return
        for g, kind in enumerate(self.groups):
            if kind != SWA:
                continue
            table = request.table(g)
            due = min(released_swa_blocks(processed, self.window, self.bs), len(table))
            if due > null_prefix_length(table):
                before = table  # a list, not a view of the tensor
                request.tables[g, :due] = NULL_BLOCK
                self.pool.release(release_order((before,), (request.table(g),)), kind in self.uncached_first)

    def cache_blocks(self, request: BlockRequest, tokens: int) -> None:
        """[BLOCK-9] Cache the entries `tokens` made whole: every one of the full group, those
        the retention keeps of the sliding-window group (never the null block)."""
        whole = min(tokens, len(request.hashes) * self.bs) // self.bs
        boundaries = (request.prompt_len - 1, *([request.junction] if request.junction else []))
        for g, kind in enumerate(self.groups):
            if request.cached[g] >= whole:
                continue
            table = request.table(g)
            for index in range(request.cached[g], whole):
                if table[index] != NULL_BLOCK and (kind == FULL or swa_block_cached(
                        index, self.window, self.bs, self.retention, boundaries)):
                    self.pool.store(table[index], (request.hashes[index], g))
            request.cached[g] = whole

    def release(self, request: BlockRequest) -> None:
        """[LIFE-5, BLOCK-10] Give back every block the request holds, in release order."""
        for g, kind in enumerate(self.groups):  # group by group, in release order (BLOCK-10)
            self.pool.release(release_order((request.table(g),), ()), kind in self.uncached_first)
        del self.requests[request.rid]

    # -- the engine tier ------------------------------------------------------------------------

    def admit(self, rid: str, prompt: list[int] | None = None) -> OutOfMemory | None:
        """[LIFE-3, BLOCK-9] Adopt the longest prefix hit of at most `len(tokens) - 1` tokens.
        `prompt` None admits a retracted request again, with every token it had."""
        self.refuse_misuse(EngineOperation.ADMIT, rid=rid, prompt=prompt)
        request = self.waiting[rid] if prompt is None else self.new_request(rid, prompt, len(prompt))
        if not self.admit_with_hit(request, admission_match_limit(len(request.tokens))):
            return self.out_of_memory(1)
        self.waiting.pop(rid, None)
        request.computed = request.processed  # the hit, 0 without one
        self.requests[rid] = request
        return None

    def pd_admit(self, rid: str, prompt: list[int], first_output: int) -> OutOfMemory | None:
        """[LIFE-6] PD decode: the prompt's KV arrives computed from a prefill server, as
        vLLM takes it from a KV connector (external computed tokens): a local prefix hit of
        at most `len(prompt) - 1` tokens, blocks for the rest of the prompt (in the
        sliding-window group from the window on only), cached as soon as it has arrived."""
        self.refuse_misuse(EngineOperation.PD_ADMIT, rid=rid, prompt=prompt)
        request = self.new_request(rid, [*prompt, first_output], len(prompt))
        hit, blocks, request.junction = self.find_hit(request, admission_match_limit(len(prompt)))
        if not self.allocate(request, 0, hit, blocks, len(prompt) - hit):
            return self.out_of_memory(pages_for(len(prompt), self.bs))
        request.computed = len(prompt)
        request.finished_prefill = True
        self.requests[rid] = request
        return None

    def prefill_chunk(self, rid: str, chunk_len: int, next_token: int = 0) -> OutOfMemory | None:
        """[LIFE-4] Allocate and compute the next `chunk_len` prompt tokens (fewer at its
        end); the last chunk samples `next_token`."""
        self.refuse_misuse(EngineOperation.PREFILL_CHUNK, rid=rid, chunk=chunk_len)
        request = self.requests[rid]
        new = min(chunk_len, len(request.tokens) - request.computed)
        if not self.allocate(request, new):
            return self.out_of_memory(pages_for(new, self.bs))
        request.computed += new
        if request.computed == len(request.tokens):
            self.sample(request, next_token)
            request.finished_prefill = True
        return None

    def decode(self, rid: str, next_token: int = 0) -> OutOfMemory | None:
        """[LIFE-8] Allocate and compute the last sampled token; sample `next_token`."""
        self.refuse_misuse(EngineOperation.DECODE, rid=rid)
        request = self.requests[rid]
        if not self.allocate(request, 1):
            return self.out_of_memory(1)
        request.computed += 1
        self.sample(request, next_token)
        request.decode_steps += 1
        return None

    def sample(self, request: BlockRequest, token: int) -> None:
        request.tokens.append(token)
        request.hash_whole_blocks(self.bs)

    def finish(self, rid: str, trim: int = 0) -> None:
        """[LIFE-5] Give every block back. Blocks are cached when they are allocated, so a
        stop (`trim` tokens not kept) changes nothing here."""
        self.refuse_misuse(EngineOperation.FINISH, rid=rid, trim=trim)
        self.release(self.requests[rid])

    def abort(self, rid: str) -> None:
        """[LIFE-5] Give every block back."""
        self.refuse_misuse(EngineOperation.ABORT, rid=rid)
        self.release(self.requests[rid])

    def retract(self, rid: str) -> None:
        """[LIFE-5] Give every block back; the request waits, with every token it has, to
        be admitted again (vLLM's preemption)."""
        self.refuse_misuse(EngineOperation.RETRACT, rid=rid)
        request = self.requests[rid]
        self.release(request)
        self.waiting[rid] = self.new_request(rid, request.tokens, request.prompt_len)

    def evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        """[LIFE-7, BLOCK-10, BLOCK-11] Drop the keys of that many tokens' worth of cached free
        blocks of each kind of group, least recently released first; the tokens dropped per kind."""
        self.refuse_misuse(EngineOperation.EVICT, full_tokens=full_tokens, swa_tokens=swa_tokens)
        wanted = {FULL: pages_for(full_tokens, self.bs), SWA: pages_for(swa_tokens, self.bs)}
        dropped = {FULL: 0, SWA: 0}
        for block in self.pool.cached_free_blocks():
            kind = self.groups[self.pool.key_of(block)[1]]
            if dropped[kind] < wanted[kind]:
                self.pool.drop_key(block)
                dropped[kind] += 1
        return dropped[FULL] * self.bs, dropped[SWA] * self.bs

    # -- observation ----------------------------------------------------------------------------

    def view(self) -> BlockPoolView:
        """[BLOCK-1 .. BLOCK-8] The pool as chapter 08 reads it."""
        pool = self.pool
        requests = tuple(RequestBlocks(r.rid, tuple(tuple(r.table(g)) for g in range(len(self.groups))), r.processed,
                                       r.slots) for _, r in sorted(self.requests.items()) if r.holds_tables())
        return BlockPoolView(block_size=self.bs, window=self.window, groups=self.groups, blocks=pool.blocks(),
                             free_queue=tuple(pool.queue()), requests=requests, cache_map=pool.cache_map(),
                             replayed_map=pool.replayed_map())

    def request_view(self, request: BlockRequest) -> RequestView:
        """[LIFE-2, BLOCK-11] A request's row as a two-pool engine shows it: the slot of each
        position in its first full table (its first table without one), the released window
        of its first sliding-window table as its SWA cursor; no prefix tree."""
        full = request.table(self.groups.index(FULL) if FULL in self.groups else 0)
        row = tuple(full[i // self.bs] * self.bs + i % self.bs for i in range(min(request.slots, len(full) * self.bs)))
        released = null_prefix_length(tuple(request.table(self.groups.index(SWA)))) if SWA in self.groups else 0
        return RequestView(request.rid, row, 0, released * self.bs, request.slots, request.computed,
                           len(request.tokens), request.decode_steps, request.finished_prefill, None)

    def snapshot(self) -> BlockPoolSnapshot:
        return BlockPoolSnapshot(self.config, tuple(self.request_view(r) for _, r in sorted(self.requests.items())),
                                 self.view())

    def check_invariants(self, previous: BlockPoolSnapshot | None = None, step: Step | None = None
                         ) -> BlockPoolSnapshot:
        """Check every invariant of chapter 08 (and those of every model); on a violation
        raise with the state that explains it. Returns the snapshot, to pass as `previous`."""
        now = self.snapshot()
        if violations := engine_violations(previous, step, now):
            raise AssertionError("invariants violated after " + (str(step) if step else "this step") + ":\n  "
                                 + "\n  ".join(map(str, violations)) + "\n" + describe(now))
        return now


def describe(snapshot: BlockPoolSnapshot) -> str:
    """A readable dump: the free queue, every block that is held or cached, the tables."""
    view = snapshot.block_pool
    lines = [f"free queue ({view.free_count} of {len(view.blocks) - 1} real blocks, head first): {list(view.free_queue)}"]
    lines += [f"block {b.block_id}: ref {b.ref_cnt}, key {b.block_hash}" for b in view.blocks
              if b.block_id != NULL_BLOCK and (b.ref_cnt or b.block_hash is not None)]
    for request in view.requests:
        tables = ", ".join(f"{view.groups[g]} {['.' if b == NULL_BLOCK else b for b in table]}"
                           for g, table in enumerate(request.tables))
        lines.append(f"request {request.rid}: {request.processed} computed at its last allocation, "
                     f"{request.slots} slots: {tables}")
    return "\n".join(lines)
