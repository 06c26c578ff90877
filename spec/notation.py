"""Notation [MODEL-1]: what the integers of the spec stand for.

The aliases are documentation for readers (and CrossHair): a `SlotId` is an index into
a KV buffer, a `PageId` an index of a page of `page_size` slots, a `Position` a logical
token index inside one request's sequence.
"""

from dataclasses import dataclass

SlotId = int
PageId = int
Position = int

PADDING_PAGE: PageId = 0
"""[MODEL-2] Page 0 (slots 0 .. page_size-1) of every pool is the padding sink: it is
never handed out and never freed."""

NO_SWA_PEER: SlotId = 0
"""[MAP-1] `mapping[f] == 0` means full slot `f` has no live sliding-window peer."""

MAPPING_SENTINEL: SlotId = -1
"""[MAP-1] The last entry of the full->SWA mapping, so that translating `last_loc == -1`
(no previous token) yields -1 on the SWA side too."""


@dataclass(frozen=True)
class Violation:
    """One broken clause, with a message that says what was observed."""

    clause: str
    message: str

    def __str__(self) -> str:
        return f"[{self.clause}] {self.message}"
