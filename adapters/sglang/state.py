"""SGLang's recurrent-state (Mamba) cache behind kvspec's chapter 09: `HybridReqToTokenPool`
with a real `MambaPool` and `MambaSlotAllocator` on CPU, the unified radix cache's
`MambaComponent`, and the adapter playing the model.

SGLang 0.5.23 without the Mamba "extra buffer" (the ping-pong tracking slots) keeps one
state slot per running request (`req.kv.mamba_pool_idx`) and at most one checkpoint per
tree node (the MAMBA component's `value`, a one-slot tensor). The tiny state shapes
below make each slot a few float32 numbers; the adapter uses two of them, the temporal
state's `[layer 0, slot, 0, 0, 0]` and `[..., 1]`, for the spec's stand-in content
(tokens read, `state_digest` of them: STATE-4). Digests are below 2**23 and lengths
below the full pool, so float32 holds both exactly.

What SGLang's model forward would do to the pool, and only that, the adapter does
itself after each allocation path (`StateModel`): run the deferred copy-on-write and
clear that the match and the slot allocation staged on the request, then read the
computed tokens into the request's slot. Every copy SGLang makes (the COW at a hit, the
fork of a checkpoint in `prepare_for_caching_req`) goes through SGLang's own
`MambaPool.copy_from`, so a slot that holds the wrong state shows in the snapshot.
"""

from kvspec.spec.outcomes import InvalidConfig
from kvspec.spec.state import RequestState, StatePoolView, StateValue, advance_state

from .runtime import sglang

LENGTH, DIGEST = 0, 1
"""Where a slot keeps the stand-in state: temporal[0, slot, 0, 0, LENGTH | DIGEST]."""


def state_problems(config) -> list[str]:
    """Why SGLang 0.5.23 cannot build this configuration's state pool the way the
    adapter builds it (no extra buffer), if it cannot."""
    problems = []
    if config.page_size != 1:
        problems.append(f"SGLang's MambaComponent requires page_size 1 without the Mamba extra buffer "
                        f"(unified_cache/components/mamba.py:75-80; got {config.page_size}); the extra "
                        f"buffer's tracking slots are not driven by this adapter")
    if config.state_grid != 1:
        problems.append(f"without the extra buffer SGLang checkpoints the state at every insert's end "
                        f"(mamba.py:613-614, cache_len = token_ids_len): its checkpoint grid is 1, not "
                        f"{config.state_grid}")
    return problems


def build_state_pool(config, max_context_len: int):
    """The request-to-token pool of a hybrid model: `HybridReqToTokenPool` with a real
    `MambaPool` of `state_slots` slots (slot 0 padding) of one Mamba layer, the
    smallest state SGLang's Mamba2 shapes allow. No extra buffer, no overlap schedule
    (it only sizes the extra buffer's tracking slots)."""
    problems = state_problems(config)
    if problems:
        raise InvalidConfig("invalid engine configuration: " + "; ".join(problems))
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    torch = sglang().torch
    shape = Mamba2StateShape(conv=[(1, 1)], temporal=(1, 1, 2), intermediate_size=1, conv_dim=1,
                             ssm_state_size=2, num_heads=1, head_dim=1, state_size=2, conv_kernel=2)
    params = Mamba2CacheParams(shape=shape, layers=[0],
                               dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    return HybridReqToTokenPool(size=config.max_requests, mamba_size=config.state_slots,
                                mamba_spec_state_size=config.max_requests, max_context_len=max_context_len,
                                device="cpu", enable_memory_saver=False, cache_params=params,
                                mamba_layer_ids=[0], enable_mamba_extra_buffer=False,
                                enable_overlap_schedule=False)


class StateModel:
    """The adapter as the model's recurrent layers: what a forward does to the state pool."""

    def __init__(self, pool):
        self.pool = pool
        self.temporal = pool.mamba_pool.mamba_cache.temporal

    def read(self, slot: int) -> tuple[int, int]:
        length, digest = self.temporal[0, slot, 0, 0, :2].tolist()
        return int(length), int(digest)

    def value(self, slot: int) -> StateValue:
        return StateValue(slot, *self.read(slot))

    def before_forward(self, batch) -> None:
        """The deferred copy-on-write and clear of an extend forward, as SGLang runs them.
        `ScheduleBatch._collect_deferred_mamba_cow_and_clear` (schedule_batch.py:3240-3260,
        SGLang's own, called on the adapter's real ScheduleBatch) takes them off the
        requests; executing them is `ModelRunner._maybe_execute_deferred_mamba_cow_and_clear`
        (model_executor/model_runner.py:1915-1961), whose module does not import here (it
        needs uvicorn), so its lines for a static pool without int8 checkpoints are done
        here as it does them: clear_slots, then copy_mamba_state, both on translated ids."""
        if not any(req.kv.holds_mamba for req in batch.reqs):  # schedule_batch.py:3125
            return
        batch._collect_deferred_mamba_cow_and_clear(batch.reqs)
        pool = self.pool
        if batch.mamba_clear_indices is not None and len(batch.mamba_clear_indices) > 0:
            pool.mamba_pool.clear_slots(pool.translate_mamba_indices(batch.mamba_clear_indices))
        if batch.mamba_cow_src_indices is not None and len(batch.mamba_cow_src_indices) > 0:
            pool.copy_mamba_state(pool.translate_mamba_indices(batch.mamba_cow_src_indices),
                                  pool.translate_mamba_indices(batch.mamba_cow_dst_indices))
        batch.mamba_clear_indices = batch.mamba_cow_src_indices = batch.mamba_cow_dst_indices = None

    def forward(self, req, tokens) -> None:
        """[STATE-4] The recurrent layer reads `tokens` into the request's own slot."""
        slot = int(req.kv.mamba_pool_idx)
        length, digest = self.read(slot)
        for token in tokens:
            digest = advance_state(digest, token)
        self.temporal[0, slot, 0, 0, LENGTH] = length + len(tokens)
        self.temporal[0, slot, 0, 0, DIGEST] = digest

    def working_value(self, req) -> StateValue:
        """The request's working state. Before its first forward a state staged by the
        match or the slot allocation is not in its slot yet (SGLang defers the copy and
        the clear to the forward stream): it holds what that forward's first act will
        write there, the COW source's state (req.kv.mamba_cow_src_index) or the empty one."""
        slot = int(req.kv.mamba_pool_idx)
        if req.kv.mamba_cow_src_index is not None:
            return StateValue(slot, *self.read(int(req.kv.mamba_cow_src_index)))
        if req.kv.mamba_needs_clear:
            return StateValue(slot, 0, 0)
        return self.value(slot)


UNKNOWN_NODE = -1
"""The node id the Rust core's checkpoints show: it keeps its nodes in native memory and
offers no walk of them (tree_view.py), only the slots of every checkpoint
(`all_mamba_values_flatten`). The checks that read a checkpoint's node (STATE-3, 5, 6, 8)
read the tree, which the Rust adapter does not show: they are skipped for it, never
passed; the pool's conservation, ownership and release checks need the slots only."""


def checkpoints(cache, component_type) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(node id, slot) of every node whose MAMBA component holds a device value, and
    (node id, mamba lock ref) of every node whose lock ref is not 0, read off SGLang's
    Python tree core; on the Rust core, the slots only (UNKNOWN_NODE, no locks)."""
    if type(cache.tree_core).__module__.endswith("rust_tree_core.adapter"):
        return [(UNKNOWN_NODE, int(slot)) for slot in cache.all_mamba_values_flatten().view(-1).tolist()], []
    mamba = component_type.MAMBA
    held, locks = [], []
    stack = [cache.tree_core.root_node]
    while stack:
        node = stack.pop()
        data = node.component(mamba)
        if data.value is not None:
            held.extend((node.id, int(slot)) for slot in data.value.view(-1).tolist())
        if data.lock_ref:
            locks.append((node.id, data.lock_ref))
        stack.extend(node.children.values())
    return sorted(held), sorted(locks)


def state_view(engine) -> StatePoolView:
    """[OBS-1] The state pool as SGLang keeps it: the allocator's free list, each running
    request's slot (`req.kv.mamba_pool_idx`), each node's checkpoint and lock ref, and
    the tree's own MAMBA ledgers (`mamba_evictable_size`, `mamba_protected_size`)."""
    pool, model, cache = engine.req_to_token_pool, engine.state_model, engine.cache
    requests = tuple(
        RequestState(rid, tuple(req.origin_input_ids) + tuple(req.output_ids), (model.working_value(req),))
        for rid, req in engine.requests.items() if req.kv.holds_mamba)
    held, locks = checkpoints(cache, engine.s.ComponentType)
    return StatePoolView(pool.mamba_pool.size, engine.config.state_grid,
                         tuple(pool.mamba_allocator.free_slots.tolist()), requests,
                         tuple((node_id, model.value(slot)) for node_id, slot in held), tuple(locks),
                         cache.mamba_evictable_size(), cache.mamba_protected_size())
