"""[I15] A step that ran out of memory changes nothing of its request.

It reads only the request rows, which every memory model shows: it applies to every
engine snapshot."""

from dataclasses import fields

from ..notation import Violation
from ..outcomes import Outcome
from ..registry import invariant
from ..snapshot import EngineSnapshot, RequestView, Step
from .holders import find_request


@invariant("I15", "atomicity", reads={"rows"})
def atomicity_violations(previous: EngineSnapshot, step: Step | None, now: EngineSnapshot) -> list[Violation]:
    """[I15] A step that ended in OutOfMemory leaves its requests (a batch's, LIFE-9) as they
    were: still absent if absent, else the same RequestView except the SWA cursor, which the
    window eviction that runs before a decode's allocation may have advanced (I7, I8 check it)."""
    if step is None or step.outcome != Outcome.OUT_OF_MEMORY:
        return []
    found = []
    for rid in step.rids:
        before, after = find_request(previous, rid), find_request(now, rid)
        if before is None and after is not None:
            found.append(Violation("I15", f"request {rid} holds KV after a failed {step.operation} step (OutOfMemory)"))
        if before is None:
            continue
        changed = [f.name for f in fields(RequestView)
                   if f.name != "swa_evicted_seqlen" and (after is None or getattr(before, f.name) != getattr(after, f.name))]
        if changed:
            found.append(Violation("I15", f"request {rid} changed ({', '.join(changed)}) in a failed {step.operation} "
                                          f"step (OutOfMemory)"))
    return found
