"""Pictures of a run: how full the full and SWA pools are after each step, and who holds
their pages.

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

On the SWA panel two lines measure the window bound of WIN-5, which I9 checks, in pages
(see `window_span` and `window_bound`): what the running requests keep from where their
live SWA starts, and the most the spec lets them keep.

A timeline replays a trace through its tier's driver and records the occupancy after
each step. It goes on past a step that breaks an invariant, recording the clauses, and
stops at a crash or a step the implementation cannot apply. `draw` turns it into a
PNG, SVG or PDF with matplotlib (`pip install 'kvspec[plot]'`), imported only then.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from kvspec.spec.accounting import HeldSequence, held_full_pages, held_swa_pages
from kvspec.spec.invariants import node_holding, non_root_nodes, request_holding
from kvspec.spec.pages import ceil_page
from kvspec.spec.snapshot import EngineConfig, EngineSnapshot, RequestView
from kvspec.spec.window import decode_window_bound, eviction_span_bound, retention

from .allocator_driver import AllocatorDriver
from .checks import TWO_POOL_OBSERVABLES, InvariantViolation, StepFailure
from .protocol import Adapter
from .replay import build_driver
from .trace import Trace

PRIVATE, PROTECTED, EVICTABLE = "request-private", "tree-protected", "tree-evictable"
CALLER = "held by the caller"
NOT_ATTRIBUTED, UNACCOUNTED, FREE = "held (not attributed)", "unaccounted (free group or leak)", "free"
CATEGORIES = (PRIVATE, PROTECTED, EVICTABLE, CALLER, NOT_ATTRIBUTED, UNACCOUNTED, FREE)
"""Bottom to top, as drawn."""
COLORS = dict(zip(CATEGORIES, ("#4c72b0", "#dd8452", "#f3c89b", "#8172b3", "#9a9a9a", "#c44e52", "#ececec")))
FORMATS = (".png", ".svg", ".pdf")
PLOT_HINT = "pip install 'kvspec[plot]'"


class PlotError(ValueError):
    """A picture that cannot be drawn: a file suffix that is no format, or no matplotlib."""


# -- the occupancy of one state -------------------------------------------------------------

@dataclass(frozen=True)
class Occupancy:
    """Pages per category (CATEGORIES) of each pool; they add up to the pool's pages
    unless a page is held twice (I4)."""

    full: dict[str, int]
    swa: dict[str, int]
    window_span: int | None = None
    """SWA pages: the sum of `window_span` over the requests (None: rows not shown)."""
    window_bound: int | None = None
    """SWA pages: the sum of `window_bound` over the requests (None: a request has none)."""


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
    fill_len - 1 - max(W, P), is drawn against it too, though I9 checks it only once it
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


def engine_occupancy(snapshot: EngineSnapshot, observables: Collection[str] = TWO_POOL_OBSERVABLES) -> Occupancy:
    """The occupancy of an engine snapshot (module docstring), from what the adapter shows."""
    allocator, page_size = snapshot.allocator, snapshot.config.page_size
    requests = [request_holding(r) for r in snapshot.requests]
    nodes = non_root_nodes(snapshot)

    def by_lock(lock_ref) -> dict[str, tuple[list[HeldSequence], frozenset[str]]]:
        return {PRIVATE: (requests, frozenset({"rows"})),
                PROTECTED: ([node_holding(n) for n in nodes if lock_ref(n) > 0], frozenset({"tree"})),
                EVICTABLE: ([node_holding(n) for n in nodes if lock_ref(n) <= 0], frozenset({"tree"}))}

    def with_mapping(holdings):  # SWA pages are found through the mapping (as I3 counts them)
        return {category: (sequences, needs | {"mapping"}) for category, (sequences, needs) in holdings.items()}

    full = pool_pages(allocator.full.num_pages, len(allocator.full.free_pages), by_lock(lambda n: n.full_lock_ref),
                      lambda sequences: len(held_full_pages(sequences, page_size)), observables)
    swa = pool_pages(allocator.swa.num_pages, len(allocator.swa.free_pages),
                     with_mapping(by_lock(lambda n: n.swa_lock_ref)),
                     lambda sequences: len(held_swa_pages(sequences, allocator.mapping, page_size)), observables)
    if "rows" not in observables:
        return Occupancy(full, swa)
    bounds = [window_bound(r, snapshot.config) for r in snapshot.requests]
    return Occupancy(full, swa, sum(window_span(r, page_size) // page_size for r in snapshot.requests),
                     None if None in bounds else sum(bound // page_size for bound in bounds))


def allocator_occupancy(driver: AllocatorDriver) -> Occupancy:
    """The occupancy of an allocator as its caller, the driver, sees it."""
    held = [sequence.held() for sequence in driver.sequences]
    state, (free_full, free_swa) = driver.state(), driver.free_page_counts()
    full = pool_pages(state.full.num_pages, free_full, {CALLER: (held, frozenset())},
                      lambda sequences: len(held_full_pages(sequences, driver.P)), driver.observables)
    swa = pool_pages(state.swa.num_pages, free_swa, {CALLER: (held, frozenset({"mapping"}))},
                     lambda sequences: len(held_swa_pages(sequences, state.mapping, driver.P)), driver.observables)
    return Occupancy(full, swa)


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
    """Pages of each pool, "full" and "swa"."""
    points: tuple[Point, ...] = ()
    stop: Stop | None = None


def title(trace: Trace, adapter: Adapter, label: str) -> str:
    config = trace.config
    if trace.tier == "allocator":
        return f"{adapter.name}: {label} (allocator, P={config['page_size']})"
    policy = config["policy"]
    return (f"{adapter.name}: {label} (P={config['page_size']}, W={config['window']}, "
            f"I={policy['decode_eviction_interval']}, {policy['version']})")


def timeline(trace: Trace, adapter: Adapter, label: str = "") -> Timeline:
    """Replay `trace` on `adapter`, recording the occupancy after each step (module docstring)."""
    heading = title(trace, adapter, label or trace.label or "trace")
    pools = {"full": trace.config["size_full"] // trace.config["page_size"],
             "swa": trace.config["size_swa"] // trace.config["page_size"]}
    try:
        driver = build_driver(trace, adapter)
    except StepFailure as failure:  # the fresh implementation already breaks an invariant
        return Timeline(heading, pools, (), Stop(0, failure.kind, f"before the first step: {failure}"))
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


# -- drawing ------------------------------------------------------------------------------------

def picture_path(path: str | Path) -> Path:
    """The path a picture is written to, once its suffix and matplotlib are known to work:
    a PlotError otherwise, before anything runs."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise PlotError(f"--plot {path}: the picture's format comes from its suffix; use {', '.join(FORMATS)}")
    pyplot()
    return path


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed), imported only to draw."""
    try:
        import matplotlib
    except ImportError as error:
        raise PlotError(f"drawing a picture needs matplotlib, which is not installed: {PLOT_HINT}") from error
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def plot_pool(axes, timeline: Timeline, pool: str, marks: bool = True) -> None:
    """One pool's pages per category, stacked, after each step; on the SWA pool the
    window lines; the steps that broke a clause (labelled with `marks`) and a crash."""
    steps = [point.step for point in timeline.points]
    edges = [step - 0.5 for step in steps] + [steps[-1] + 0.5] if steps else []  # each step one unit wide

    def per_step(values: list) -> list:  # a value per edge, the last one repeated to close the last step
        return values + values[-1:]

    pages = [getattr(point.occupancy, pool) for point in timeline.points]
    shown = [c for c in CATEGORIES if any(p.get(c, 0) for p in pages)]
    polygons = axes.stackplot(edges, *(per_step([p.get(c, 0) for p in pages]) for c in shown), labels=shown,
                              colors=[COLORS[c] for c in shown], step="post", linewidth=0) if shown else []
    if pool == "swa":
        for attribute, label, color, style in (("window_bound", "window bound (WIN-5, I9)", "black", "-"),
                                               ("window_span", "kept from the cursors", "#1f4e9c", "--")):
            values = [getattr(point.occupancy, attribute) for point in timeline.points]
            if any(value is not None for value in values):
                axes.step(edges, per_step([float("nan") if v is None else v for v in values]), where="post",
                          color=color, linestyle=style, linewidth=1.5, label=label)
    broken = [(point.step, ", ".join(point.violated)) for point in timeline.points if point.violated]
    if timeline.stop is not None:
        broken.append((timeline.stop.step, timeline.stop.kind))
    for step, what in broken:
        axes.axvline(step, color="#b2182b", linewidth=1, linestyle=":")
        if marks:
            axes.annotate(what, (step, 1), xycoords=axes.get_xaxis_transform(), xytext=(-1, -3),
                          textcoords="offset points", rotation=90, ha="right", va="top", fontsize=7,
                          color="#b2182b")
    axes.set_ylim(0, timeline.pool_pages[pool])
    axes.set_xlim(-0.5, max([*steps, *(step for step, _ in broken)], default=0) + 0.5)
    axes.set_ylabel(f"{'full' if pool == 'full' else 'SWA'} pool, pages")
    for axis in (axes.xaxis, axes.yaxis):  # steps and pages are whole numbers
        axis.get_major_locator().set_params(integer=True)
    handles, labels = axes.get_legend_handles_labels()
    order = [*reversed(range(len(polygons))), *range(len(polygons), len(handles))]  # top down, as stacked
    axes.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
                bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)


def draw(timeline: Timeline, path: str | Path) -> Path:
    """Both pools of `timeline`, one panel each, to `path` (.png, .svg or .pdf)."""
    path = picture_path(path)
    plt = pyplot()
    figure, (full, swa) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5), layout="constrained")
    plot_pool(full, timeline, "full")
    plot_pool(swa, timeline, "swa", marks=False)
    swa.set_xlabel("step of the trace")
    figure.suptitle(timeline.title, fontsize=10)
    if timeline.stop is not None:
        full.set_title(f"{timeline.stop.kind} {timeline.stop.message.splitlines()[0]}", fontsize=8, color="#b2182b")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
