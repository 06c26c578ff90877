"""A trace's front matter: what its header says about it beyond its configuration, as
test262 says it in front of a test, so that a runner in any language knows what a trace
is about and what it needs without replaying it. kvspec writes it for every trace it
writes: the conformance vectors (runs/vectors.py), a check's counterexamples
(runs/runner.py), the known divergences (kvspec.adapters.divergence) and the example of
docs/examples/long_chunked_prefill.py.

* `clauses`: the clauses the trace exercises: every clause whose check ran on at least
  one of its steps when the reference replayed it, as the driver's tally counts them
  (checks.Tally.clauses: every registered invariant checked after a step, a check an
  incremental certificate found nothing for included, and the checks a driver makes of
  one step: an allocation's outcome, ALLOC-2 and ALLOC-4; a refusal, ALLOC-6 and
  LIFE-1), up to the step where the reference stopped if it did, and OBS-3 where a step
  carries `expect`, which a replay compares.
* `needs`: the capabilities a replay needs (needs.derived_needs).
* `violates`: of a regression or known divergence, the clauses an implementation with
  the bug breaks, at least one of them: its caller knows them (a divergence's list, a
  finding of SGLang's history).
"""

from dataclasses import replace

from .needs import derived_needs
from .protocol import Adapter, AdapterError
from .replay import replay
from .trace import Trace, clause_ids


def exercised(trace: Trace, reference: Adapter) -> tuple[str, ...]:
    """The clauses the trace exercises on the reference (see the module docstring), in
    the chapters' order; () where the reference cannot build its configuration."""
    if trace.tier == "engine" and reference.for_version(trace.config["policy"]["version"]) is None:
        return ()  # a version the reference does not implement: nothing ran
    try:
        result = replay(trace, reference, compare=False)
    except AdapterError:
        return ()
    ran = set(result.tally.clauses) if result.tally is not None else set()
    if any(step.expect is not None for step in trace.steps):
        ran.add("OBS-3")
    return tuple(clause for clause in clause_ids() if clause in ran)


def with_front_matter(trace: Trace, reference: Adapter | None, violates: tuple[str, ...] = ()) -> Trace:
    """The trace with its front matter written: `needs` from its steps, `clauses` from a
    replay on `reference` (none without one), `violates` as given (else as it was)."""
    return replace(trace, needs=derived_needs(trace),
                   clauses=exercised(trace, reference) if reference is not None else (),
                   violates=tuple(violates) or trace.violates)
