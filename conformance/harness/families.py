"""What packages register with kvspec, read from entry points: the harness never imports an adapter.

Three entry-point groups (kvspec's own pyproject.toml registers its built-ins in them;
any installed package can add to them):

  kvspec.adapters          name -> an adapter object (`--adapter NAME`)
  kvspec.adapter_families  name -> a `Family`: adapters named `<prefix><slug>`, such as
                           the bug zoo's `mutant-<slug>` (`--adapter`, `kvspec zoo`, clause coverage)
  kvspec.divergences       name -> a list of known divergences of a real implementation
                           from the spec (clause coverage; each has `id`, `title`,
                           `clauses` and `adapters`)

A seeded family's members are bugs: each declares the `Run` of a check that exposes it
and how it must be caught (an invariant class, or `CRASH`). Other families name real
adapters, such as every release of an engine.
"""

import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from kvspec.spec.clauses import CLAUSE_ID
from kvspec.spec.invariants import INVARIANTS

ADAPTERS, FAMILIES, DIVERGENCES = "kvspec.adapters", "kvspec.adapter_families", "kvspec.divergences"

CRASH = "crash"
"""The detection a mutant declares when no invariant can see its bug first: the step fails
inside the implementation (a refusal the spec requires of the allocator, ALLOC-6, or an
allocation the bug let through and the pool cannot serve), which the harness reports as
a crash with a shrunk, replayable trace. The mutant's `clause` then names the clause
whose refusal fires, and its `crash_message` the text the crash must show."""


@dataclass(frozen=True)
class Run:
    """One conformance run, as `kvspec check` makes it: the allocator machine at a page
    size, the engine machine at a page size, window and decode eviction interval, or
    the scheduler machine at a page size and window."""

    page_size: int
    window: int | None = None
    interval: int | None = None
    state_grid: int | None = None
    """With recurrent state (chapter 09): its checkpoint grid; None: none."""
    scheduler: bool = False
    """The scheduler tier (chapter 10): the implementation's own scheduler plans."""
    state: bool = False
    """At the scheduler tier: a recurrent-state group beside the attention groups (SCHED-9)."""

    @property
    def tier(self) -> str:
        return "scheduler" if self.scheduler else "allocator" if self.window is None else "engine"

    @property
    def label(self) -> str:
        if self.tier == "allocator":
            return f"allocator P={self.page_size}"
        if self.tier == "scheduler":
            return f"scheduler{'+state' if self.state else ''} P={self.page_size} W={self.window}"
        label = f"P={self.page_size} W={self.window} I={self.interval}"
        return f"engine {label}" if self.state_grid is None else f"engine+state {label} G={self.state_grid}"


PAGE_SIZES = (1, 2, 4, 16)
"""The allocator tier's runs, one per page size."""
ENGINE_CONFIGS = (  # (page size, window, decode eviction interval): W % P == 0, 1..P-2, P-1, and P > W
    (1, 3, 4), (2, 5, 1), (4, 6, 4), (4, 7, 1), (4, 8, 1), (4, 8, 128), (16, 5, 4))
"""The engine tier's runs. The default interval 128 never fires in pools this small (a
request cannot outgrow its cursor by 128 tokens): (4, 8, 128) checks that nothing is
evicted before it is due, and (4, 8, 1) is the page-multiple window with decode
eviction firing."""
STATE_CONFIGS = ((1, 3, 4, 1), (2, 5, 1, 4), (4, 6, 4, 8))
"""The engine tier's runs with recurrent state (page size, window, interval, checkpoint
grid): every position a boundary (SGLang without its extra buffer needs page size 1),
and grids of two pages, so that hits and checkpoints fall on and off the grid."""
SCHEDULER_CONFIGS = ((1, 3), (2, 5), (4, 7), (4, 8), (16, 5))
"""The scheduler tier's runs (page size, window): W % P == 0, 1..P-2, P-1, and P > W."""
SCHEDULER_STATE_CONFIGS = ((1, 3), (4, 7))
"""The scheduler tier's runs with a recurrent-state group (page size, window)."""
RUNS = (*(Run(page_size) for page_size in PAGE_SIZES), *(Run(*config) for config in ENGINE_CONFIGS),
        *(Run(*config) for config in STATE_CONFIGS),
        *(Run(*config, scheduler=True) for config in SCHEDULER_CONFIGS),
        *(Run(*config, scheduler=True, state=True) for config in SCHEDULER_STATE_CONFIGS))
"""Every run a check makes (for the tiers and page sizes an adapter has)."""


def check_declaration(mutant: type, slug: str) -> None:
    """A mutant names a registered (clause, invariant class), or CRASH with the text its
    crash shows, and says in a docstring what the bug is."""
    registered_pairs = {(invariant.clause, invariant.invariant_class) for invariant in INVARIANTS}
    if mutant.invariant_class == CRASH:
        assert re.fullmatch(CLAUSE_ID, mutant.clause) and mutant.crash_message, \
            f"mutant {slug!r}: a crash names the clause whose refusal fires and its crash_message"
    else:
        assert (mutant.clause, mutant.invariant_class) in registered_pairs, \
            f"mutant {slug!r}: ({mutant.clause!r}, {mutant.invariant_class!r}) is no registered invariant and class"
    assert mutant.__doc__, f"mutant {slug!r}: say in a docstring what the bug is"


@dataclass(frozen=True)
class Family:
    """Adapters registered together under one name prefix: a member is `<prefix><slug>`."""

    prefix: str
    """e.g. "mutant-"."""
    implementation: str
    """What the members are built on ("reference", "sglang", ...): `kvspec zoo --implementation`."""
    shown_as: str
    """How reports name it: "the reference", "real SGLang"."""
    members_at: str
    """`module:attribute` of the dict slug -> adapter; imported only when a member is needed."""
    requires: str = ""
    """The top-level module the members drive, where it must be installed (e.g. "sglang")."""
    install: str = ""
    """How to install it."""
    left_out_at: str = ""
    """`module:attribute` of a dict slug -> why the family has no such member, where a
    sibling family has one (in an error message)."""
    seeded: bool = True
    """Members are seeded bugs (the zoo runs them, clause coverage counts them); False for a
    family of real adapters, such as the releases of one engine (`sglang@<release>`)."""
    installed_at: str = ""
    """`module:attribute` of a function saying whether the members can run here, for an engine
    that is no importable module until activated (a build kept in a cache folder)."""

    def installed(self) -> bool:
        if self.installed_at:
            return load(self.installed_at)()
        return not self.requires or importlib.util.find_spec(self.requires) is not None

    def members(self) -> dict[str, Any]:
        return load(self.members_at)

    def left_out(self) -> dict[str, str]:
        return load(self.left_out_at) if self.left_out_at else {}


class PreparedMembers(Mapping):
    """A family's members (slug -> adapter) whose lookup first prepares this process for
    the member (`prepare(adapter)`: make its release or build the one `import` finds,
    before the harness starts its forkserver). Iterating and `items()` prepare nothing, so
    that clause coverage reads the declarations where the engine is not installed."""

    def __init__(self, members: dict[str, Any], prepare: Callable[[Any], None]):
        self.members, self.prepare = members, prepare

    def __getitem__(self, slug: str) -> Any:
        adapter = self.members[slug]
        self.prepare(adapter)
        return adapter

    def items(self):
        return self.members.items()

    def __contains__(self, slug) -> bool:
        return slug in self.members

    def __iter__(self):
        return iter(self.members)

    def __len__(self):
        return len(self.members)


def load(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def registered(group: str) -> list[EntryPoint]:
    return sorted(entry_points(group=group), key=lambda ep: ep.name)


@cache
def families() -> tuple[Family, ...]:
    """Every registered family, longest prefix first (`sglang-mutant-` before `mutant-`)."""
    found = []
    for ep in registered(FAMILIES):
        family = ep.load()
        assert isinstance(family, Family), f"entry point {ep.name} of {FAMILIES} must name a Family, not {family!r}"
        found.append(family)
    return tuple(sorted(found, key=lambda family: -len(family.prefix)))


def seeded_families() -> tuple[Family, ...]:
    """The families of seeded bugs (the zoo's, clause coverage's)."""
    return tuple(family for family in families() if family.seeded)


def family_of(name: str) -> Family | None:
    return next((family for family in families() if name.startswith(family.prefix)), None)


class UnknownMember(LookupError):
    """A name with a family's prefix but no such member."""


class UnavailableMember(LookupError):
    """A member that exists but cannot be used here (a family raises it, saying how to
    install what the member needs)."""


def adapter(name: str) -> Any | None:
    """The adapter registered as `name`, or the family member it names; None if neither."""
    found = [ep for ep in registered(ADAPTERS) if ep.name == name]
    if found:
        return found[0].load()
    family = family_of(name)
    if family is None:
        return None
    slug = name.removeprefix(family.prefix)
    members = family.members()
    if slug not in members:
        why = f" ({slug}: {family.left_out()[slug]})" if slug in family.left_out() else ""
        kind = "mutant of" if family.seeded else "member of"
        raise UnknownMember(f"unknown {kind} {family.shown_as} {name!r}{why}; the family has "
                            + ", ".join(f"{family.prefix}{member}" for member in members))
    return members[slug]


def known_adapters() -> str:
    """The registered names and every family's members, for an error message."""
    members = [f"{family.shown_as}: " + ", ".join(f"{family.prefix}{slug}" for slug in family.members())
               for family in seeded_families()]
    releases = [f"{family.shown_as}: {family.prefix}<member> ({len(family.members())} members)"
                for family in families() if not family.seeded]
    return (", ".join(ep.name for ep in registered(ADAPTERS)) + "; " + "; ".join(releases)
            + "; seeded bugs in " + "; in ".join(members))


def divergences() -> list[tuple[str, Any, list]]:
    """(name, module, known divergences) of every registered list."""
    found = []
    for ep in registered(DIVERGENCES):
        found.append((ep.name, importlib.import_module(ep.module), ep.load()))
    return found
