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
and how it must be caught (an invariant class, or `CRASH`: declarations.py). Other families name real
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

from .declarations import CRASH, Run

ADAPTERS, FAMILIES, DIVERGENCES = "kvspec.adapters", "kvspec.adapter_families", "kvspec.divergences"


class MalformedDeclaration(Exception):
    """A family, mutant or invariant declared wrongly: kvspec or the registering package must
    fix it (raised where it is registered, never an `assert`, which `python -O` drops)."""


def check_declaration(mutant: type, slug: str) -> None:
    """A mutant names a registered (clause, invariant class), or CRASH with the text its
    crash shows, and says in a docstring what the bug is."""
    registered_pairs = {(invariant.clause, invariant.invariant_class) for invariant in INVARIANTS}
    if mutant.invariant_class == CRASH:
        if not (isinstance(mutant.clause, str) and re.fullmatch(CLAUSE_ID, mutant.clause) and mutant.crash_message):
            raise MalformedDeclaration(f"mutant {slug!r}: a crash names the clause whose refusal fires and its "
                                       f"crash_message")
    elif (mutant.clause, mutant.invariant_class) not in registered_pairs:
        raise MalformedDeclaration(f"mutant {slug!r}: ({mutant.clause!r}, {mutant.invariant_class!r}) is no "
                                   f"registered invariant and class")
    if not mutant.__doc__:
        raise MalformedDeclaration(f"mutant {slug!r}: say in a docstring what the bug is")
    if not isinstance(getattr(mutant, "exposed_by", None), Run):
        raise MalformedDeclaration(f"mutant {slug!r}: exposed_by must name the Run of a check that exposes it "
                                   f"(kvspec.conformance.harness.declarations.Run)")


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

    versions_at: str = ""
    """`module:attribute` of the family's versions, oldest first (an engine's releases), for
    `kvspec bisect`; "" for a family whose members are no versions of one thing (a bug zoo):
    then they are all of one version."""
    placed_at: str = ""
    """`module:attribute` of a function adapter -> (version, line): the version of `versions`
    the member is of, and its line, what it is besides its version (a tree, knobs turned from
    their defaults), so that the members of one line differ only by their version. Members of
    one version share a process (one process imports one release of an engine). "": each
    member is a line of its own, of the family's one version."""

    def installed(self) -> bool:
        if self.installed_at:
            return load(self.installed_at)()
        return not self.requires or importlib.util.find_spec(self.requires) is not None

    def members(self) -> dict[str, Any]:
        return load(self.members_at)

    def left_out(self) -> dict[str, str]:
        return load(self.left_out_at) if self.left_out_at else {}

    def versions(self) -> tuple[str, ...]:
        return tuple(load(self.versions_at)) if self.versions_at else ("",)

    def placement(self, slug: str, adapter: Any) -> tuple[str, str]:
        """(version, line) of a member (`placed_at`)."""
        return load(self.placed_at)(adapter) if self.placed_at else ("", slug)


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
        if not isinstance(family, Family):
            raise MalformedDeclaration(f"entry point {ep.name} of {FAMILIES} must name a Family, not {family!r}")
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
