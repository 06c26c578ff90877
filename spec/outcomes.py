"""Outcomes [MODEL-3]: how an operation ends when it does not simply succeed.

An allocation that cannot be served *returns* `OutOfMemory` and changes nothing (ALLOC-4).
A call that breaks an operation's contract *raises* a `KvSpecError` subclass naming what
was wrong: the caller has a bug, and state was left untouched.
"""

from dataclasses import dataclass
from enum import Enum


class Name(str, Enum):
    """A name the spec fixes, spelled as traces, vectors and reports spell it: an enum
    member is its own string (`Outcome.OK == "ok"`, and it prints as `ok`). Its repr is
    the string's, so a message or a config's repr quotes the name as a trace spells it."""

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Outcome(Name):
    """[OBS-3] How a step ended, as a trace's `expect` records it."""

    OK = "ok"
    OUT_OF_MEMORY = "out_of_memory"
    """The allocation could not be served (ALLOC-4): OutOfMemory was returned."""
    REFUSED = "refused"
    """A misuse the spec requires the implementation to refuse was refused (LIFE-1, ALLOC-6)."""


@dataclass(frozen=True)
class OutOfMemory:
    """[ALLOC-4] Not enough free pages: `pool` ("full" or "swa") needed `needed_pages`
    and had `available_pages`. Nothing was allocated."""

    pool: str
    needed_pages: int
    available_pages: int

    def __str__(self) -> str:
        return (f"out of memory in the {self.pool} pool: needed {self.needed_pages} pages, "
                f"{self.available_pages} free")


class KvSpecError(Exception):
    """Base of every error the spec names."""


class InvalidConfig(KvSpecError, ValueError):
    """[MODEL-4] A pool or window configuration the spec does not allow."""


class InvalidFree(KvSpecError):
    """[ALLOC-6] A free of something the caller does not own: the padding page, a free
    page, the same slot twice, or an unmapped SWA peer on a strict path."""

    def __init__(self, message: str, slots: tuple = ()):
        super().__init__(message)
        self.slots = tuple(slots)


class InvalidAllocation(KvSpecError):
    """[ALLOC-5] An allocation whose arguments break its preconditions (for example a
    `last_loc` whose in-page offset does not match the prefix length)."""


class InvalidRequest(KvSpecError):
    """[LIFE-1] A request-level operation that the lifecycle does not allow."""
