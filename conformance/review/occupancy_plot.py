"""Pictures of a run: its timeline of occupancy (occupancy.py), drawn with matplotlib
(`pip install 'kvspec[plot]'`), imported only to draw, as a PNG, SVG or PDF.

One panel per pool, top down (`panels`): the full and SWA pools, or the one shared block
pool and, under it, its sliding-window blocks; and a state pool. Each stacks the pool's
pages (blocks, slots) per holder category after each step; the SWA pool carries the
window lines of WIN-5 (what the requests keep from their cursors, and its bound), the
sliding-window panel those of BLOCK-6. A dotted line marks each step that broke a clause
(labelled on the top panel), and the crash or divergence a timeline stops at.
"""

from dataclasses import dataclass
from pathlib import Path

from .occupancy import (
    BLOCKS_UNACCOUNTED,
    CACHED_FREE,
    CALLER,
    CHECKPOINT_EVICTABLE,
    CHECKPOINT_LOCKED,
    EVICTABLE,
    FREE,
    FULL_TABLES,
    NOT_ATTRIBUTED,
    PRIVATE,
    PROTECTED,
    STATE_UNACCOUNTED,
    SWA_TABLES,
    UNACCOUNTED,
    WORKING,
    Timeline,
)

CATEGORIES = (PRIVATE, PROTECTED, EVICTABLE, CALLER, FULL_TABLES, SWA_TABLES, WORKING, CHECKPOINT_LOCKED,
              CHECKPOINT_EVICTABLE, NOT_ATTRIBUTED, UNACCOUNTED, BLOCKS_UNACCOUNTED, STATE_UNACCOUNTED, CACHED_FREE,
              FREE)
"""Bottom to top, as drawn."""
COLORS = dict(zip(CATEGORIES, ("#4c72b0", "#dd8452", "#f3c89b", "#8172b3", "#4c72b0", "#55a868", "#4c72b0",
                               "#dd8452", "#f3c89b", "#9a9a9a", "#c44e52", "#c44e52", "#c44e52", "#f3c89b",
                               "#ececec")))
SWA_BLOCKS = "swa blocks"
"""The panel under a shared block pool: its sliding-window blocks against BLOCK-6."""
FORMATS = (".png", ".svg", ".pdf")
PLOT_HINT = "pip install 'kvspec[plot]'"


class PlotError(ValueError):
    """A picture that cannot be drawn: a file suffix that is no format, or no matplotlib."""


def panels(timeline: Timeline) -> tuple[str, ...]:
    """What `draw` draws, top down (PANELS): each pool, or the shared block pool and its
    sliding-window blocks."""
    pools = ("blocks", SWA_BLOCKS) if "blocks" in timeline.pool_pages else ("full", "swa")
    return (*pools, "state") if "state" in timeline.pool_pages else pools


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


@dataclass(frozen=True)
class Panel:
    """One panel of a picture: a pool's categories, stacked, and lines of Occupancy's
    window attributes, each (attribute, label, color, line style or "area": filled)."""

    pool: str | None
    """The pool whose categories are stacked; None: lines only, the axis fitted to them."""
    ylabel: str
    lines: tuple[tuple[str, str, str, str], ...] = ()


PANELS = {
    "full": Panel("full", "full pool, pages"),
    "swa": Panel("swa", "SWA pool, pages", (("window_bound", "window bound (WIN-5, I9)", "black", "-"),
                                            ("window_span", "kept from the cursors", "#1f4e9c", "--"))),
    "blocks": Panel("blocks", "shared block pool, blocks"),
    "state": Panel("state", "state pool, slots"),
    SWA_BLOCKS: Panel(None, "sliding-window blocks held", (("window_bound", "window bound (BLOCK-6)", "black", "-"),
                                                           ("window_span", "held, summed over requests",
                                                            COLORS[SWA_TABLES], "area"))),
}
"""The panels `plot_pool` draws, by name; `panels` names a timeline's, top down."""


def plot_pool(axes, timeline: Timeline, pool: str, marks: bool = True) -> None:
    """The panel named `pool` (PANELS) after each step: a pool's pages per category,
    stacked, and its window lines (on the SWA pool; under a shared block pool, on a
    panel of their own); the steps that broke a clause (labelled with `marks`) and a
    crash."""
    panel = PANELS[pool]
    steps = [point.step for point in timeline.points]
    edges = [step - 0.5 for step in steps] + [steps[-1] + 0.5] if steps else []  # each step one unit wide

    def per_step(values: list) -> list:  # a value per edge, the last one repeated to close the last step
        return values + values[-1:]

    pages = [point.occupancy.pools.get(panel.pool, {}) for point in timeline.points]
    shown = [c for c in CATEGORIES if any(p.get(c, 0) for p in pages)]
    polygons = axes.stackplot(edges, *(per_step([p.get(c, 0) for p in pages]) for c in shown), labels=shown,
                              colors=[COLORS[c] for c in shown], step="post", linewidth=0) if shown else []
    highest = 0
    for attribute, label, color, style in panel.lines:
        values = [getattr(point.occupancy, attribute) for point in timeline.points]
        if any(value is not None for value in values):
            highest = max(highest, *(value for value in values if value is not None))
            values = per_step([float("nan") if v is None else v for v in values])
            if style == "area":  # drawn under the lines (a collection), which stay visible where they meet it
                axes.fill_between(edges, values, step="post", color=color, alpha=0.6, linewidth=0, label=label)
            else:
                axes.step(edges, values, where="post", color=color, linestyle=style, linewidth=1.5, label=label)
    broken = [(point.step, ", ".join(point.violated)) for point in timeline.points if point.violated]
    if timeline.stop is not None:
        broken.append((timeline.stop.step, timeline.stop.kind))
    for step, what in broken:
        axes.axvline(step, color="#b2182b", linewidth=1, linestyle=":")
        if marks:
            axes.annotate(what, (step, 1), xycoords=axes.get_xaxis_transform(), xytext=(-1, -3),
                          textcoords="offset points", rotation=90, ha="right", va="top", fontsize=7,
                          color="#b2182b")
    axes.set_ylim(0, timeline.pool_pages[panel.pool] if panel.pool else highest + max(1, highest // 10))
    axes.set_xlim(-0.5, max([*steps, *(step for step, _ in broken)], default=0) + 0.5)
    axes.set_ylabel(panel.ylabel)
    for axis in (axes.xaxis, axes.yaxis):  # steps and pages are whole numbers
        axis.get_major_locator().set_params(integer=True)
    handles, labels = axes.get_legend_handles_labels()
    order = [*reversed(range(len(polygons))), *range(len(polygons), len(handles))]  # top down, as stacked
    axes.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
                bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)


def draw(timeline: Timeline, path: str | Path) -> Path:
    """The panels of `timeline` (both pools, or the shared block pool and its sliding-window
    blocks; and a state pool), top down, to `path` (.png, .svg or .pdf)."""
    path = picture_path(path)
    plt = pyplot()
    names = panels(timeline)
    figure, axes_top_down = plt.subplots(len(names), 1, sharex=True, figsize=(9, 2.75 * len(names)),
                                         layout="constrained")
    for index, (axes, panel) in enumerate(zip(axes_top_down, names)):
        plot_pool(axes, timeline, panel, marks=index == 0)
    axes_top_down[-1].set_xlabel("step of the trace")
    figure.suptitle(timeline.title, fontsize=10)
    if timeline.stop is not None:
        axes_top_down[0].set_title(f"{timeline.stop.kind} {timeline.stop.message.splitlines()[0]}", fontsize=8,
                                   color="#b2182b")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
