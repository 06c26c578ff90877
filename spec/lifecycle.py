"""The request lifecycle [LIFE-1 .. LIFE-12]: the engine's operations and the decisions they rest on.

The engine's operations (admit, prefill chunk, prefill batch, decode step, finish, finish
batch, abort, retract, PD-decode pre-allocation, evict, flush, a waiting request's match) are described in 06-lifecycle.md: `EngineOperations`
states their signatures, `refusal` the misuse every engine must refuse (LIFE-1), and the
functions below the arithmetic they rest on, so that an implementation and the reference
compute the same boundaries.
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .notation import Position
from .outcomes import Name, OutOfMemory
from .pages import ceil_page, floor_page


class EngineOperation(Name):
    """[LIFE-2] The operations of an engine, as traces name them."""

    ADMIT = "admit"
    PD_ADMIT = "pd_admit"
    PREFILL_CHUNK = "prefill_chunk"
    PREFILL_BATCH = "prefill_batch"
    DECODE = "decode"
    FINISH = "finish"
    FINISH_BATCH = "finish_batch"
    ABORT = "abort"
    RETRACT = "retract"
    EVICT = "evict"
    FLUSH = "flush"
    MATCH = "match"


class EngineOperations(Protocol):
    """[LIFE-2] The operations of an engine, with the argument names traces use. An
    allocation that cannot be served returns OutOfMemory and changes nothing of the
    request (LIFE-7, I15); a misuse raises InvalidRequest and changes nothing (LIFE-1)."""

    def admit(self, rid: str, prompt: Sequence[int] | None) -> OutOfMemory | None:
        """[LIFE-3] Take a row and lock the longest cached prefix; `prompt` None re-admits a retracted request."""

    def pd_admit(self, rid: str, prompt: Sequence[int], first_output: int) -> OutOfMemory | None:
        """[LIFE-6] PD-decode: allocate the KV a prefill server sends (full for all, SWA for the tail)."""

    def prefill_chunk(self, rid: str, chunk: int, token: int) -> OutOfMemory | None:
        """[LIFE-4] Compute the next `chunk` prompt tokens and checkpoint them; the last one samples `token`."""

    def prefill_batch(self, chunks: Sequence[Mapping]) -> OutOfMemory | None:
        """[LIFE-9] One prefill chunk of each of several requests in one step: every chunk is
        allocated (all or none), then the chunks that complete their prompts are checkpointed
        in order inside one free group (a chunk marked "finish" released there instead, its
        first token ending its request), then the others. `chunks`: {"rid", "chunk", "token"}
        each, as prefill_chunk takes them, and "finish": true on a chunk that completes its
        prompt and ends its request. Optional: an engine offers it with the capability
        batched_prefill."""

    def decode(self, rid: str, token: int) -> OutOfMemory | None:
        """[LIFE-8] Window eviction when due, then one slot for the last sampled token; samples `token`."""

    def finish(self, rid: str, trim: int) -> None:
        """[LIFE-5] Cache what the request owns, less the last `trim` tokens, and free the rest."""

    def finish_batch(self, finishes: Sequence[Mapping]) -> None:
        """[LIFE-10] The requests a decode batch finishes, released in order inside one free
        group. `finishes`: {"rid", "trim"} each, as finish takes them. Optional: an engine
        offers it with the capability batched_finish."""

    def abort(self, rid: str) -> None:
        """[LIFE-5] Release without caching."""

    def retract(self, rid: str) -> None:
        """[LIFE-5] Release without caching, and wait to be admitted again with every token."""

    def evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        """[LIFE-7] Evict from the prefix cache; the tokens freed per pool."""

    def flush(self) -> None:
        """[LIFE-11] With no request running, forget the whole prefix cache: every page of
        every pool free. Optional: an engine offers it with the capability flush."""

    def match(self, prompt: Sequence[int]) -> None:
        """[LIFE-12] The scheduler's match of a waiting request's prompt: the prefix tree may
        split a node where the match ends and refresh the recency of the path it matched;
        nothing is allocated, locked or freed. Optional: an engine offers it with the
        capability waiting_matches."""


@dataclass(frozen=True)
class RunningRequest:
    """[LIFE-1] What the misuse rules read of a running request."""

    finished_prefill: bool
    seq_len: Position
    """Tokens known: prompt and outputs."""
    trimmable: int
    """The most tokens a finish may leave out of the cache: those the request owns (its
    own KV past the prefix it matched)."""
    committed: Position
    """Tokens whose KV is written (kv_committed_len): a batch's chunk that finishes its
    request must reach seq_len from here."""


def refusal(operation: EngineOperation, args: Mapping, running: Mapping[str, RunningRequest], retracted: Collection[str],
            size_full: int) -> str | None:
    """[LIFE-1, LIFE-11, LIFE-12] Why the lifecycle forbids this call, or None if it allows
    it. Every engine refuses what this names, with InvalidRequest and no change, and nothing
    else (a flush while a request runs, a match of an empty prompt among it).
    `args` are the operation's arguments by EngineOperations' names; `running` the
    requests that hold a row, `retracted` those waiting to be admitted again."""
    rid = args.get("rid")
    if operation in (EngineOperation.ADMIT, EngineOperation.PD_ADMIT):
        prompt = args.get("prompt")
        if operation == EngineOperation.PD_ADMIT and not prompt:
            return f"PD-decode request {rid!r} has no prompt; its KV comes from a prefill of at least one token"
        if rid in running:
            return f"request {rid!r} is already running; use a new request id"
        if prompt is None:
            return None if rid in retracted else f"request {rid!r} was not retracted; pass its prompt to admit it"
        tokens = len(prompt) + (operation == EngineOperation.PD_ADMIT)
        if tokens == 0:
            return f"request {rid!r} has no tokens; a prompt needs at least one"
        if tokens + 1 > size_full:
            return (f"request {rid!r}: {tokens} tokens cannot fit the full pool of {size_full} slots; "
                    f"shorten the prompt or grow the pool")
        return None
    if operation == EngineOperation.EVICT:
        if args["full_tokens"] < 0 or args["swa_tokens"] < 0:
            return f"evict needs non-negative token counts (got {args['full_tokens']}, {args['swa_tokens']})"
        return None
    if operation == EngineOperation.MATCH:
        return None if args["prompt"] else "a match needs a prompt of at least one token"
    if operation == EngineOperation.FLUSH:
        if running:
            return (f"flush while requests are running ({', '.join(sorted(running))}): "
                    f"finish, abort or retract them first")
        return None
    if operation == EngineOperation.PREFILL_BATCH:
        return batch_refusal(args["chunks"], running, retracted, size_full)
    if operation == EngineOperation.FINISH_BATCH:
        return batch_refusal(args["finishes"], running, retracted, size_full, EngineOperation.FINISH)
    if rid not in running:
        return f"unknown request {rid!r}: admit it first (running: {sorted(running)})"
    request = running[rid]
    if operation == EngineOperation.PREFILL_CHUNK:
        if request.finished_prefill:
            return f"request {rid!r} has finished its prefill; run decode steps"
        if args["chunk"] < 1:
            return f"a prefill chunk needs chunk_len >= 1 (got {args['chunk']})"
        if args.get("finish") and request.committed + args["chunk"] < request.seq_len:
            return (f"request {rid!r}: a chunk that finishes its request must complete its prompt "
                    f"({request.seq_len - request.committed} tokens left, the chunk has {args['chunk']})")
    elif operation == EngineOperation.DECODE:
        if not request.finished_prefill:
            return f"request {rid!r} is still in prefill; finish its prefill chunks first"
        if request.seq_len + 1 > size_full:
            return f"request {rid!r} would outgrow the full pool; finish it"
    elif operation == EngineOperation.FINISH:
        if not request.finished_prefill:
            return f"request {rid!r} cannot finish during prefill; abort it instead"
        if not 0 <= args["trim"] <= request.trimmable:
            return f"request {rid!r}: trim {args['trim']} must lie within its own tokens (0..{request.trimmable})"
    return None


def batch_refusal(members: Sequence[Mapping], running: Mapping[str, RunningRequest], retracted: Collection[str],
                  size_full: int, each: EngineOperation = EngineOperation.PREFILL_CHUNK) -> str | None:
    """[LIFE-1, LIFE-9, LIFE-10] A batch (the chunks of a prefill batch, the finishes of a
    finish batch) is refused when it is empty, names a request twice, or has a member that
    its one-request operation (`each`) would refuse."""
    what, member = ("prefill batch", "chunk") if each == EngineOperation.PREFILL_CHUNK else ("finish batch", "finish")
    if not members:
        return f"a {what} needs at least one {member}"
    rids = [member["rid"] for member in members]
    if twice := sorted({rid for rid in rids if rids.count(rid) > 1}):
        return f"a {what} names request {twice[0]!r} twice; give each request one {member}"
    for member in members:
        if why := refusal(each, member, running, retracted, size_full):
            return f"in the batch: {why}"
    return None


def admission_match_limit(num_tokens: int) -> int:
    """[LIFE-3] A new request may reuse a cached prefix of at most `num_tokens - 1`
    tokens: the last token is always computed, for its logits.

    pre: num_tokens >= 1
    post: 0 <= __return__ < num_tokens
    """
    return num_tokens - 1


def insert_end(up_to: Position, page_size: int) -> Position:
    """[LIFE-4] A checkpoint caches whole pages only: `[0, floor_page(up_to))`; the rest
    stays the request's own.

    pre: up_to >= 0 and page_size >= 1
    post: __return__ % page_size == 0 and up_to - page_size < __return__ <= up_to
    """
    return floor_page(up_to, page_size)


@dataclass(frozen=True)
class ReleaseSegment:
    """[LIFE-5] One row segment a release frees."""

    start: Position
    end: Position
    with_swa: bool
    """Free full and SWA KV; False: the SWA KV is already released, free the full side only."""


def release_segments(cache_protected_len: Position, swa_evicted_seqlen: Position, owned: Position,
                     kv_allocated_len: Position, page_size: int) -> list[ReleaseSegment]:
    """[LIFE-5] What a release frees: what the request owns, `[cache_protected_len,
    owned)`, and what was allocated past it, from `ceil_page(owned)` to
    `kv_allocated_len` (the page holding `owned - 1` goes with the owned part). Each is
    split at the first position with live SWA, `max(e, cache_protected_len)`: below it
    only the full side is freed.

    pre: page_size >= 1
    pre: cache_protected_len % page_size == 0 and swa_evicted_seqlen % page_size == 0
    pre: 0 <= cache_protected_len <= owned <= kv_allocated_len
    post: all(s.start < s.end and s.start % page_size == 0 for s in __return__)
    post: all(a.end <= b.start for a, b in zip(__return__, __return__[1:]))
    post: all(s.with_swa == (s.start >= max(swa_evicted_seqlen, cache_protected_len)) for s in __return__)
    post: sum(s.end - s.start for s in __return__) == owned - cache_protected_len + max(0, kv_allocated_len - ceil_page(owned, page_size))
    """
    live_from = max(swa_evicted_seqlen, cache_protected_len)
    segments = []
    for start, end in ((cache_protected_len, owned), (ceil_page(owned, page_size), kv_allocated_len)):
        dead_end = min(max(start, live_from), end)
        if dead_end > start:
            segments.append(ReleaseSegment(start, dead_end, with_swa=False))
        if end > dead_end:
            segments.append(ReleaseSegment(dead_end, end, with_swa=True))
    return segments


def pages_to_evict(needed_pages: int, free_pages: int) -> int:
    """[LIFE-7] An allocation that finds a pool short asks the prefix cache to evict the
    shortfall, in pages.

    pre: needed_pages >= 0 and free_pages >= 0
    post: __return__ == max(0, needed_pages - free_pages)
    """
    return max(0, needed_pages - free_pages)
