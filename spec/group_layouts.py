"""[BLOCK-11] Group layouts: which attention groups a shared block pool has (full attention
only, a window only, several groups of one kind, or one of each), what a prefix hit adopts
across several groups of a kind, and that an engine keeps the layout it was built with.
Every other clause of chapter 08 reads the groups by kind (kvspec.spec.block_pool)."""

from collections.abc import Sequence

from .block_pool import BlockPoolSnapshot, prefix_hit_blocks
from .notation import Violation
from .registry import invariant
from .window import EVERY_GROUP, FULL, SWA

MAX_GROUPS = 4
"""[BLOCK-11] The most attention groups a layout has here (real models have a few)."""


def layout_problems(layout: Sequence[str]) -> list[str]:
    """[BLOCK-11] What is wrong with a layout of attention groups, as sentences that say
    how to fix it; empty when it is valid.

    post: (__return__ == []) == (1 <= len(layout) <= MAX_GROUPS and set(layout) <= set(EVERY_GROUP))
    """
    if not 1 <= len(layout) <= MAX_GROUPS or not set(layout) <= set(EVERY_GROUP):
        return [f"layout must name 1 to {MAX_GROUPS} attention groups, each of {' or '.join(EVERY_GROUP)} "
                f"(got {list(layout)!r})"]
    return []


def kind_cached(layout: Sequence[str], cached: Sequence[Sequence[bool]], kind: str, length: int) -> list[bool]:
    """[BLOCK-11] Whether every group of `kind` caches each of a prompt's first `length`
    blocks (`cached[g]`: whether group g caches each): a hit adopts a block in every group
    of a kind or in none (vLLM looks groups of one spec up together). A layout without
    the kind constrains nothing: all True.

    pre: len(layout) == len(cached) and all(len(c) >= length for c in cached) and length >= 0
    post: len(__return__) == length
    """
    groups = [cached[g] for g, k in enumerate(layout) if k == kind]
    return [all(c[i] for c in groups) for i in range(length)]


def layout_hit_blocks(layout: Sequence[str], cached: Sequence[Sequence[bool]], run: int, limit: int) -> int:
    """[BLOCK-9, BLOCK-11] How many whole blocks a prefix hit covers in a layout:
    `prefix_hit_blocks` over what every full-attention group and every sliding-window
    group caches (a layout of one kind: that kind's own hit, the other constraining nothing).

    pre: run >= 1 and limit >= 0 and len(layout) == len(cached) and len(set(map(len, cached))) <= 1
    post: 0 <= __return__ <= limit
    """
    length = len(cached[0]) if cached else 0
    return prefix_hit_blocks(kind_cached(layout, cached, FULL, length), kind_cached(layout, cached, SWA, length),
                             run, limit)


@invariant("BLOCK-11", "mapping")
def layout_violations(now: BlockPoolSnapshot) -> list[Violation]:
    """[BLOCK-11] The engine keeps the attention groups it was built with, in that order."""
    view = now.block_pool
    if view.groups != tuple(now.config.layout):
        return [Violation("BLOCK-11", f"the engine's attention groups are {list(view.groups)}; it was built with "
                                      f"the layout {list(now.config.layout)}")]
    return []
