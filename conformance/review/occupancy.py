"""The occupancy of a run: how full the full and SWA pools (or the one shared block pool)
are after each step, and who holds their pages (blocks). occupancy_plot.py draws it.

The occupancy of an engine snapshot splits each pool's pages by holder, with the spec's
own definitions of who holds what (spec.invariants, the I2/I3 conservation):

  * request-private: what the requests hold, positions [cache_protected_len,
    kv_allocated_len) in the full pool and [max(swa_evicted_seqlen, cache_protected_len),
    kv_allocated_len) in the SWA pool;
  * tree-protected and tree-evictable: what the prefix tree's nodes hold, by the node's
    lock ref for that pool (full_lock_ref, swa_lock_ref) > 0 or == 0; an SWA tombstone
    holds no SWA;
  * free, and the rest: pages neither free nor held by anyone the snapshot shows
    ("unaccounted": waiting in a free group, or leaked), or, when the adapter does not
    show some holder (no `tree` observable, say), "held (not attributed)": never guessed.

At the allocator tier the caller (the driver) holds sequences, so a pool is free, held
by the caller, or unaccounted.

Two measures of the window bound of WIN-5, which I9 checks, go with the SWA pool, in
pages (see `window_span` and `window_bound`): what the running requests keep from where
their live SWA starts, and the most the spec lets them keep.

An engine with one shared block pool (spec chapter 08: its snapshots have a
`block_pool`) has no two pools, tree or mapping; its occupancy splits the pool's real
blocks (the null block is not counted) by holder too, from the BlockPoolView alone:

  * held by full-attention tables, held by sliding-window tables: a block whose ref
    count is above 0 and which tables of that kind of group hold;
  * cached and free (evictable, a prefix hit can still take it back: vLLM evicts
    lazily), and free: a block in the free queue, ref count 0, no table holding it,
    with a block hash or without;
  * unaccounted: anything else, which breaks BLOCK-1 or BLOCK-2 (a ref count with no
    table behind it, a leak; a block neither free nor counted; tables of both kinds).

With it, in blocks, the window measures of BLOCK-6: the real blocks of the requests'
sliding-window tables and `swa_block_bound(window, slots - processed)` (the most a
table may hold after its last allocation), each summed over the requests. The sum
counts a block that two requests share (a prefix hit) once per request, as the bound
does; the categories count it once.

An engine with recurrent layers (spec chapter 09: its snapshots have a `state`) has a
third pool, its state pool by holder: the requests' working (and tracking) states,
the checkpoints of the prefix tree, locked or evictable by their state lock ref,
unaccounted (a slot neither free nor held: STATE-1), and free.

A timeline replays a trace through its tier's driver and records the occupancy after
each step. It goes on past a step that breaks an invariant, recording the clauses, and
stops at a crash or a step the implementation cannot apply.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass

from kvspec.spec.accounting import HeldSequence, held_full_pages, held_swa_pages
from kvspec.spec.block_pool import FULL, NULL_BLOCK, SWA, Block, BlockPoolSnapshot, BlockPoolView, swa_block_bound
from kvspec.spec.invariants.holders import node_holding, non_root_nodes, request_holding
from kvspec.spec.models import BLOCK_POOL, TWO_POOL
from kvspec.spec.pages import ceil_page
from kvspec.spec.snapshot import EngineConfig, EngineSnapshot, RequestView
from kvspec.spec.state import HybridStateSnapshot, StatePoolView
from kvspec.spec.window import decode_window_bound, eviction_span_bound, retention

from ..harness.allocator_driver import AllocatorDriver
from ..harness.checks import InvariantViolation, StepFailure
from ..harness.protocol import Adapter
from ..harness.replay import build_driver
from ..harness.trace import Trace

PRIVATE, PROTECTED, EVICTABLE = "request-private", "tree-protected", "tree-evictable"
CALLER = "held by the caller"
NOT_ATTRIBUTED, UNACCOUNTED, FREE = "held (not attributed)", "unaccounted (free group or leak)", "free"
FULL_TABLES, SWA_TABLES = "held by full-attention tables", "held by sliding-window tables"
BLOCKS_UNACCOUNTED, CACHED_FREE = "unaccounted (BLOCK-1, BLOCK-2)", "cached and free (evictable)"
"""The categories of a shared block pool's blocks (FREE too)."""
WORKING, CHECKPOINT_LOCKED, CHECKPOINT_EVICTABLE = "working states", "checkpoints, locked", "checkpoints, evictable"
STATE_UNACCOUNTED = "unaccounted (STATE-1)"
"""The categories of a state pool's slots (FREE too)."""


# -- the occupancy of one state -------------------------------------------------------------

@dataclass(frozen=True)
class Occupancy:
    """Pages per category (above) of each pool, "full" and "swa", or blocks of the
    one shared pool, "blocks"; they add up to the pool's pages unless a page is held
    twice (I4), and always to its real blocks."""

    pools: dict[str, dict[str, int]]
    window_span: int | None = None
    """What the requests keep of the window, summed over them: SWA pages, `window_span`
    (None: rows not shown); in a block pool, the real blocks of their SWA tables."""
    window_bound: int | None = None
    """The most they may keep, summed likewise: SWA pages, `window_bound` (None: a request
    has none); in a block pool, blocks, `swa_block_bound` (BLOCK-6)."""

    @property
    def full(self) -> dict[str, int]:
        return self.pools["full"]

    @property
    def swa(self) -> dict[str, int]:
        return self.pools["swa"]

    @property
    def blocks(self) -> dict[str, int]:
        return self.pools["blocks"]


def pool_pages(num_pages: int, free: int, holdings: dict[str, tuple[list[HeldSequence], frozenset[str]]],
               count: Callable[[list[HeldSequence]], int], observables: Collection[str]) -> dict[str, int]:
    """One pool's pages per category: each holder category whose observables the adapter
    shows (`count` of its sequences), then the rest, then free."""
    pages = {category: count(sequences) for category, (sequences, needs) in holdings.items() if needs <= set(observables)}
    everyone_shown = len(pages) == len(holdings)
    pages[UNACCOUNTED if everyone_shown else NOT_ATTRIBUTED] = max(0, num_pages - free - sum(pages.values()))
    pages[FREE] = free
    return pages


def window_span(request: RequestView, page_size: int) -> int:
    """SWA slots the request keeps from where its live SWA starts up to ceil_page(L), as
    WIN-5 and I9 measure them: from its cursor e while it has not decoded (WIN-5's span
    after a checkpoint, where the tree holds [e, cache_protected_len) for it), from
    max(e, cache_protected_len) once it decodes (what I9 bounds then: its private SWA)."""
    start = request.swa_evicted_seqlen if request.decode_steps == 0 else request.swa_live_from
    return max(0, ceil_page(request.kv_allocated_len, page_size) - start)


def window_bound(request: RequestView, config: EngineConfig) -> int | None:
    """The most SWA slots `window_span` may be, by WIN-5 as I9 checks it: before the
    first decode step, with prefix sharing, eviction_span_bound(retention), the span a
    checkpoint leaves (a PD admission, whose SWA tail WIN-6 starts at or below
    fill_len - 1 - max(W, P), is measured against it too, though I9 checks it only once it
    decodes); once it decodes, decode_window_bound, one page more before the third
    decode step, as I9 allows. None where I9 bounds nothing: a prefill without prefix
    sharing (it evicts before the chunk's allocation) and its first decode step."""
    policy, page_size = config.policy, config.page_size
    if request.decode_steps == 0:
        if not policy.supports_prefix_sharing:
            return None
        return eviction_span_bound(retention(policy.version, config.window, page_size), page_size)
    if request.decode_steps < 2 and not policy.supports_prefix_sharing:
        return None
    bound = decode_window_bound(policy.version, config.window, page_size, policy.decode_eviction_interval)
    return bound + (page_size if request.decode_steps < 3 else 0)


def engine_occupancy(snapshot: EngineSnapshot, observables: Collection[str] = TWO_POOL.observables) -> Occupancy:
    """The occupancy of an engine snapshot (module docstring), from what the adapter shows:
    its block pool's, if it has one."""
    if isinstance(snapshot, BlockPoolSnapshot):
        return block_pool_occupancy(snapshot.block_pool)
    allocator, page_size = snapshot.allocator, snapshot.config.page_size
    requests = [request_holding(r) for r in snapshot.requests]
    nodes = non_root_nodes(snapshot)

    def by_lock(lock_ref) -> dict[str, tuple[list[HeldSequence], frozenset[str]]]:
        return {PRIVATE: (requests, frozenset({"rows"})),
                PROTECTED: ([node_holding(n) for n in nodes if lock_ref(n) > 0], frozenset({"tree"})),
                EVICTABLE: ([node_holding(n) for n in nodes if lock_ref(n) <= 0], frozenset({"tree"}))}

    def with_mapping(holdings):  # SWA pages are found through the mapping (as I3 counts them)
        return {category: (sequences, needs | {"mapping"}) for category, (sequences, needs) in holdings.items()}

    full = pool_pages(allocator.full.num_pages, allocator.full.free_count, by_lock(lambda n: n.full_lock_ref),
                      lambda sequences: len(held_full_pages(sequences, page_size)), observables)
    swa = pool_pages(allocator.swa.num_pages, allocator.swa.free_count,
                     with_mapping(by_lock(lambda n: n.swa_lock_ref)),
                     lambda sequences: len(held_swa_pages(sequences, allocator.mapping, page_size)), observables)
    pools = {"full": full, "swa": swa}
    if isinstance(snapshot, HybridStateSnapshot):
        pools["state"] = state_slots(snapshot.state)
    if "rows" not in observables:
        return Occupancy(pools)
    bounds = [window_bound(r, snapshot.config) for r in snapshot.requests]
    return Occupancy(pools, sum(window_span(r, page_size) // page_size for r in snapshot.requests),
                     None if None in bounds else sum(bound // page_size for bound in bounds))


def state_slots(view: StatePoolView) -> dict[str, int]:
    """A state pool's slots by holder (module docstring)."""
    locks = dict(view.locks)
    slots = {WORKING: sum(len(r.values) for r in view.requests),
             CHECKPOINT_LOCKED: sum(1 for node_id, _ in view.checkpoints if locks.get(node_id, 0) > 0)}
    slots[CHECKPOINT_EVICTABLE] = len(view.checkpoints) - slots[CHECKPOINT_LOCKED]
    slots[STATE_UNACCOUNTED] = max(0, view.num_slots - len(view.free_slots) - sum(slots.values()))
    slots[FREE] = len(view.free_slots)
    return slots


def block_category(block: Block, kinds: set[str | None], free: bool) -> str:
    """Who holds a real block (module docstring): `kinds`, the kinds of group whose
    tables hold it (None: a table beyond the groups); `free`, whether it is in the free
    queue."""
    if block.ref_cnt > 0 and kinds in ({FULL}, {SWA}):
        return FULL_TABLES if kinds == {FULL} else SWA_TABLES
    if block.ref_cnt == 0 and not kinds and free:
        return FREE if block.block_hash is None else CACHED_FREE
    return BLOCKS_UNACCOUNTED


def block_pool_occupancy(view: BlockPoolView) -> Occupancy:
    """The occupancy of one shared block pool: its real blocks by `block_category`, and
    the window lines of BLOCK-6 (module docstring)."""
    kinds: dict[int, set[str | None]] = {}
    swa_held = swa_bound = 0
    for request in view.requests:
        for group, table in enumerate(request.tables):
            kind = view.groups[group] if group < len(view.groups) else None  # more tables than groups: BLOCK-4
            for block in table:
                if block != NULL_BLOCK:
                    kinds.setdefault(block, set()).add(kind)
            if kind == SWA:
                swa_held += sum(block != NULL_BLOCK for block in table)
                swa_bound += swa_block_bound(view.window, max(0, request.slots - request.processed), view.block_size)
    free = set(view.free_queue)
    blocks = dict.fromkeys((FULL_TABLES, SWA_TABLES, BLOCKS_UNACCOUNTED, CACHED_FREE, FREE), 0)
    for block in (block for block in view.blocks if block.block_id != NULL_BLOCK):  # the real ones
        blocks[block_category(block, kinds.get(block.block_id, set()), block.block_id in free)] += 1
    return Occupancy({"blocks": blocks}, swa_held, swa_bound)


def allocator_occupancy(driver: AllocatorDriver) -> Occupancy:
    """The occupancy of an allocator as its caller, the driver, sees it."""
    held = [sequence.held() for sequence in driver.sequences]
    state, (free_full, free_swa) = driver.state(), driver.free_page_counts()
    full = pool_pages(state.full.num_pages, free_full, {CALLER: (held, frozenset())},
                      lambda sequences: len(held_full_pages(sequences, driver.P)), driver.observables)
    swa = pool_pages(state.swa.num_pages, free_swa, {CALLER: (held, frozenset({"mapping"}))},
                     lambda sequences: len(held_swa_pages(sequences, state.mapping, driver.P)), driver.observables)
    return Occupancy({"full": full, "swa": swa})


# -- a timeline of a trace --------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    step: int
    """The step's index in the trace."""
    operation: str
    occupancy: Occupancy
    violated: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stop:
    """Why a timeline ends before its trace: a crash, or a step the implementation
    cannot apply (it went another way earlier)."""

    step: int
    kind: str
    """The failure's kind: crashed, diverged, violated (the fresh implementation)."""
    message: str


@dataclass(frozen=True)
class Timeline:
    title: str
    pool_pages: dict[str, int]
    """Pages of each pool, "full" and "swa", or real blocks of the one shared pool, "blocks"."""
    points: tuple[Point, ...] = ()
    stop: Stop | None = None


def title(trace: Trace, adapter: Adapter, label: str) -> str:
    config = trace.config
    if trace.tier == "allocator":
        return f"{adapter.name}: {label} (allocator, P={config['page_size']})"
    policy = config["policy"]
    return (f"{adapter.name}: {label} (P={config['page_size']}, W={config['window']}, "
            f"I={policy['decode_eviction_interval']}, {policy['version']})")


def pool_sizes(trace: Trace, adapter: Adapter, driver=None) -> dict[str, int]:
    """Pages of each pool the configuration sizes; for an engine with one shared block
    pool, its real blocks as the fresh engine's snapshot shows them (without one, an
    engine that broke before its first step, the configuration's pages together)."""
    config = trace.config
    full, swa = config["size_full"] // config["page_size"], config["size_swa"] // config["page_size"]
    if trace.tier == "allocator":
        return {"full": full, "swa": swa}
    if config.get("state_slots"):
        return {"full": full, "swa": swa, "state": config["state_slots"]}
    if driver is None:  # the model of the adapter's engines of the trace's version
        model = (adapter.for_version(config["policy"]["version"]) or adapter).model
        return {"blocks": full + swa} if model is BLOCK_POOL else {"full": full, "swa": swa}
    if isinstance(driver.previous, BlockPoolSnapshot):
        return {"blocks": len(driver.previous.block_pool.blocks) - 1}  # less the null block
    return {"full": full, "swa": swa}


def timeline(trace: Trace, adapter: Adapter, label: str = "") -> Timeline:
    """Replay `trace` on `adapter`, recording the occupancy after each step (module docstring)."""
    heading = title(trace, adapter, label or trace.label or "trace")
    try:
        driver = build_driver(trace, adapter)
    except StepFailure as failure:  # the fresh implementation already breaks an invariant
        return Timeline(heading, pool_sizes(trace, adapter), (), Stop(0, failure.kind, f"before the first step: {failure}"))
    pools = pool_sizes(trace, adapter, driver)
    points = []
    for index, step in enumerate(trace.steps):
        violated = ()
        try:
            try:
                driver.apply(step)
            except InvariantViolation as failure:
                violated = failure.clauses or (failure.kind,)
            occupancy = (allocator_occupancy(driver) if isinstance(driver, AllocatorDriver)
                         else engine_occupancy(driver.snapshot(), driver.observables))
        except StepFailure as failure:  # a crash, or a step this implementation cannot take
            return Timeline(heading, pools, tuple(points), Stop(index, failure.kind, f"at step {index}: {failure}"))
        points.append(Point(index, step.op, occupancy, violated))
    return Timeline(heading, pools, tuple(points))
