"""SGLang's real KV cache behind kvspec's engine tier: the hybrid allocator, the
request-to-token pool, `UnifiedRadixCache` with FULL and SWA components (Rust or Python
tree core), real `Req` objects, and the scheduler's own allocation paths.

The adapter plays SGLang's scheduler, one request per batch; each operation calls what
the scheduler calls:

| kvspec step       | SGLang                                                              |
|-------------------|---------------------------------------------------------------------|
| admit             | `Req.init_next_round_input` (match), `tree_cache.lock(last_node)`   |
| prefill_chunk     | `alloc_for_extend` on a one-request `ScheduleBatch`, then `checkpoint_kv_cache` |
| decode            | `check_decode_capacity` (the retract loop's gate), then `alloc_for_decode` (runs `maybe_evict_swa`) |
| finish            | `release_kv_cache(checkpoint=True)` with `finished_len` for a stop  |
| abort / retract   | `release_kv_cache(checkpoint=False)` (+ `reset_for_retract`)         |
| evict             | `tree_cache.evict(EvictParams)`                                     |

Two things are the scheduler's, not the cache's, and are done here as SGLang's
scheduler does them: a request gets its row in its first extend (`alloc_req_slots`),
so until then the view shows its matched prefix as the tree's slots; and an admitted
request dropped before its first extend only gives its lock back. A `RuntimeError`
"out of memory" from an allocation path, or a failed capacity check, is `OutOfMemory`.
"""

import contextlib
import io
import types
from array import array

from kvspec.spec.lifecycle import EngineOperation, RunningRequest, refusal
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest, OutOfMemory
from kvspec.spec.pages import new_pages_for_extend
from kvspec.spec.snapshot import EngineConfig, RequestView, TwoPoolSnapshot, held_full_slots
from kvspec.spec.window import SGLANG_0_5_23, validate_window_config

from .allocator import allocator_state, build_allocator
from .runtime import publish_server_args, sglang
from .tree_view import tree_view

MAX_NEW_TOKENS = 1 << 30


@contextlib.contextmanager
def quiet():
    """SGLang prints its tree on a failed allocation; keep the run's output the
    harness's. (Its error logs are silenced once, in runtime.import_sglang.)"""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class SglangEngine:
    def __init__(self, config: EngineConfig, tree_core: str):
        problems = validate_window_config(config.window, config.page_size, config.policy)
        if config.policy.version != SGLANG_0_5_23:
            problems.append(f"SGLang 0.5.23 implements policy {SGLANG_0_5_23!r}, not {config.policy.version!r}")
        if problems:
            raise InvalidConfig("invalid engine configuration: " + "; ".join(problems))
        s = self.s = sglang()
        publish_server_args(config.page_size, config.policy.decode_eviction_interval)
        self.config = config
        self.P = config.page_size
        self.allocator = build_allocator(config.size_full, config.size_swa, config.page_size)
        self.req_to_token_pool = s.ReqToTokenPool(size=config.max_requests, max_context_len=config.size_full + self.P,
                                                  device="cpu", enable_memory_saver=False)
        self.cache = s.UnifiedRadixCache(s.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.P, sliding_window_size=config.window,
            tree_components=(s.ComponentType.FULL, s.ComponentType.SWA), tree_core_backend=tree_core))
        self.requests: dict[str, object] = {}
        self.finished_prefill: set[str] = set()
        self.retracted: dict[str, object] = {}

    # -- helpers --------------------------------------------------------------------------

    def refuse_misuse(self, operation: EngineOperation, **args) -> None:
        """[LIFE-1] Raise InvalidRequest, before SGLang is called, for a call the lifecycle
        forbids. A finish may trim only written output tokens the request owns."""
        running = {rid: RunningRequest(rid in self.finished_prefill, req.seqlen,
                                       min(req.kv.kv_committed_len - len(req.origin_input_ids),
                                           req.kv.kv_committed_len - req.kv.cache_protected_len))
                   for rid, req in self.requests.items()}
        if why := refusal(operation, args, running, self.retracted, self.config.size_full):
            raise InvalidRequest(why)

    def batch(self, req, mode: str):
        """A one-request ScheduleBatch with the fields SGLang's allocation paths read."""
        s = self.s
        batch = object.__new__(s.ScheduleBatch)
        batch.reqs = [req]
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

    def extend_fits(self, prefix_len: int, seq_len: int) -> bool:
        """The scheduler's gate before an extend (SGLang's prefill adder never schedules
        one that cannot be allocated; a failing alloc_for_extend is fatal there, and
        leaves the request holding an empty row): evict what the allocation path would
        (its conservative demand, extend + one page per request), then SGLang's own
        capacity check."""
        P = self.P
        demand = seq_len - prefix_len + (P if P > 1 else 0)
        with quiet():
            self.allocator.evict_to_free_tokens(self.cache, demand)
        pages = new_pages_for_extend(prefix_len, seq_len, P)
        return self.allocator.new_pages_available(pages, pages)

    def out_of_memory(self) -> OutOfMemory:
        full, swa = (size // self.P for size in (self.allocator.full_available_size(),
                                                  self.allocator.swa_available_size()))
        return OutOfMemory("full" if full <= swa else "swa", 1, min(full, swa))

    # -- admission ------------------------------------------------------------------------

    def admit(self, rid: str, prompt: list[int] | None = None) -> OutOfMemory | None:
        s = self.s
        self.refuse_misuse(EngineOperation.ADMIT, rid=rid, prompt=prompt)
        if prompt is None:
            req = self.retracted[rid]
        else:
            sampling = s.SamplingParams(temperature=0, max_new_tokens=MAX_NEW_TOKENS)
            sampling.normalize(None)
            req = s.Req(rid=rid, origin_input_text="", origin_input_ids=array("q", prompt), sampling_params=sampling)
        if len(self.requests) >= self.config.max_requests:  # the prefill adder's row budget
            return OutOfMemory("requests", 1, 0)
        self.retracted.pop(rid, None)
        req.init_next_round_input(self.cache)
        req.lock = self.cache.lock(req.last_node)
        self.requests[rid] = req
        return None

    def pd_admit(self, rid: str, prompt: list[int], first_output: int) -> OutOfMemory | None:
        raise InvalidRequest("the sglang adapter does not drive SGLang's PD-decode pre-allocation "
                             "(capability pd_decode); its allocator path is checked at the allocator tier")

    # -- prefill and decode ---------------------------------------------------------------

    def prefill_chunk(self, rid: str, chunk_len: int, next_token: int = 0) -> OutOfMemory | None:
        s = self.s
        self.refuse_misuse(EngineOperation.PREFILL_CHUNK, rid=rid, chunk=chunk_len)
        req = self.requests[rid]
        req.refresh_fill_ids()
        fill_len = len(req.full_untruncated_fill_ids)
        req.extend_end = min(req.prefix_len + chunk_len, fill_len)
        batch = self.batch(req, "EXTEND")
        batch.prefix_lens = [req.prefix_len]
        batch.extend_lens = [req.extend_end - req.prefix_len]
        batch.extend_num_tokens = req.extend_end - req.prefix_len
        batch.seq_lens = s.torch.tensor([req.extend_end], dtype=s.torch.int64)
        batch.seq_lens_cpu = batch.seq_lens.clone()
        if not self.extend_fits(req.prefix_len, req.extend_end):
            return self.out_of_memory()
        with quiet():
            s.alloc_for_extend(batch)
        req.extend_batch_idx += 1
        s.checkpoint_kv_cache(req, self.cache)
        if req.extend_end == fill_len:
            self.finished_prefill.add(rid)
            req.output_ids.append(next_token)
        return None

    def decode(self, rid: str, next_token: int = 0) -> OutOfMemory | None:
        s = self.s
        self.refuse_misuse(EngineOperation.DECODE, rid=rid)
        req = self.requests[rid]
        batch = self.batch(req, "DECODE")
        batch.seq_lens = s.torch.tensor([req.kv.kv_committed_len], dtype=s.torch.int64)
        batch.seq_lens_cpu = batch.seq_lens.clone()
        batch.req_pool_indices = s.torch.tensor([req.kv.req_pool_idx], dtype=s.torch.int64)
        batch.req_pool_indices_cpu = batch.req_pool_indices.clone()
        if not self.allocator.check_decode_capacity(num_tokens=batch.new_tokens_required_next_decode(),
                                                    tree_cache=self.cache, requests=[req]):
            return self.out_of_memory()
        with quiet():
            s.alloc_for_decode(batch, token_per_req=1)
        req.decode_batch_idx += 1
        req.output_ids.append(next_token)
        return None

    # -- release ----------------------------------------------------------------------

    def release(self, rid: str, checkpoint: bool):
        req = self.requests[rid]
        if req.kv.holds_kv:
            self.s.release_kv_cache(req, self.cache, checkpoint=checkpoint)
        else:  # dropped before its first extend: it holds only its lock
            self.cache.unlock(req.lock)
            req.lock = None
        del self.requests[rid]
        self.finished_prefill.discard(rid)
        return req

    def finish(self, rid: str, trim: int = 0) -> None:
        self.refuse_misuse(EngineOperation.FINISH, rid=rid, trim=trim)
        req = self.requests[rid]
        written_outputs = req.kv.kv_committed_len - len(req.origin_input_ids)
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

    # -- observation ------------------------------------------------------------------

    def request_view(self, rid: str, req) -> RequestView:
        kv = req.kv
        if kv.holds_kv:
            row = tuple(self.req_to_token_pool.req_to_token[kv.req_pool_idx, :kv.kv_allocated_len].tolist())
            allocated, committed = kv.kv_allocated_len, kv.kv_committed_len
        else:  # admitted, no extend yet: its prefix is the tree's (see the module docstring)
            row = tuple(self.cache.prefix_device_indices(req).tolist())
            allocated = committed = req.prefix_len
        return RequestView(rid, row, kv.cache_protected_len, kv.get_evicted_seqlen(self.s.ComponentType.SWA),
                           allocated, committed, req.seqlen, req.decode_batch_idx, rid in self.finished_prefill,
                           None if req.lock is None else int(req.lock.node))

    def snapshot(self) -> TwoPoolSnapshot:
        nodes, ledgers = tree_view(self.cache, self.s.ComponentType)
        return TwoPoolSnapshot(self.config, allocator_state(self.allocator),
                              tuple(self.request_view(rid, req) for rid, req in self.requests.items()), nodes, ledgers)

    def partial_snapshot(self) -> TwoPoolSnapshot:
        """[OBS-4] Free counts and the mapping at the held slots only, for large pools."""
        nodes, ledgers = tree_view(self.cache, self.s.ComponentType)
        requests = tuple(self.request_view(rid, req) for rid, req in self.requests.items())
        return TwoPoolSnapshot(self.config, allocator_state(self.allocator, held_full_slots(requests, nodes)), requests, nodes, ledgers)
