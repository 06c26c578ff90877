"""[I1-I6, I16] The allocator invariants (spec/accounting.py) over a two-pool engine's holders."""

from ..accounting import (
    alignment_violations,
    conservation_violations,
    free_list_violations,
    mapping_violations,
    ownership_violations,
    pending_violations,
)
from ..notation import Violation
from ..registry import invariant
from ..snapshot import TwoPoolSnapshot
from .holders import held_pages, held_sequences, holders, non_root_nodes


@invariant("I1", "leak", reads={"free_sets"})
def engine_free_list_violations(now: TwoPoolSnapshot) -> list[Violation]:
    """[I1] Both free lists: no duplicate, no padding page, only pages of the pool."""
    pools = (now.allocator.full, now.allocator.swa)
    return [v for pool in pools for v in free_list_violations(pool) if v.clause == "I1"]


@invariant("I2", "leak", reads={"free_sets", "rows", "tree"})
def full_conservation_violations(now: TwoPoolSnapshot) -> list[Violation]:
    """[I2] free + pending + held full pages == all full pages; requests hold [cpl, L),
    nodes their full values."""
    return conservation_violations(now.allocator.full, held_pages(now)[0], "I2")


@invariant("I3", "leak", reads={"free_sets", "mapping", "rows", "tree"})
def swa_conservation_violations(now: TwoPoolSnapshot) -> list[Violation]:
    """[I3] free + pending + held SWA pages == all SWA pages; requests hold the peers of
    [max(e, cpl), L), non-tombstone nodes the peers of their full values."""
    return conservation_violations(now.allocator.swa, held_pages(now)[1], "I3")


@invariant("I4", "ownership", reads={"mapping", "rows", "tree"})
def engine_ownership_violations(now: TwoPoolSnapshot) -> list[Violation]:
    """[I4] Each held page, full or SWA, has one holder (a request or a node) and is not free."""
    full, swa = held_pages(now)
    return [*ownership_violations(now.allocator.full, full), *ownership_violations(now.allocator.swa, swa)]


@invariant("I5", "mapping", reads={"mapping", "rows", "tree"})
def engine_mapping_violations(now: TwoPoolSnapshot) -> list[Violation]:
    """[I5] Live-SWA positions of requests and nodes map to allocated SWA slots,
    injectively and page-in-step; every other full slot maps to 0."""
    allocator = now.allocator
    return mapping_violations(allocator.mapping, allocator.size_full, now.config.page_size, held_sequences(now), allocator.swa)


@invariant("I6", "alignment", reads={"rows", "tree"})
def engine_alignment_violations(now: TwoPoolSnapshot) -> list[Violation]:
    """[I6] Held slots sit at their positions' in-page offsets (accounting); cpl and e are
    multiples of P for every request; every non-root node holds a non-empty key of whole
    pages from a page boundary."""
    found, page_size = [], now.config.page_size
    for name, sequence in holders(now):
        found.extend(Violation("I6", v.message.replace("sequence 0", name, 1)) for v in alignment_violations([sequence], page_size))
    for r in now.requests:
        for field, value in (("cache_protected_len", r.cache_protected_len), ("SWA cursor", r.swa_evicted_seqlen)):
            if value % page_size != 0:
                found.append(Violation("I6", f"request {r.rid}: {field} {value} is not a multiple of page size {page_size}"))
    for node in non_root_nodes(now):
        if len(node.key) == 0 or len(node.key) % page_size != 0 or node.start % page_size != 0:
            found.append(Violation("I6", f"node {node.node_id}: {len(node.key)} tokens at position {node.start}, not whole pages from a page start"))
    return found


@invariant("I16", "leak", reads={"free_sets"})
def free_group_violations(now: TwoPoolSnapshot) -> list[Violation]:
    """[I16] No page waits twice in an open free group (the rest of I16 is I1-I5, which
    count pending pages)."""
    return [*pending_violations(now.allocator.full), *pending_violations(now.allocator.swa)]
