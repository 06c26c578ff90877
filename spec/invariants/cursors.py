"""[I7] The cursors of every request: within what it allocated, and never moving back.

These read only the requests' rows and cursors, which every memory model shows, so they
apply to every engine snapshot."""

from ..notation import Violation
from ..registry import invariant
from ..snapshot import EngineSnapshot, Step
from .holders import find_request


@invariant("I7", "alignment", reads={"rows"})
def cursor_bound_violations(now: EngineSnapshot) -> list[Violation]:
    """[I7] For every request: the row has L slots, C <= L and e <= L."""
    found = []
    for r in now.requests:
        if len(r.row) != r.kv_allocated_len:
            found.append(Violation("I7", f"request {r.rid}: row holds {len(r.row)} slots, kv_allocated_len is {r.kv_allocated_len}"))
        for field, value in (("kv_committed_len", r.kv_committed_len), ("SWA cursor", r.swa_evicted_seqlen)):
            if value > r.kv_allocated_len:
                found.append(Violation("I7", f"request {r.rid}: {field} {value} is beyond kv_allocated_len {r.kv_allocated_len}"))
    return found


@invariant("I7", "alignment", reads={"rows"})
def cursor_monotonicity_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I7] For every request in both snapshots, neither e nor cpl decreases, and a cursor
    that advanced is at least the previous cpl (it is raised to the protected length
    before anything is freed)."""
    found = []
    for after in now.requests:
        before = find_request(previous, after.rid)
        if before is None:
            continue
        for field in ("swa_evicted_seqlen", "cache_protected_len"):
            if getattr(after, field) < getattr(before, field):
                found.append(Violation("I7", f"request {after.rid}: {field} moved back from {getattr(before, field)} to {getattr(after, field)}"))
        if before.swa_evicted_seqlen < after.swa_evicted_seqlen < before.cache_protected_len:
            found.append(Violation("I7", f"request {after.rid}: SWA cursor advanced to {after.swa_evicted_seqlen}, "
                                         f"below the previous cache_protected_len {before.cache_protected_len}"))
    return found
