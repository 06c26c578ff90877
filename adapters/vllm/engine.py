"""vLLM 0.33.0's real v1 KV cache manager behind kvspec's engine tier.

One `KVCacheManager` with two layer groups, full attention and sliding window, over
one shared block pool (spec chapter 08): the block size is the page size, the pool has
as many blocks as the configuration's two pools have pages together, plus the null
block, and vLLM's `sliding_window` is the spec's window plus one (vLLM counts the
current token in its window, the spec counts the tokens before it).

The adapter plays vLLM's scheduler in synchronous mode, one request per step (nothing
is ever in flight), as its `schedule()` and `update_from_output()` drive the manager:

| kvspec step   | vLLM                                                                      |
|---------------|---------------------------------------------------------------------------|
| admit         | `Request(...)`, `get_computed_blocks` (the prefix hit), `allocate_slots(req, 0, hit, blocks)` (adopts the hit blocks) |
| prefill_chunk | `allocate_slots(req, n)`, then the "forward": `num_computed_tokens += n`; the last chunk appends the sampled token |
| decode        | `allocate_slots(req, 1)`, `num_computed_tokens += 1`, `append_output_token_ids` |
| finish, abort | `free(req)`                                                               |
| retract       | `free(req)`, `num_computed_tokens = 0` (preemption); admitted again through the hit path |
| evict         | `BlockPool.evict_blocks` of the least recently used cached free blocks, per group: vLLM evicts lazily (a cached block with no reference is already free), so an eviction only drops prefix-cache keys |

vLLM's scheduler admits a request with its first chunk in one `allocate_slots`; here
admission adopts the hit first and the chunk follows, so a request is visible between
the two as the spec's engine tier has it (LIFE-3). A `None` from `allocate_slots` is
`OutOfMemory`; an admission that fails leaves the waiting queue (`free`, as the
scheduler frees an aborted waiting request). What vLLM does not check (unknown
requests, a decode during prefill, finishing twice), the scheduler would never ask;
the adapter refuses it as the engine tier requires (LIFE-1).

Every KV event (`take_events`) is replayed into a multiset of cache keys as it comes, so
the snapshot can compare what a consumer of the events knows with the real map (BLOCK-8).
"""

from collections import Counter
from functools import lru_cache

from kvspec.spec.block_pool import FULL, NULL_BLOCK, SWA, Block, BlockPoolSnapshot, BlockPoolView, RequestBlocks
from kvspec.spec.lifecycle import EngineOperation, RunningRequest, refusal
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest, OutOfMemory
from kvspec.spec.pages import pages_for
from kvspec.spec.snapshot import EngineConfig, RequestView
from kvspec.spec.window import VLLM_0_33, validate_window_config

from .runtime import vllm

MAX_TOKENS = 1 << 30
"""A request's sampling limit: the engine tier decides when a request finishes."""


class VllmEngine:
    def __init__(self, config: EngineConfig, retention: int | None, report_mode: str | None = None):
        problems = validate_window_config(config.window, config.page_size, config.policy)
        if config.policy.version != VLLM_0_33:
            problems.append(f"vLLM 0.33.0 implements policy {VLLM_0_33!r}, not {config.policy.version!r}")
        for name in ("size_full", "size_swa"):
            if getattr(config, name) < 0 or getattr(config, name) % max(config.page_size, 1):
                problems.append(f"{name} must be a non-negative multiple of the page size (got {getattr(config, name)})")
        if problems:
            raise InvalidConfig("invalid engine configuration: " + "; ".join(problems))
        v = self.v = vllm()
        self.config = config
        self.bs = bs = config.page_size
        self.num_blocks = (config.size_full + config.size_swa) // bs + 1  # + the null block
        layer = {"num_kv_heads": 1, "head_size": 8, "dtype": v.torch.float16}
        groups = [v.KVCacheGroupSpec(["full.0"], v.FullAttentionSpec(bs, **layer)),
                  v.KVCacheGroupSpec(["swa.0"], v.SlidingWindowSpec(bs, **layer, sliding_window=config.window + 1))]
        self.manager = v.KVCacheManager(
            v.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                            prefix_cache_retention_interval=retention),
            max_model_len=config.size_full, scheduler_block_size=bs, hash_block_size=bs,
            enable_caching=True, enable_kv_cache_events=True)
        self.pool = self.manager.block_pool
        managers = self.manager.coordinator.single_type_managers
        self.groups = tuple(SWA if isinstance(m, v.SlidingWindowManager) else FULL for m in managers)
        self.managers = managers
        self.hasher = v.get_request_block_hasher(bs, v.sha256)
        self.sampling = v.SamplingParams(max_tokens=MAX_TOKENS, extra_args=report_mode and {
            "kv_cache_report_mode": report_mode})  # a request option of vLLM's KV events
        self.requests: dict[str, object] = {}
        self.allocation: dict[str, tuple[int, int]] = {}
        """Per request, (tokens computed, slots) of its last allocate_slots call."""
        self.decode_steps: dict[str, int] = {}
        self.finished_prefill: set[str] = set()
        self.retracted: dict[str, object] = {}
        self.replayed: Counter = Counter()
        self.block_views: dict[int, tuple] = {}  # block id -> (ref count, key, Block): block_view
        """(hash, group) -> times stored less times removed, from the KV events."""

    # -- helpers --------------------------------------------------------------------------

    def refuse_misuse(self, operation: EngineOperation, **args) -> None:
        """[LIFE-1] Raise InvalidRequest, before vLLM is called, for a call the lifecycle forbids."""
        running = {rid: RunningRequest(rid in self.finished_prefill, req.num_tokens, req.num_computed_tokens)
                   for rid, req in self.requests.items()}
        if why := refusal(operation, args, running, self.retracted, self.config.size_full):
            raise InvalidRequest(why)

    def out_of_memory(self, needed: int) -> OutOfMemory:
        return OutOfMemory("full", needed, self.pool.get_num_free_blocks())

    def allocate(self, rid: str, req, new_tokens: int, hit: int = 0, hit_blocks=None) -> bool:
        """allocate_slots as the scheduler calls it; records what ran, even when it fails
        (the window release before the capacity check has happened: BLOCK-6)."""
        processed = req.num_computed_tokens + hit
        slots = self.allocation.get(rid, (0, hit))[1]
        blocks = self.manager.allocate_slots(req, new_tokens, num_new_computed_tokens=hit,
                                             new_computed_blocks=hit_blocks)
        if blocks is None:
            if rid in self.requests:
                self.allocation[rid] = (processed, slots)
            return False
        self.allocation[rid] = (processed, processed + new_tokens)
        return True

    def release(self, rid: str):
        req = self.requests.pop(rid)
        self.manager.free(req)
        self.allocation.pop(rid, None)
        self.decode_steps.pop(rid, None)
        self.finished_prefill.discard(rid)
        return req

    # -- the engine tier ------------------------------------------------------------------

    def admit(self, rid: str, prompt: list[int] | None = None) -> OutOfMemory | None:
        v = self.v
        self.refuse_misuse(EngineOperation.ADMIT, rid=rid, prompt=prompt)
        if prompt is None:
            req = self.retracted[rid]
        else:
            req = v.Request(rid, list(prompt), self.sampling.clone(), None, block_hasher=self.hasher)
        hit_blocks, hit, _ = self.manager.get_computed_blocks(req)
        if hit and not self.allocate(rid, req, 0, hit, hit_blocks):
            self.manager.free(req)  # it leaves the waiting queue, as an aborted waiting request
            return self.out_of_memory(pages_for(hit, self.bs))
        self.retracted.pop(rid, None)
        req.status = v.RequestStatus.RUNNING
        req.num_computed_tokens = hit
        self.requests[rid] = req
        self.allocation[rid] = (hit, hit)
        self.decode_steps[rid] = 0
        return None

    def pd_admit(self, rid: str, prompt: list[int], first_output: int):
        raise InvalidRequest("vLLM's KV cache manager has no PD-decode pre-allocation (capability pd_decode)")

    def prefill_chunk(self, rid: str, chunk_len: int, token: int) -> OutOfMemory | None:
        self.refuse_misuse(EngineOperation.PREFILL_CHUNK, rid=rid, chunk=chunk_len)
        req = self.requests[rid]
        n = min(chunk_len, req.num_tokens - req.num_computed_tokens)
        if not self.allocate(rid, req, n):
            return self.out_of_memory(pages_for(n, self.bs))
        req.num_computed_tokens += n  # the forward pass
        if req.num_computed_tokens == req.num_tokens:  # the last chunk samples a token
            req.append_output_token_ids(token)
            self.finished_prefill.add(rid)
        return None

    def decode(self, rid: str, token: int) -> OutOfMemory | None:
        self.refuse_misuse(EngineOperation.DECODE, rid=rid)
        req = self.requests[rid]
        if not self.allocate(rid, req, 1):
            return self.out_of_memory(1)
        req.num_computed_tokens += 1
        req.append_output_token_ids(token)
        self.decode_steps[rid] += 1
        return None

    def finish(self, rid: str, trim: int = 0) -> None:
        self.refuse_misuse(EngineOperation.FINISH, rid=rid, trim=trim)
        self.release(rid)  # vLLM caches at allocation, so a stop changes nothing here

    def abort(self, rid: str) -> None:
        self.refuse_misuse(EngineOperation.ABORT, rid=rid)
        self.release(rid)

    def retract(self, rid: str) -> None:
        self.refuse_misuse(EngineOperation.RETRACT, rid=rid)
        req = self.release(rid)
        req.num_computed_tokens = 0
        req.status = self.v.RequestStatus.PREEMPTED
        self.retracted[rid] = req

    def evict(self, full_tokens: int, swa_tokens: int) -> tuple[int, int]:
        """Drop the keys of up to that many tokens' worth of cached free blocks per group,
        least recently used first (the free queue's order); returns the tokens dropped."""
        self.refuse_misuse(EngineOperation.EVICT, full_tokens=full_tokens, swa_tokens=swa_tokens)
        wanted = {FULL: pages_for(full_tokens, self.bs), SWA: pages_for(swa_tokens, self.bs)}
        chosen = []
        for block in self.pool.free_block_queue.get_all_free_blocks():
            if block.block_hash is not None:
                kind = self.groups[self.v.get_group_id(block.block_hash)]
                if wanted[kind] > 0:
                    wanted[kind] -= 1
                    chosen.append((kind, block.block_id))
        self.pool.evict_blocks({block_id for _, block_id in chosen})
        return tuple(sum(kind == k for kind, _ in chosen) * self.bs for k in (FULL, SWA))

    # -- what it shows --------------------------------------------------------------------

    @staticmethod
    @lru_cache(maxsize=1 << 16)
    def key(block_hash) -> tuple[int, int]:
        """(hash, group) of a block's key. Cached: vLLM's conversion reads an environment
        variable per call, which made it most of a snapshot's time."""
        v = vllm()
        return v.maybe_convert_block_hash(v.get_block_hash(block_hash)), v.get_group_id(block_hash)

    def replay_events(self) -> None:
        v = self.v
        for event in self.manager.take_events():
            if isinstance(event, v.AllBlocksCleared):
                self.replayed.clear()
            elif isinstance(event, (v.BlockStored, v.BlockRemoved)):
                sign = 1 if isinstance(event, v.BlockStored) else -1
                for block_hash in event.block_hashes:
                    self.replayed[(block_hash, event.group_idx)] += sign

    def block_view(self, block) -> Block:
        """A block as the spec shows it. While its ref count and key are the ones it last
        showed, its last Block is shown again: reading the pool is then one comparison per
        block, not a new object."""
        key, last = block.block_hash, self.block_views.get(block.block_id)
        if last is None or last[0] != block.ref_cnt or last[1] is not key:
            last = self.block_views[block.block_id] = (
                block.ref_cnt, key, Block(block.block_id, block.ref_cnt, None if key is None else self.key(key)))
        return last[2]

    def block_pool(self) -> BlockPoolView:
        self.replay_events()
        key, cache_map = self.key, []
        for block_hash, value in self.pool.cached_block_hash_to_block._cache.items():
            for block in (value.values() if isinstance(value, dict) else (value,)):
                cache_map.append((*key(block_hash), block.block_id))
        tables = {}
        for group, manager in enumerate(self.managers):
            for rid, table in manager.req_to_blocks.items():
                tables.setdefault(rid, [()] * len(self.managers))[group] = tuple(
                    NULL_BLOCK if block.is_null else block.block_id for block in table)
        requests = tuple(RequestBlocks(rid, tuple(tables[rid]), *self.allocation.get(rid, (0, 0)))
                         for rid in sorted(tables))
        return BlockPoolView(
            block_size=self.bs, window=self.config.window, groups=self.groups,
            blocks=tuple(map(self.block_view, self.pool.blocks)),
            free_queue=tuple(b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()),
            requests=requests, cache_map=tuple(cache_map),  # in the map's order: the checks read them as sets
            replayed_map=tuple((h, g, count) for (h, g), count in self.replayed.items() if count))

    def request_view(self, rid: str, req, view: BlockPoolView) -> RequestView:
        bs = self.bs
        tables = next((r.tables for r in view.requests if r.rid == rid), ((),) * len(self.groups))
        full = tables[self.groups.index(FULL)]
        swa = tables[self.groups.index(SWA)]
        slots = self.allocation[rid][1]
        row = tuple(full[i // bs] * bs + i % bs for i in range(min(slots, len(full) * bs)))
        released = next((i for i, block in enumerate(swa) if block != NULL_BLOCK), len(swa))
        return RequestView(rid=rid, row=row, cache_protected_len=0, swa_evicted_seqlen=released * bs,
                           kv_allocated_len=slots, kv_committed_len=req.num_computed_tokens, seq_len=req.num_tokens,
                           decode_steps=self.decode_steps[rid], finished_prefill=rid in self.finished_prefill,
                           last_node=None)

    def snapshot(self) -> BlockPoolSnapshot:
        view = self.block_pool()
        requests = tuple(self.request_view(rid, req, view) for rid, req in sorted(self.requests.items()))
        return BlockPoolSnapshot(self.config, requests, view)
