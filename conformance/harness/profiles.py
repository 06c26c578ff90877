"""kvspec's own Hypothesis settings profiles, so a run means the same everywhere
(CI=true would otherwise make Hypothesis load its own `ci` profile)."""

from contextlib import contextmanager

from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture import engine as hypothesis_engine
from hypothesis.reporting import default as hypothesis_report
from hypothesis.reporting import with_reporter

PROFILES = {
    # name: (examples per state machine, steps per example, shrink budget in seconds)
    "quick": (60, 30, 30),
    "ci": (300, 50, 60),
    "deep": (5000, 100, 300),
}
"""The shrink budget bounds the time from a run's first counterexample to its end: a
counterexample is found in seconds, and Hypothesis' own limit (300 s) let one run of a quick
check shrink for minutes. Shrinking stops at the first example that ends past the budget,
or earlier where Hypothesis' shrinker is done: its own end (no smaller example found by
any of its passes), with no explain phase after it (below)."""

for _name, (_examples, _steps, _) in PROFILES.items():
    settings.register_profile(
        f"kvspec-{_name}",
        max_examples=_examples,
        stateful_step_count=_steps,
        report_multiple_bugs=False,  # one minimal counterexample per machine, found sooner
        # a run's seed decides its examples: Hypothesis' own `ci` profile, the default under
        # CI=true, derandomizes, which would make --seed (and the zoo's seeds) do nothing
        derandomize=False,
        deadline=None,  # the first call into torch or a real engine is slow; hangs are caught by the harness
        # no example database: it keys examples by machine class, the same for every adapter,
        # so one adapter's saved counterexample would be tried first on the next; a failure
        # is kept as a trace instead (kvspec replay)
        database=None,
        # no explain phase: once the shrinker is done, it runs the minimal example again with
        # each part replaced by random ones, long examples, only to annotate Hypothesis' own
        # report, which kvspec does not show (the counterexample is kept as a trace). It was
        # most of the shrinking time: a two-step counterexample of mutant-table-one-block-short,
        # found in 0.5 s and shrunk in 205 examples, ran until the 30 s budget; the quick check
        # of that mutant took 2 min 57 s, 23 s without it (the same traces; docs/checking.md)
        phases=[phase for phase in Phase if phase is not Phase.explain],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def profile(name: str) -> settings:
    """The settings of a kvspec profile: quick, ci or deep."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}")
    return settings.get_profile(f"kvspec-{name}")


def shrink_budget(name: str) -> float:
    """The seconds a run of this profile may spend shrinking a counterexample (PROFILES)."""
    profile(name)
    return float(PROFILES[name][2])


def unless_shrink_budget(message: object) -> None:
    """Hypothesis' reporter, less its warning when shrinking stops at MAX_SHRINKING_SECONDS:
    it says "more than five minutes" and asks for a bug report, whereas here the budget is
    ours, short on purpose, and the report says shrinking stopped at it."""
    if not str(message).startswith("WARNING: Hypothesis has spent more than five minutes"):
        hypothesis_report(message)


@contextmanager
def shrinking_within(seconds: float):
    """Hypothesis stops shrinking after `seconds` inside this block. It has no public
    setting for it: its engine reads a module global, restored on the way out."""
    own_limit = hypothesis_engine.MAX_SHRINKING_SECONDS
    hypothesis_engine.MAX_SHRINKING_SECONDS = seconds
    try:
        with with_reporter(unless_shrink_budget):
            yield
    finally:
        hypothesis_engine.MAX_SHRINKING_SECONDS = own_limit
