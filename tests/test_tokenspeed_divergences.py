"""[the known-divergences list] Every known difference between TokenSpeed's scheduler
0.1.42 and the spec still reproduces on every adapter it names, and what the adapters
steer by is what makes the difference.

Skipped when the package is not installed (`pip install --no-deps -r
adapters/tokenspeed/requirements.txt`), unless KVSPEC_REQUIRE_TOKENSPEED=1."""

import importlib.util
import os
from dataclasses import replace

import pytest

if (os.environ.get("KVSPEC_REQUIRE_TOKENSPEED") != "1"
        and importlib.util.find_spec("tokenspeed_scheduler") is None):
    pytest.skip("tokenspeed-scheduler is not installed: pip install --no-deps -r adapters/tokenspeed/requirements.txt",
                allow_module_level=True)

from kvspec.adapters.tokenspeed.divergences import KNOWN_DIVERGENCES
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.conformance.harness.replay import replay
from kvspec.conformance.harness.trace import Trace
from kvspec.spec.clauses import load_clauses

CASES = [(d, adapter) for d in KNOWN_DIVERGENCES for adapter in d.adapters]


@pytest.mark.parametrize("divergence,adapter", CASES, ids=[f"{d.id}-{a}" for d, a in CASES])
def test_the_divergence_still_reproduces(divergence, adapter):
    trace = divergence.trace()
    result = replay(trace, load_adapter(adapter))
    assert result.reproduces(trace), (f"{divergence.id} ({divergence.title}) no longer reproduces on {adapter}: "
                                      f"{result.verdict()}. If TokenSpeed changed it, remove the entry.")
    assert set(result.failure.clauses) & set(divergence.clauses)


class Victims:
    """A TokenSpeed scheduler whose plans' preemptions are noted on their way to the driver."""

    def __init__(self, scheduler, noted: list):
        self.scheduler, self.noted = scheduler, noted

    def plan(self):
        plan = self.scheduler.plan()
        self.noted += [(p.rid, p.how.value) for p in plan.preempted]
        return plan

    def __getattr__(self, name):
        return getattr(self.scheduler, name)


def victims(adapter: str, trace: Trace) -> tuple[list[tuple[str, str]], bool]:
    """The preemptions of `trace` on `adapter`, in order, and whether it conformed."""
    built = load_adapter(adapter)
    noted: list = []
    result = replay(trace, replace(built, make_scheduler=lambda config: Victims(built.make_scheduler(config), noted)))
    return noted, result.conforms


TOKENSPEED_1 = next(d for d in KNOWN_DIVERGENCES if d.id == "TOKENSPEED-1")


def test_both_builds_preempt_the_request_whose_pages_no_row_needed():
    """[SCHED-7] On TOKENSPEED-1's trace the retracting build sets r1 aside and the aborting
    one ends it (the client loses it): an incomplete prefill ranks first for a retraction,
    and the newest resident is the one aborted."""
    assert victims("tokenspeed", TOKENSPEED_1.trace()) == ([("r1", "retract")], False)
    assert victims("tokenspeed-aborts", TOKENSPEED_1.trace()) == ([("r1", "abort")], False)


def test_without_a_snapshot_pool_the_victim_is_the_newest_resident():
    """Why random runs meet TOKENSPEED-1 less often without a snapshot pool: no image fits
    there, and `chooseVictim` (forward.cpp:745-803) returns the newest retractable resident,
    to abort; with one it ranks decodes by the pages they newly free. The trace the first
    shrink gave (the 16-token r1 arrives first, 28 pages): at the same plan the retracting
    build sets r1 aside, pages no row needed, and the aborting one ends r3, one of the two
    blocked decodes, whose pages the plan's other decodes then take (SCHED-7 holds)."""
    trace = TOKENSPEED_1.trace()
    r2, r3, r1, drain = trace.steps
    first = replace(trace, config={**trace.config, "pages": 28},
                    steps=(replace(r1, args={**r1.args, "prompt": [0] * 16}), r2, r3, drain))
    assert victims("tokenspeed", first) == ([("r1", "retract")], False)
    assert victims("tokenspeed-aborts", first) == ([("r3", "abort")], True)


def test_the_adapters_steer_as_the_entries_say():
    """The retracting build gives every request room (no preempts_only_when_needed); the
    aborting one presses on the pool. Both have the state group."""
    assert "preempts_only_when_needed" not in load_adapter("tokenspeed").capabilities
    assert "preempts_only_when_needed" in load_adapter("tokenspeed-aborts").capabilities
    assert all("state_group" in load_adapter(name).capabilities for name in ("tokenspeed", "tokenspeed-aborts"))


def test_every_entry_is_complete():
    known = set(load_clauses())
    for divergence in KNOWN_DIVERGENCES:
        assert set(divergence.clauses) <= known, divergence.id
        assert divergence.explanation and divergence.upstream and divergence.steered_by, divergence.id
        assert divergence.path.exists(), divergence.id
        assert divergence.steps and divergence.tier == "scheduler", divergence.id
    assert len({d.id for d in KNOWN_DIVERGENCES}) == len(KNOWN_DIVERGENCES)
