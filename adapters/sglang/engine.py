"""SGLang's real KV cache behind kvspec's engine tier: the hybrid allocator, the
request-to-token pool, `UnifiedRadixCache` with FULL and SWA components (Rust or Python
tree core), real `Req` objects, and the scheduler's own allocation paths.

The adapter plays SGLang's scheduler, one request per batch but for prefill_batch; each
operation calls what the scheduler calls:

| kvspec step       | SGLang                                                              |
|-------------------|---------------------------------------------------------------------|
| admit             | `Req.init_next_round_input` (match), `tree_cache.lock(last_node)`   |
| pd_admit          | `DecodePreallocQueue._match_prefix_and_lock`, `prealloc_fits`, `_pre_alloc` (pd_decode.py), then `process_prebuilt`'s checkpoint |
| prefill_chunk     | `alloc_for_extend` on a one-request `ScheduleBatch`, then `checkpoint_kv_cache` |
| prefill_batch     | `alloc_for_extend` on the whole `ScheduleBatch`, then, as `process_batch_result_prefill`, `checkpoint_kv_cache` of the requests it completes inside one free group (from 0.5.18), then of the others (the next round's) |
| decode            | `check_decode_capacity` (the retract loop's gate), then `alloc_for_decode` (runs `maybe_evict_swa`) |
| finish            | `release_kv_cache(checkpoint=True)` with `finished_len` for a stop  |
| finish_batch      | as `process_batch_result_decode`: the finishes' `release_kv_cache(checkpoint=True)` inside one free group |
| abort / retract   | `release_kv_cache(checkpoint=False)` (+ `reset_for_retract`)         |
| evict             | `tree_cache.evict(EvictParams)`                                     |
| match             | a waiting request's match under a cache-aware policy (`_compute_prefix_matches`): `match_kv_cache(req, tree_cache)` (from 0.5.22; `match_prefix_for_req(tree_cache, req)` before), on a `Req` no one admits |
| flush             | as `Scheduler.flush_cache` when idle: `tree_cache.reset()`, `req_to_token_pool.clear()`, the allocator's `clear()`, `reset_aux_cache_allocator()` (from 0.5.19) |

Two things are the scheduler's, not the cache's, and are done here as SGLang's
scheduler does them: a request gets its row in its first extend (`alloc_req_slots`),
so until then the view shows its matched prefix as the tree's slots; and an admitted
request dropped before its first extend only gives its lock back. A `RuntimeError`
"out of memory" from an allocation path, or a failed capacity check, is `OutOfMemory`.
"""

import contextlib
import io
import os
import types
from array import array

from kvspec.spec.lifecycle import EngineOperation, RunningRequest, refusal
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest, OutOfMemory
from kvspec.spec.pages import new_pages_for_extend, pages_for
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import SGLANG_0_5_23, validate_window_config

from . import pd_decode
from .allocator import build_allocator
from .runtime import publish_server_args, sglang
from .state import StateModel, build_state_pool, state_problems
from .view import SglangCacheView

MAX_NEW_TOKENS = 1 << 30


@contextlib.contextmanager
def quiet():
    """SGLang prints its tree on a failed allocation; keep the run's output the
    harness's. (Its error logs are silenced once, in runtime.import_sglang.)"""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class SglangEngine(SglangCacheView):
    """SGLang 0.5.22 and 0.5.23; what it shows is view.py's. The `sglang@` adapters of older
    releases subclass it (adapters/sglang/releases/): each overrides the few methods, below
    and in view.py, whose SGLang API its releases spell differently (marked "seam")."""

    ENVIRONMENT = ("SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS", "SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN",
                   "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW", "SGLANG_ENABLE_UNIFIED_RADIX_TREE",
                   "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "SGLANG_OPT_RELEASE_PREFILL_SWA",
                   "SGLANG_OPT_SWA_RADIX_CACHE_COMPACT", "SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT")
    """The knobs an engine sets; any other engine's settings are cleared first. From 0.5.22
    SGLang reads SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW as the deprecated name of
    SGLANG_OPT_RELEASE_PREFILL_SWA and copies its value there (environ.py,
    `_DeprecatedEnvFallback.get`): the copy is cleared too, or an engine built after one
    with early-swa-unlock in the same process would inherit it."""

    def __init__(self, config: EngineConfig, tree: str = "rust", release: str = "0.5.23",
                 policy_version: str = SGLANG_0_5_23, environment: dict[str, str] | None = None,
                 need_sort: bool = False, eviction_policy: str = "lru"):
        problems = validate_window_config(config.window, config.page_size, config.policy)
        if config.policy.version != policy_version:
            problems.append(f"SGLang {release} implements policy {policy_version!r}, not {config.policy.version!r}")
        if config.state_slots:
            problems += state_problems(config)
        if problems:
            raise InvalidConfig("invalid engine configuration: " + "; ".join(problems))
        for variable in self.ENVIRONMENT:  # SGLang reads them at each use
            os.environ.pop(variable, None)
        os.environ.update(environment or {})
        s = self.s = sglang()
        if s.version != release:
            raise InvalidConfig(f"this process imported SGLang {s.version}, not {release}")
        self.state = bool(config.state_slots)
        """[STATE-1] A model with recurrent layers: FULL + SWA + MAMBA (state.py)."""
        publish_server_args(config.page_size, config.policy.decode_eviction_interval,
                            mamba_chunk_size=config.state_grid if self.state else None)
        self.config = config
        self.groups_prefill_results = tuple(int(part) for part in release.split(".")[:3]) >= (0, 5, 18)
        """process_batch_result_prefill opens a free group around a batch's results from 0.5.18
        (0.5.18 managers/scheduler_components/batch_result_processor.py:199, 365; 0.5.23 :264, 501)."""
        self.P = config.page_size
        self.tree_core = tree
        self.allocator = build_allocator(config.size_full, config.size_swa, config.page_size, need_sort)
        self.eviction_policy = eviction_policy
        """The tree's order of evicting full-attention leaves (server argument radix_eviction_policy)."""
        if self.state:
            self.req_to_token_pool = build_state_pool(config, max_context_len=config.size_full + self.P)
            self.state_model = StateModel(self.req_to_token_pool)
        else:
            self.req_to_token_pool = s.ReqToTokenPool(size=config.max_requests,
                                                      max_context_len=config.size_full + self.P,
                                                      device="cpu", enable_memory_saver=False)
        self.cache = self.make_cache()
        self.requests: dict[str, object] = {}
        self.finished_prefill: set[str] = set()
        self.retracted: dict[str, object] = {}

    # -- seams: where releases differ -----------------------------------------------------

    def make_cache(self):
        s = self.s
        return s.UnifiedRadixCache(s.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.P, sliding_window_size=self.config.window, eviction_policy=self.eviction_policy,
            tree_components=(s.ComponentType.FULL, s.ComponentType.SWA)
            + ((s.ComponentType.MAMBA,) if self.state else ()), tree_core_backend=self.tree_core))

    def lock(self, req) -> None:
        req.lock = self.cache.lock(req.last_node)

    def unlock(self, req) -> None:
        self.cache.unlock(req.lock)
        req.lock = None

    def start_extend(self, req, chunk_len: int) -> tuple[int, int, int]:
        """Set the request's extend range; (prefix_len, extend_end, fill_len)."""
        req.refresh_fill_ids()
        fill_len = len(req.full_untruncated_fill_ids)
        req.extend_end = min(req.prefix_len + chunk_len, fill_len)
        return req.prefix_len, req.extend_end, fill_len

    def extended(self, req, extend_end: int) -> None:
        """Bookkeeping the scheduler does after an extend's allocation (none from 0.5.22)."""

    def checkpoint(self, req) -> None:
        self.s.checkpoint_kv_cache(req, self.cache)

    def release_kv(self, req, checkpoint: bool) -> None:
        self.s.release_kv_cache(req, self.cache, checkpoint=checkpoint)

    def decode_fits(self, batch, req) -> bool:
        return self.allocator.check_decode_capacity(num_tokens=batch.new_tokens_required_next_decode(),
                                                    tree_cache=self.cache, requests=[req])

    # -- helpers --------------------------------------------------------------------------

    def refuse_misuse(self, operation: EngineOperation, **args) -> None:
        """[LIFE-1] Raise InvalidRequest, before SGLang is called, for a call the lifecycle
        forbids. A finish may trim only written output tokens the request owns."""
        running = {}
        for rid, req in self.requests.items():
            kv = self.kv(req)
            running[rid] = RunningRequest(rid in self.finished_prefill, req.seqlen,
                                          min(kv.committed - len(req.origin_input_ids), kv.committed - kv.protected),
                                          self.committed(req, kv))
        if why := refusal(operation, args, running, self.retracted, self.config.size_full):
            raise InvalidRequest(why)

    def batch(self, reqs: list, mode: str):
        """A ScheduleBatch of these requests with the fields SGLang's allocation paths read."""
        s = self.s
        batch = object.__new__(s.ScheduleBatch)
        batch.reqs = list(reqs)
        batch.tree_cache = self.cache
        batch.token_to_kv_pool_allocator = self.allocator
        batch.req_to_token_pool = self.req_to_token_pool
        batch.forward_mode = getattr(s.ForwardMode, mode)
        batch.device = "cpu"
        batch.enable_overlap = False
        batch.hisparse_coordinator = None
        batch.dllm_config = None
        batch.forward_iter = 0
        batch.model_config = types.SimpleNamespace(is_encoder_decoder=False)
        batch.spec_algorithm = types.SimpleNamespace(is_none=lambda: True)
        return batch

    def extend_fits(self, extents: list[tuple[int, int]]) -> bool:
        """The scheduler's gate before a batch of extends, each (prefix_len, seq_len)
        (SGLang's prefill adder never schedules one that cannot be allocated; a failing
        alloc_for_extend is fatal there, and leaves the request holding an empty row): evict
        what the allocation path would (its conservative demand, extend + one page per
        request), then SGLang's own capacity check."""
        P = self.P
        with quiet():
            self.evict_for_extend(sum(seq_len - prefix_len + (P if P > 1 else 0) for prefix_len, seq_len in extents))
        pages = sum(new_pages_for_extend(prefix_len, seq_len, P) for prefix_len, seq_len in extents)
        return self.allocator.new_pages_available(pages, pages)

    def evict_for_extend(self, tokens: int) -> None:
        """The allocation path's eviction before an extend (allocator/base.py evict_to_free_tokens)."""
        self.allocator.evict_to_free_tokens(self.cache, tokens)

    def new_req(self, rid: str, prompt: list[int]):
        """A request as the tokenizer manager hands it to the scheduler: greedy, no output limit."""
        s = self.s
        sampling = s.SamplingParams(temperature=0, max_new_tokens=MAX_NEW_TOKENS)
        sampling.normalize(None)
        return s.Req(rid=rid, origin_input_text="", origin_input_ids=array("q", prompt), sampling_params=sampling)

    def out_of_memory(self) -> OutOfMemory:
        full, swa = (size // self.P for size in (self.allocator.full_available_size(),
                                                  self.allocator.swa_available_size()))
        return OutOfMemory("full" if full <= swa else "swa", 1, min(full, swa))

    # -- admission ------------------------------------------------------------------------

    def admit(self, rid: str, prompt: list[int] | None = None) -> OutOfMemory | None:
        self.refuse_misuse(EngineOperation.ADMIT, rid=rid, prompt=prompt)
        req = self.retracted[rid] if prompt is None else self.new_req(rid, prompt)
        if len(self.requests) >= self.config.max_requests:  # the prefill adder's row budget
            return OutOfMemory("requests", 1, 0)
        if self.state:
            return self.admit_with_state(rid, req)
        self.retracted.pop(rid, None)
        req.init_next_round_input(self.cache)
        self.lock(req)
        self.requests[rid] = req
        return None

    def admit_with_state(self, rid: str, req) -> OutOfMemory | None:
        """[STATE-2, STATE-5] The scheduler's admission of a request of a hybrid model
        (`get_new_batch_prefill`, managers/scheduler.py:4198-4309): a group of state
        slots is set aside for the waiting queue (here, this request), the match
        copies-on-write a hit's checkpoint into a slot of its own
        (`MambaComponent.finalize_match_result_in_cache`, mamba.py:196-225: the copy itself
        is deferred to the forward), the group's unused slots go back, and the request
        locks its last node.

        A request without a hit gets its working slot in SGLang's next act, the same
        scheduling step: `alloc_req_slots` of its first extend (allocation.py:326-347:
        `ensure_mamba_capacity` evicts unlocked checkpoints, then
        `HybridReqToTokenPool.alloc`, memory_pool.py:1594-1602, takes a slot and stages
        its clear). kvspec's admission is that step up to the first chunk, so the adapter
        takes the slot here, by those same lines; the first extend then finds it held and
        keeps it (memory_pool.py:1594). If no slot is left, admission is refused as the
        scheduler refuses a request it does not add (scheduler.py:4285-4298): the staged
        copy and clear are dropped and the slot it took, if any, goes back."""
        s = self.s
        allocator = self.req_to_token_pool.mamba_allocator
        allocator.alloc_group_begin(1)
        try:
            req.init_next_round_input(self.cache)
        finally:
            allocator.alloc_group_end()
        self.lock(req)
        if not req.kv.holds_mamba:
            s.ensure_mamba_capacity(self.req_to_token_pool, [req], self.cache)
            slot = allocator.alloc(1)
            if slot is None:
                req.kv.mamba_cow_src_index = None
                req.kv.mamba_needs_clear = False
                self.unlock(req)
                return OutOfMemory("state", 1, 0)
            req.kv.mamba_pool_idx = slot[0]
            req.kv.mamba_needs_clear = True
        self.retracted.pop(rid, None)
        self.requests[rid] = req
        return None

    def pd_admit(self, rid: str, prompt: list[int], first_output: int) -> OutOfMemory | None:
        """[LIFE-6] SGLang's decode server taking a request whose prompt KV a prefill server
        computed: one pass of `DecodePreallocQueue.pop_preallocated` for it
        (`disaggregation/decode.py:1333-1842`), with the decode-side radix cache on
        (pd_decode.py). SGLang's own methods match (capped clear of the SWA tail), check
        the budgets, reclaim SWA and pre-allocate; the adapter does what the loop does
        between them. Then the transfer's first output token is appended
        (`_commit_transfer_to_req`, `:2699`) and the prompt is checkpointed into the tree
        (`process_prebuilt`, `decode_schedule_batch_mixin.py:119-122`): the request is
        decoding.

        The admission demand is the allocation's (`_required_alloc_tokens`, the SWA tail's
        pages from `_prealloc_required_tokens`), without the `max_new_tokens` projection
        of `_required_admission_tokens` (clipped at 4096 tokens): kvspec's requests have
        no output limit, and each decode step allocates or fails itself. A refused budget,
        a failed SWA reclaim (where SGLang aborts the request) or pools still short after
        the eviction `_pre_alloc` would make is `OutOfMemory`, before SGLang allocates (its
        allocation asserts it cannot fail)."""
        s = self.s
        self.refuse_misuse(EngineOperation.PD_ADMIT, rid=rid, prompt=prompt)
        if self.state:  # the transfer would bring the prompt's state too (disaggregation/decode.py:871, cow_mamba)
            raise NotImplementedError("this adapter drives no PD-decode admission of a model with recurrent state: "
                                      "the state runs are at page size 1, where the engine machine draws none")
        if len(self.requests) >= self.config.max_requests or self.req_to_token_pool.available_size() <= 0:
            return OutOfMemory("requests", 1, 0)  # the row budget (pop_preallocated, `:1481`)
        req = self.new_req(rid, prompt)
        queue = pd_decode.prealloc_queue(self)
        with pd_decode.decode_radix_cache(), quiet():
            # pop_preallocated, the decode-radix branch (`:1498-1544`)
            match = self.pd_match(queue, req)
            required = queue._required_alloc_tokens(fill_len=match.fill_len, prefix_len=match.prefix_len)
            if not self.pd_fits(queue, req, required):
                return self.pd_refused(queue, req, match)
            # `_pre_alloc` evicts the full pool's shortfall (`:2279-2300`), then asserts (`:2357`) its
            # allocation succeeded: make that eviction first and check the pools
            if queue._radix_full_available() < required:
                self.cache.evict_for_alloc(s.EvictParams(num_tokens=required - queue._radix_full_available()))
            tail = queue._swa_tail_len(match.fill_len)
            swa_pages = pages_for(tail, self.P) if queue._uses_swa_tail_prealloc() else match.fill_len - match.prefix_len
            if not self.allocator.new_pages_available(new_pages_for_extend(match.prefix_len, match.fill_len, self.P),
                                                      swa_pages):
                return self.pd_refused(queue, req, match)
            queue._pre_alloc(req, match.prefix_indices, match.prefix_len, match.total_prefix_len)
            req.kv.cache_protected_len = match.total_prefix_len  # (`:1636`)
            # the KV arrived: the prefill server's first output (`_commit_transfer_to_req`)
            req.output_ids.append(first_output)
            # the prebuilt batch (`process_prebuilt`): no SWA branching window, a checkpoint
            req.swa_branching_seqlen = None
            self.checkpoint(req)
        self.requests[rid] = req
        self.finished_prefill.add(rid)
        return None

    def pd_match(self, queue, req) -> pd_decode.PdMatch:
        """The decode-side match (`_match_prefix_and_lock` caps it clear of the SWA tail,
        `:860-946`); the matched prefix's SWA lock goes back at once, as SGLang transfers
        the tail fresh (`tree_cache.release_swa`, `:1512-1518`)."""
        match = queue._match_prefix_and_lock(req)
        if queue._uses_swa_tail_prealloc() and match.l1_prefix_len > 0 and hasattr(self.cache, "release_swa"):
            self.cache.release_swa(req.lock)
        return pd_decode.PdMatch(match.prefix_indices, match.l1_prefix_len, match.decode_prefix_len,
                                 queue._pre_alloc_fill_len(req), match.l1_prefix_len)

    def pd_fits(self, queue, req, required: int) -> bool:
        """The budgets (`:1546-1579`) and the SWA reclaim (`:1582-1606`, where SGLang aborts
        the request). The demand is the allocation's, without the `max_new_tokens`
        projection of `_required_admission_tokens` (pd_admit's docstring)."""
        uses_swa_tail = queue._uses_swa_tail_prealloc()
        full_budget = queue._allocatable_token_budgets(retractable_tokens=0, count_retracted=True,
                                                       extra_reserved_reqs=0, hicache_reserved_tokens=0)
        swa_budget = queue._swa_tail_allocatable_token_budget(
            retractable_tokens=0, retractable_swa_tokens=0, count_retracted=True,
            extra_reserved_reqs=0) if queue._uses_swa_reservation() else None
        full_required = required + queue.num_reserved_decode_tokens
        swa_required = queue._prealloc_required_tokens(req)[1] if uses_swa_tail else 0
        swa_len = queue._prealloc_kv_lens(req)[1] if uses_swa_tail else required
        if not queue._prealloc_reservation_fits(full_required, swa_required, full_allocatable_tokens=full_budget,
                                                swa_allocatable_tokens=swa_budget):
            return False
        return swa_budget is None or queue._reclaim_swa_tail_capacity(swa_len, req.rid, full_len=required) is None

    def pd_refused(self, queue, req, match: pd_decode.PdMatch) -> OutOfMemory:
        """A PD request that does not fit: SGLang gives its lock back where it matched
        something (`disaggregation/decode.py:1576-1578`)."""
        if match.locked:
            self.unlock(req)
        return self.out_of_memory()

    # -- prefill and decode ---------------------------------------------------------------

    def prefill_chunk(self, rid: str, chunk_len: int, next_token: int = 0) -> OutOfMemory | None:
        self.refuse_misuse(EngineOperation.PREFILL_CHUNK, rid=rid, chunk=chunk_len)
        return self.prefill([(rid, chunk_len, next_token)])

    def prefill_batch(self, chunks: list[dict]) -> OutOfMemory | None:
        """[LIFE-9] One extend batch, as the scheduler runs it: alloc_for_extend of the
        whole batch, the forward, then process_batch_result_prefill, which checkpoints the
        requests whose prompts the batch completes inside one free group (from 0.5.18:
        groups_prefill_results); a request still being chunked is checkpointed at the next
        round (get_new_batch_prefill), outside it. A request whose first sampled token ends it
        (`finish`) is released there instead of checkpointed: `release_kv_cache` of a request
        `req.finished()` in the same loop (0.5.23 batch_result_processor.py:378-392; 0.5.14
        :239, `release_kv_cache(req, tree_cache)` beside `maybe_cache_unfinished_req`)."""
        self.refuse_misuse(EngineOperation.PREFILL_BATCH, chunks=chunks)
        return self.prefill([(chunk["rid"], chunk["chunk"], chunk["token"]) for chunk in chunks],
                            finishing={chunk["rid"] for chunk in chunks if chunk.get("finish")})

    def prefill(self, chunks: list[tuple[str, int, int]], finishing: set[str] = frozenset()) -> OutOfMemory | None:
        s = self.s
        reqs = [self.requests[rid] for rid, _, _ in chunks]
        extents = [self.start_extend(req, chunk_len) for req, (_, chunk_len, _) in zip(reqs, chunks)]
        batch = self.batch(reqs, "EXTEND")
        batch.prefix_lens = [prefix_len for prefix_len, _, _ in extents]
        batch.extend_lens = [extend_end - prefix_len for prefix_len, extend_end, _ in extents]
        batch.extend_num_tokens = sum(batch.extend_lens)
        batch.seq_lens = s.torch.tensor([extend_end for _, extend_end, _ in extents], dtype=s.torch.int64)
        batch.seq_lens_cpu = batch.seq_lens.clone()
        if not self.extend_fits([(prefix_len, extend_end) for prefix_len, extend_end, _ in extents]):
            return self.out_of_memory()
        with quiet():
            s.alloc_for_extend(batch)
        if self.state:  # the forward: the recurrent layers read the chunk (state.py)
            self.state_model.before_forward(batch)
        for req, (prefix_len, extend_end, _) in zip(reqs, extents):
            if self.state:
                self.state_model.forward(req, req.full_untruncated_fill_ids[prefix_len:extend_end])
            self.extended(req, extend_end)
            req.extend_batch_idx += 1
        completing = [(rid, req, token) for (rid, _, token), req, (_, extend_end, fill_len)
                      in zip(chunks, reqs, extents) if extend_end == fill_len]
        # a one-request batch's group changes nothing observable (its window release frees only
        # positions its own insert leaves tombstoned), so a single chunk runs without one
        group = self.groups_prefill_results and len(reqs) > 1
        if group:
            self.allocator.free_group_begin()
        for rid, req, token in completing:
            if rid in finishing:  # sampled, and req.finished() after update_finish_state: released in the loop
                req.output_ids.append(token)
                self.finished(rid, 0)
                continue
            self.checkpoint(req)
            self.finished_prefill.add(rid)
            req.output_ids.append(token)
        if group:
            self.allocator.free_group_end()
        completed = {rid for rid, _, _ in completing}
        for (rid, _, _), req in zip(chunks, reqs):
            if rid not in completed:  # still being chunked: cached at the next round
                self.checkpoint(req)
        return None

    def decode(self, rid: str, next_token: int = 0) -> OutOfMemory | None:
        s = self.s
        self.refuse_misuse(EngineOperation.DECODE, rid=rid)
        req = self.requests[rid]
        batch = self.batch([req], "DECODE")
        kv = self.kv(req)
        batch.seq_lens = s.torch.tensor([kv.committed], dtype=s.torch.int64)
        batch.seq_lens_cpu = batch.seq_lens.clone()
        batch.req_pool_indices = s.torch.tensor([kv.row], dtype=s.torch.int64)
        batch.req_pool_indices_cpu = batch.req_pool_indices.clone()
        if not self.decode_fits(batch, req):
            return self.out_of_memory()
        with quiet():
            s.alloc_for_decode(batch, token_per_req=1)
        if self.state:  # the forward reads the last sampled token, at position kv.committed
            self.state_model.forward(req, (req.origin_input_ids + req.output_ids)[kv.committed:kv.committed + 1])
        req.decode_batch_idx += 1
        req.output_ids.append(next_token)
        return None

    # -- release ----------------------------------------------------------------------

    def release(self, rid: str, checkpoint: bool):
        req = self.requests[rid]
        if self.kv(req).holds_kv:
            self.release_kv(req, checkpoint)
        else:  # dropped before its first extend: it holds only its lock (and, with state, its slot)
            if self.state:  # release_kv_cache frees a slot taken before any KV (common.py:403-415)
                self.release_kv(req, checkpoint)
            self.unlock(req)
        del self.requests[rid]
        self.finished_prefill.discard(rid)
        return req

    def finish(self, rid: str, trim: int = 0) -> None:
        self.refuse_misuse(EngineOperation.FINISH, rid=rid, trim=trim)
        self.finished(rid, trim)

    def finish_batch(self, finishes: list[dict]) -> None:
        """[LIFE-10] A decode batch's results, as process_batch_result_decode handles them in
        every release from 0.5.14 (0.5.23 `managers/scheduler_components/batch_result_processor.py`,
        its free_group_begin and free_group_end around the loop): each finished request's
        release_kv_cache inside one free group."""
        self.refuse_misuse(EngineOperation.FINISH_BATCH, finishes=finishes)
        self.allocator.free_group_begin()
        for finish in finishes:
            self.finished(finish["rid"], finish["trim"])
        self.allocator.free_group_end()

    def finished(self, rid: str, trim: int) -> None:
        req = self.requests[rid]
        written_outputs = self.kv(req).committed - len(req.origin_input_ids)
        req.finished_reason = self.s.FINISH_LENGTH(length=len(req.output_ids))
        if trim:  # a stop: the tokens after it are not kept
            req.finished_len = written_outputs - trim
        self.release(rid, checkpoint=True)

    def abort(self, rid: str) -> None:
        self.refuse_misuse(EngineOperation.ABORT, rid=rid)
        self.release(rid, checkpoint=False)

    def retract(self, rid: str) -> None:
        self.refuse_misuse(EngineOperation.RETRACT, rid=rid)
        req = self.release(rid, checkpoint=False)
        req.reset_for_retract()
        self.retracted[rid] = req

    def evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        self.refuse_misuse(EngineOperation.EVICT, full_tokens=full_tokens, swa_tokens=swa_tokens)
        result = self.cache.evict(self.s.EvictParams(num_tokens=full_tokens, swa_num_tokens=swa_tokens))
        return result.num_tokens_evicted, result.swa_num_tokens_evicted

    def match(self, prompt: list[int]) -> None:
        """[LIFE-12] `SchedulePolicy._compute_prefix_matches` (LPM, DFS-weight) matching one
        waiting request, as every release does each scheduling round: the whole prompt, no
        admission limit, the hit adopted by the `Req` and nothing locked (0.5.23
        managers/schedule_policy.py:352-356; 0.5.14 :260, match_prefix_for_req :85-120). The
        `Req` is dropped after: it is still waiting."""
        self.refuse_misuse(EngineOperation.MATCH, prompt=prompt)
        req = self.new_req("waiting", prompt)
        with quiet():
            if self.s.match_waiting.__name__ == "match_kv_cache":
                self.s.match_waiting(req, self.cache)
            else:
                self.s.match_waiting(self.cache, req)

    def flush(self) -> None:
        """[LIFE-11] `Scheduler.flush_cache` of an idle server, the same four calls in every
        release (0.5.14 managers/scheduler.py:3642-3647, 0.5.23 :5520-5526; the aux cache's
        reset from 0.5.19). A retracted request keeps its `Req`: readmitted, it matches anew."""
        self.refuse_misuse(EngineOperation.FLUSH)
        self.cache.reset()
        self.req_to_token_pool.clear()
        self.allocator.clear()
        if hasattr(self.req_to_token_pool, "reset_aux_cache_allocator"):
            self.req_to_token_pool.reset_aux_cache_allocator()
