"""vLLM 0.33.0's real v1 KV cache manager behind kvspec's engine tier.

One `KVCacheManager` with the layer groups of the configuration's layout (BLOCK-11; by
default one full-attention and one sliding-window group, `FullAttentionSpec` and
`SlidingWindowSpec`, a group of one layer each; several groups of a kind share one spec,
as vLLM groups a model's layers) over one shared block pool (spec chapter 08): the block
size is the page size, the pool has as many blocks as the configuration's two pools have
pages together, plus the null block, and vLLM's `sliding_window` is the spec's window plus
one (vLLM counts the current token in its window, the spec counts the tokens before it).

The adapter plays vLLM's scheduler in synchronous mode, one request per step (nothing
is ever in flight), as its `schedule()` and `update_from_output()` drive the manager:

| kvspec step   | vLLM                                                                      |
|---------------|---------------------------------------------------------------------------|
| admit         | `Request(...)`, `get_computed_blocks` (the prefix hit), `allocate_slots(req, 0, hit, blocks)` (adopts the hit blocks) |
| prefill_chunk | `allocate_slots(req, n)`, then the "forward": `num_computed_tokens += n`; the last chunk appends the sampled token |
| decode        | `allocate_slots(req, 1)`, `num_computed_tokens += 1`, `append_output_token_ids` |
| pd_admit      | `get_computed_blocks`, `allocate_slots(req, 0, hit, blocks, num_external_computed_tokens=rest, delay_cache_blocks=True)` (a KV connector loads the rest of the prompt), then `cache_blocks(req, len(prompt))` once loaded; the first output appended |
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

With `config.state_slots > 0` a third group, `MambaSpec` in align mode with block size
`state_grid` (spec chapter 09, STATE-10..14; docs/engines/vllm.md §8), shares the pool
(`state_slots` blocks more). The adapter then also plays what the scheduler does around
the manager in that mode: `new_step_starts()` before each step, prefill chunks clipped by
vLLM's own `Scheduler._mamba_block_aligned_split`, the block copies it asks for run and
their endpoints freed; and it plays the model: each block's state is (length,
`state_digest`) of the tokens it has read. The snapshot is a `BlockPoolStateSnapshot`.

What the manager shows, its snapshot, is view.py's.
"""

import types

from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.block_pool_state import running_entry
from kvspec.spec.group_layouts import layout_problems
from kvspec.spec.lifecycle import EngineOperation, RunningRequest, refusal
from kvspec.spec.outcomes import InvalidConfig, InvalidRequest, OutOfMemory
from kvspec.spec.pages import pages_for
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.state import StateValue, advance_state
from kvspec.spec.window import BLOCK_POOL_VERSIONS, VLLM_0_33, VLLM_0_33_DENSE, validate_window_config

from .runtime import vllm
from .view import KVCacheManagerView, cached_blocks, cached_keys

MAX_TOKENS = 1 << 30
"""A request's sampling limit: the engine tier decides when a request finishes."""


class VllmEngine(KVCacheManagerView):
    LAYER: dict = {}
    """What else a release's attention specs require (releases/api_0_10.py)."""

    def __init__(self, config: EngineConfig, retention: int | None, report_mode: str | None = None):
        problems = validate_window_config(config.window, config.page_size, config.policy)
        if config.policy.version not in BLOCK_POOL_VERSIONS:  # its retention is the adapter's (VLLM, VLLM_DENSE)
            problems.append(f"vLLM 0.33.0 implements policy {VLLM_0_33!r} (or {VLLM_0_33_DENSE!r}, with dense "
                            f"prefix-cache retention), not {config.policy.version!r}")
        for name in ("size_full", "size_swa"):
            if getattr(config, name) < 0 or getattr(config, name) % max(config.page_size, 1):
                problems.append(f"{name} must be a non-negative multiple of the page size (got {getattr(config, name)})")
        problems += layout_problems(config.layout)
        if problems:
            raise InvalidConfig("invalid engine configuration: " + "; ".join(problems))
        if config.state_slots and (config.state_grid < 1 or config.state_grid % max(config.page_size, 1)):
            raise InvalidConfig(f"invalid engine configuration: the state grid ({config.state_grid}) must be a "
                                f"multiple of the page size ({config.page_size}): it is the state group's block size")
        v = self.v = vllm()
        self.config = config
        self.bs = bs = config.page_size
        self.num_blocks = (config.size_full + config.size_swa) // bs + 1  # + the null block
        layer = {"num_kv_heads": 1, "head_size": 8, "dtype": v.torch.float16, **self.LAYER}
        specs = {FULL: v.FullAttentionSpec(bs, **layer),
                 SWA: v.SlidingWindowSpec(bs, **layer, sliding_window=config.window + 1)}
        groups = [v.KVCacheGroupSpec([f"{kind}.{g}"], specs[kind]) for g, kind in enumerate(config.layout)]
        self.state_bs = scheduler_bs = bs
        if config.state_slots:  # a recurrent group in align mode (prefix caching), one block per state slot more
            self.state_bs = scheduler_bs = config.state_grid  # the LCM of the groups' block sizes
            self.num_blocks += config.state_slots
            self.state_spec = v.MambaSpec(block_size=config.state_grid, shapes=((1,),), dtypes=(v.torch.float32,),
                                          mamba_cache_mode="align")
            groups.append(v.KVCacheGroupSpec(["mamba.0"], self.state_spec))
            # vLLM's own sizing of a request's states in align mode (MambaSpec.max_memory_usage_bytes)
            self.state_blocks_per_request = (2 + self.state_spec.num_speculative_blocks
                                             + self.state_spec.num_prefill_checkpoint_blocks)
        self.watch(self.build_manager(groups, retention, scheduler_bs))
        self.contents: dict[int, StateValue | None] = {}
        """[STATE-11] Block id -> what the state the model last wrote into it has read."""
        self.last_entry: dict[str, int | None] = {}
        """The entry of its state table each request's state was last written to (the worker reads it)."""
        self.hasher = self.block_hasher()
        self.sampling = v.SamplingParams(max_tokens=MAX_TOKENS, extra_args=report_mode and {
            "kv_cache_report_mode": report_mode})  # a request option of vLLM's KV events
        self.requests: dict[str, object] = {}
        self.allocation: dict[str, tuple[int, int]] = {}
        """Per request, (tokens computed, slots) of its last allocate_slots call."""
        self.decode_steps: dict[str, int] = {}
        self.finished_prefill: set[str] = set()
        self.retracted: dict[str, object] = {}

    def build_manager(self, groups: list, retention: int | None, scheduler_bs: int):
        """vLLM's KVCacheManager over `groups`, as its engine builds it (a release's shim
        builds it the way that release does: releases/api_*.py)."""
        return self.v.KVCacheManager(self.cache_config(groups, retention), max_model_len=self.config.size_full,
                                     enable_caching=True, enable_kv_cache_events=True,
                                     **self.block_sizes(scheduler_bs))

    def cache_config(self, groups: list, retention: int | None):
        return self.v.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                                    prefix_cache_retention_interval=retention)

    def block_sizes(self, scheduler_bs: int) -> dict[str, int]:
        """The block sizes the manager takes besides its groups': the scheduler's (their least
        common multiple) and the block hashes' (the page size)."""
        return {"scheduler_block_size": scheduler_bs, "hash_block_size": self.bs}

    def block_hasher(self):
        """The block hasher the engine gives each request (vLLM's `sha256` over the page size)."""
        return self.v.get_request_block_hasher(self.bs, self.v.sha256)

    def new_request(self, rid: str, prompt: list[int]):
        """vLLM's `Request` for a prompt, with the block hasher the engine gives it."""
        return self.v.Request(rid, list(prompt), self.sampling.clone(), None, block_hasher=self.hasher)

    def prefix_hit(self, req) -> tuple[object, int]:
        """`get_computed_blocks`: the hit's blocks and its tokens. The scheduler keeps the
        junction where a group cached more than the hit: sparse retention caches the window's
        tail there too (Scheduler.schedule, shared_prefix_boundary, from 0.26.0)."""
        hit_blocks, hit, req.shared_prefix_boundary = self.manager.get_computed_blocks(req)
        return hit_blocks, hit

    def adopt_hit(self, rid: str, req, hit: int, hit_blocks) -> bool:
        """[LIFE-3] Take the prefix hit's blocks at admission: an allocation of no new slot
        that adopts them (from 0.31.0; before, vLLM refuses one: releases/api_0_29.py)."""
        return self.allocate(rid, req, 0, hit, hit_blocks)

    # -- helpers --------------------------------------------------------------------------

    def refuse_misuse(self, operation: EngineOperation, **args) -> None:
        """[LIFE-1] Raise InvalidRequest, before vLLM is called, for a call the lifecycle forbids."""
        running = {rid: RunningRequest(rid in self.finished_prefill, req.num_tokens, req.num_computed_tokens,
                                       req.num_computed_tokens)
                   for rid, req in self.requests.items()}
        if why := refusal(operation, args, running, self.retracted, self.config.size_full):
            raise InvalidRequest(why)

    def out_of_memory(self, needed: int) -> OutOfMemory:
        return OutOfMemory("full", needed, self.pool.get_num_free_blocks())

    def allocate(self, rid: str, req, new_tokens: int, hit: int = 0, hit_blocks=None, external: int = 0) -> bool:
        """allocate_slots as the scheduler calls it, with `external` tokens a KV connector
        loads (asynchronously: their blocks are cached once the load has finished); records
        what ran, even when it fails (the window release before the capacity check has
        happened: BLOCK-6)."""
        processed = req.num_computed_tokens + hit + external
        slots = self.allocation.get(rid, (0, hit))[1]
        if self.state_manager is not None:
            self.manager.new_step_starts()  # as the scheduler's schedule() starts
        connector = {"num_external_computed_tokens": external, "delay_cache_blocks": True} if external else {}
        blocks = self.manager.allocate_slots(req, new_tokens, num_new_computed_tokens=hit,
                                             new_computed_blocks=hit_blocks, **connector)
        if self.state_manager is not None:
            self.run_copies()
        if blocks is None:
            if rid in self.requests:
                self.allocation[rid] = (processed, slots)
            return False
        self.allocation[rid] = (processed, processed + new_tokens)
        return True

    def aligned_chunk(self, req, n: int) -> int:
        """[STATE-11] The chunk vLLM's scheduler schedules in align mode: its own
        `Scheduler._mamba_block_aligned_split` clips a prefill chunk to end on a state
        block boundary (a state is written at chunk ends), or at the prompt's last
        cacheable position. The chunk asked for is the step's token budget
        (`max_num_scheduled_tokens`): a budget below the block size lets a chunk advance
        within a block, and the next one stops at its boundary. It is called on a
        stand-in of the scheduler with the attributes it reads, as an engine without a
        connector, Eagle or prefill checkpoint blocks has them."""
        v, coordinator = self.v, self.manager.coordinator
        partial = self.bs < self.state_bs and coordinator.enable_partial_hash_hits
        scheduler = types.SimpleNamespace(
            cache_config=types.SimpleNamespace(block_size=self.state_bs), block_size=self.state_bs, hash_block_size=self.bs,
            mamba_partial_cache_hit=partial, use_eagle_block_drop=False, num_hash_lookahead_tokens=0,
            mamba_has_prefill_checkpoint_blocks=False, mamba_prefill_checkpoint_alignment=None,
            max_num_scheduled_tokens=n, scheduler_config=types.SimpleNamespace(long_prefill_token_threshold=0),
            mamba_shared_prefix_checkpoint=False)
        return v.Scheduler._mamba_block_aligned_split(scheduler, req, n)

    def run_copies(self) -> None:
        """[STATE-11] What the scheduler does at the end of its schedule(): it takes the
        block copies the manager asks for (copy-on-write of a sub-block hit), the worker
        runs them before the forward, and their retained endpoints are freed (at once, in
        synchronous mode). The model copies the states the same way."""
        copies, retained = self.manager.take_kv_cache_block_copies()
        for copy in copies:
            self.contents[copy.dst_block_id] = self.contents.get(copy.src_block_id)
        if copies:
            self.pool.free_blocks(retained)
        self.manager.take_boundary_state_offloads()  # for a KV connector: there is none

    def forward(self, rid: str, req, before: int) -> None:
        """[STATE-11] The model's forward over tokens [before, num_computed_tokens) of the
        state group: as vLLM's worker in align mode, read the state from the entry the
        request last wrote (none: the empty state) and write the advanced state into the
        entry of its last token. A null entry there reads as an unknown state."""
        if self.state_manager is None:
            return
        after, table = req.num_computed_tokens, self.state_manager.req_to_blocks[rid]
        last = self.last_entry.get(rid)
        if last is None:
            source = StateValue(0, 0, 0) if before == 0 else None
        else:
            block = table[last] if last < len(table) else None
            source = None if block is None or block.is_null else self.contents.get(block.block_id)
        entry = running_entry(after, self.state_bs)
        target = table[entry]
        if source is not None:
            digest = source.digest
            for token in req.all_token_ids[before:after]:
                digest = advance_state(digest, token)
            source = StateValue(target.block_id, source.length + after - before, digest)
        if not target.is_null:
            self.contents[target.block_id] = source
        self.last_entry[rid] = entry

    def release(self, rid: str):
        req = self.requests.pop(rid)
        self.manager.free(req)
        self.last_entry.pop(rid, None)
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
            req = self.new_request(rid, prompt)
        hit_blocks, hit = self.prefix_hit(req)
        if hit and not self.adopt_hit(rid, req, hit, hit_blocks):
            self.manager.free(req)  # it leaves the waiting queue, as an aborted waiting request
            return self.out_of_memory(pages_for(hit, self.bs))
        self.retracted.pop(rid, None)
        req.status = v.RequestStatus.RUNNING
        req.num_computed_tokens = hit
        self.requests[rid] = req
        self.allocation.setdefault(rid, (hit, hit))  # what adopt_hit allocated, else nothing yet
        self.last_entry[rid] = running_entry(hit, self.state_bs) if hit else None
        self.decode_steps[rid] = 0
        return None

    def pd_admit(self, rid: str, prompt: list[int], first_output: int) -> OutOfMemory | None:
        """[LIFE-6] PD decode, as vLLM's scheduler admits a request whose prompt's KV a KV
        connector loads asynchronously (from 0.18.0, whose scheduler does it for every group):
        `get_computed_blocks` (the local hit), `allocate_slots(req, 0, hit, blocks,
        num_external_computed_tokens=<the rest of the prompt>, delay_cache_blocks=True)` (the
        window released before the hit's end first: the sliding-window group gets blocks from
        the window on only), `num_computed_tokens` = the prompt, and once the load has finished
        `cache_blocks(req, len(prompt))` (`Scheduler._update_waiting_for_remote_kv`); the
        prefill server's state arrives in the state group's running block. The request then
        holds the first output the prefill server sampled, so nothing is recomputed (vLLM's
        decode side, given the prompt alone, recomputes its last token instead)."""
        self.refuse_misuse(EngineOperation.PD_ADMIT, rid=rid, prompt=prompt)
        req = self.new_request(rid, prompt)
        hit_blocks, hit = self.prefix_hit(req)
        if not self.allocate(rid, req, 0, hit, hit_blocks, external=len(prompt) - hit):
            self.manager.free(req)  # it leaves the waiting queue, as an aborted waiting request
            return self.out_of_memory(pages_for(len(prompt), self.bs))
        req.status = self.v.RequestStatus.RUNNING
        req.num_computed_tokens = len(prompt)
        self.manager.cache_blocks(req, len(prompt))  # the load has finished
        self.requests[rid] = req
        self.decode_steps[rid] = 0
        self.last_entry[rid] = None
        self.forward(rid, req, 0)  # the prefill server's state of the whole prompt
        req.append_output_token_ids(first_output)
        self.finished_prefill.add(rid)
        return None

    def prefill_chunk(self, rid: str, chunk_len: int, token: int) -> OutOfMemory | None:
        self.refuse_misuse(EngineOperation.PREFILL_CHUNK, rid=rid, chunk=chunk_len)
        req = self.requests[rid]
        n = min(chunk_len, req.num_tokens - req.num_computed_tokens)
        if self.state_manager is not None:
            n = self.aligned_chunk(req, n)
        if not self.allocate(rid, req, n):
            return self.out_of_memory(pages_for(n, self.bs))
        req.num_computed_tokens += n  # the forward pass
        self.forward(rid, req, req.num_computed_tokens - n)
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
        self.forward(rid, req, req.num_computed_tokens - 1)
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
        for block in self.cached_free_blocks():
            if block.block_hash is not None and self.v.get_group_id(block.block_hash) != self.state_group:
                kind = self.groups[self.v.get_group_id(block.block_hash)]
                if wanted[kind] > 0:
                    wanted[kind] -= 1
                    chosen.append((kind, block.block_id))
        self.drop_keys({block_id for _, block_id in chosen})
        self.evicted.update(block_id for _, block_id in chosen)  # the next partial view shows them
        return tuple(sum(kind == k for kind, _ in chosen) * self.bs for k in (FULL, SWA))

    def drop_keys(self, block_ids: set[int]) -> None:
        """vLLM's eviction of cached blocks by id (`BlockPool.evict_blocks`, from 0.13.0)."""
        self.pool.evict_blocks(block_ids)

    def last_free_block(self):
        """The free queue's last block (the one before its tail sentinel), None when none is free."""
        return self.pool.free_block_queue.fake_free_list_tail.prev_free_block

    def cached_free_blocks(self) -> list:
        """The free blocks the prefix cache maps, in the free queue's order (least recently
        used first). The queue is as long as the pool and its head holds the blocks never
        used, so it is walked back from its tail until every such block is met: the walk
        ends at the oldest of them, and an evict costs what the cache holds, not the pool."""
        cached = self.pool.cached_block_hash_to_block
        missing = {block.block_id for key in cached_keys(cached) for block in cached_blocks(cached, key)
                   if block.ref_cnt == 0}
        found, block = [], self.last_free_block()
        while missing and block is not None and block.block_id >= 0:  # the fake head's id is -1
            if block.block_id in missing:
                missing.discard(block.block_id)
                found.append(block)
            block = block.prev_free_block
        return found[::-1]
