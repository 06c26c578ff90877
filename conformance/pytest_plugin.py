"""Run the kvspec conformance suite from pytest, in your own CI.

    pytest --kvspec-adapter=ADAPTER [--kvspec-profile=quick|ci|deep] [--kvspec-seed=N]
           [--kvspec-shrink-seconds=S] [-n auto]

ADAPTER is what `kvspec check --adapter` takes: a built-in name (`reference`), a name
registered under the `kvspec.adapters` entry-point group, or `module:attribute` (your
adapter module must be importable: installed, on PYTHONPATH, or in the directory you
run pytest from). No test file is needed: every state machine run that `kvspec check`
makes becomes one test item, named after it:

    kvspec[allocator P=4]
    kvspec[engine P=4 W=6 I=4]

so JUnit XML, `-x`, `--lf`, `--deselect` and pytest-xdist (`-n auto`) work as for any
other test. The items are added beside your own tests; run `pytest --kvspec-adapter=X
-m kvspec` to run only them. Each item carries the marker `kvspec(tier=..., **config)`
built from its label, so a run can be narrowed to a tier or a configuration:

    -m "kvspec(tier='allocator')"        the allocator tier only
    -m "kvspec(tier='engine', P=4)"      engine runs at page size 4
    -k engine                            the same words also match with -k

What the adapter does not offer (a tier, a capability) becomes a skipped item such as
`kvspec[lacks engine tier]` (marker `kvspec(lacks=...)`), so `-rs` lists what was not
checked.

A violation fails its item; the report names the broken clause (`[I2] ...`) and lists
the shrunk calls that reproduce it. `--kvspec-seed` fixes Hypothesis' seed, so a
failure seen in CI replays on your machine with the same command line.

Without `--kvspec-adapter` the plugin does nothing: it is loaded in every pytest
session once kvspec is installed (`-p no:kvspec` unloads it), so it adds options and
nothing else.
"""

from __future__ import annotations

import importlib
import traceback
from pathlib import Path

import pytest

# The one place that knows where the list of runs comes from: a module with
# `machines(adapter)` -> (label, state machine class) pairs and `skipped_runs(adapter)`
# -> {what is left out: why}.
RUNS_MODULE = "kvspec.conformance.runs.jobs"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "kvspec conformance suite")
    group.addoption("--kvspec-adapter", metavar="ADAPTER", default=None,
                    help="run the kvspec conformance state machines against ADAPTER "
                         "(a built-in name, an entry-point name, or module:attribute)")
    group.addoption("--kvspec-profile", metavar="PROFILE", default="quick",
                    help="how hard to search: quick, ci or deep (default: quick)")
    group.addoption("--kvspec-seed", metavar="N", type=int, default=None,
                    help="fix Hypothesis' seed, to reproduce a run")
    group.addoption("--kvspec-shrink-seconds", metavar="S", type=float, default=None,
                    help="stop shrinking a counterexample after S seconds (default: the profile's budget, "
                         "as kvspec check)")


def pytest_configure(config: pytest.Config) -> None:
    adapter_spec = config.getoption("kvspec_adapter")
    if adapter_spec is None:
        return  # installed everywhere: stay out of sessions that did not ask for kvspec
    # Imported only now, so that a session without the option never pays for (or
    # trips over) the conformance machinery.
    from kvspec.conformance.harness.profiles import profile, shrink_budget
    from kvspec.conformance.harness.protocol import AdapterError, load_adapter

    # Refused here, before any collection or xdist worker starts, so that a wrong
    # adapter or profile is one usage error line and not one traceback per worker.
    try:
        adapter = load_adapter(adapter_spec)
    except AdapterError as error:
        raise pytest.UsageError(f"--kvspec-adapter: {error}") from None
    profile_name = config.getoption("kvspec_profile")
    try:
        hypothesis_settings = profile(profile_name)
    except ValueError as error:
        raise pytest.UsageError(f"--kvspec-profile: {error}") from None
    shrink_seconds = config.getoption("kvspec_shrink_seconds")
    if shrink_seconds is not None and not 0 < shrink_seconds < float("inf"):
        raise pytest.UsageError(f"--kvspec-shrink-seconds: {shrink_seconds:g} is not a positive number of seconds")
    config.addinivalue_line(
        "markers", "kvspec(tier, **config): a kvspec conformance run (added by --kvspec-adapter)")
    config.pluginmanager.register(
        ConformanceRuns(adapter_spec, adapter, profile_name, hypothesis_settings,
                        config.getoption("kvspec_seed"), shrink_seconds or shrink_budget(profile_name)),
        "kvspec-conformance-runs")


class ConformanceRuns:
    """The hooks that exist only in a session given --kvspec-adapter."""

    def __init__(self, adapter_spec, adapter, profile_name, hypothesis_settings, seed, shrink_seconds):
        self.adapter_spec = adapter_spec
        self.shrink_seconds = shrink_seconds
        self.adapter = adapter
        self.profile_name = profile_name
        self.hypothesis_settings = hypothesis_settings
        self.seed = seed

    def pytest_report_header(self) -> str:
        seed = "random" if self.seed is None else self.seed
        return (f"kvspec: adapter {self.adapter_spec} ({self.adapter.name}, policy "
                f"{self.adapter.policy_version}), profile {self.profile_name}, seed {seed}, "
                f"shrinking for at most {self.shrink_seconds:g} s")

    # tryfirst: the runs must be in the list before -k, -m and --deselect filter it.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        # On a pytest-xdist worker this runs once per worker; the ids depend only on
        # the adapter's tiers, so every worker collects the same list, as xdist requires.
        # genitems sends the suite through the ordinary collection hooks, so the
        # items are counted, reported and shown by --collect-only like any others.
        suite = ConformanceSuite.from_parent(session, name="kvspec", nodeid="kvspec", runs=self)
        items.extend(session.genitems(suite))


class ConformanceSuite(pytest.Collector):
    """Every state machine run of one adapter, like the rows of `kvspec check`."""

    def __init__(self, *, runs: ConformanceRuns, **kwargs):
        super().__init__(**kwargs)
        self.runs = runs

    def collect(self):
        runs_module = importlib.import_module(RUNS_MODULE)
        for label, machine in runs_module.machines(self.runs.adapter):
            item = ConformanceRun.from_parent(self, name=f"kvspec[{label}]", nodeid=f"kvspec[{label}]",
                                              label=label, machine=machine, runs=self.runs)
            item.add_marker(pytest.mark.kvspec(**marker_arguments(label)))
            yield item
        # What the adapter lacks is reported as skipped, never silently absent, so that a
        # green run says which parts of the spec it did not check.
        for what, why in runs_module.skipped_runs(self.runs.adapter).items():
            name = f"kvspec[lacks {what}]"
            item = LeftOut.from_parent(self, name=name, nodeid=name, reason=why)
            item.add_marker(pytest.mark.kvspec(lacks=what))
            # A skip marker rather than pytest.skip() alone: the summary line then points
            # at the item, not at a line of this plugin.
            item.add_marker(pytest.mark.skip(reason=why))
            yield item


def marker_arguments(label: str) -> dict[str, object]:
    """`engine P=4 W=6 I=4` -> tier='engine', P=4, W=6, I=4 (for `-m "kvspec(...)"`)."""
    tier, *settings = label.split()
    arguments: dict[str, object] = {"tier": tier}
    for setting in settings:
        key, equals, value = setting.partition("=")
        if equals and key.isidentifier():
            arguments[key] = int(value) if value.isdigit() else value
    return arguments


class ConformanceRun(pytest.Item):
    """One state machine, searched with the chosen profile."""

    def __init__(self, *, label: str, machine, runs: ConformanceRuns, **kwargs):
        super().__init__(**kwargs)
        self.label = label
        self.machine = machine
        self.runs = runs

    def runtest(self) -> None:
        from hypothesis import seed, settings
        from hypothesis.stateful import run_state_machine_as_test

        from kvspec.conformance.harness.profiles import shrinking_within

        machine, run_settings = self.machine, self.runs.hypothesis_settings
        if self.runs.seed is not None:
            # On the class itself: run_state_machine_as_test reads the seed from the
            # factory it is given (a seed on machine.TestCase would be ignored).
            machine = seed(self.runs.seed)(machine)
            # Without the example database, as hypothesis.seed does for a test it seeds:
            # examples saved by earlier runs would make the same seed search differently.
            run_settings = settings(run_settings, database=None)
        with shrinking_within(self.runs.shrink_seconds):  # as kvspec check: the profile's budget
            run_state_machine_as_test(machine, settings=run_settings)

    def repr_failure(self, excinfo, style=None):
        from kvspec.conformance.harness.protocol import AdapterError

        error = excinfo.value
        if isinstance(error, AdapterError):
            # The adapter could not build its allocator or engine: its message says what
            # to fix, and a traceback through Hypothesis would only bury it.
            return f"{error}"
        if self.config.getoption("tbstyle") == "auto" and raised_by_the_harness(excinfo):
            # A violation the suite detected: the message names the clause and Hypothesis
            # attached the shrunk calls as notes. The stack (the suite's own check) would
            # not help an implementer; --tb=long still shows it.
            lines = [str(error), "", *getattr(error, "__notes__", [])]
            if error.__cause__ is not None:
                # The suite turned an exception of the implementation into a failure:
                # where that exception came from is what the implementer has to fix.
                lines += ["", "The implementation raised:",
                          "".join(traceback.format_exception(error.__cause__)).rstrip()]
            return "\n".join(lines)
        # The implementation raised on its own: its traceback is what an implementer
        # needs, without Hypothesis' frames around it.
        excinfo.traceback = excinfo.traceback.filter(lambda entry: not outside_the_implementation(entry))
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.name


class LeftOut(pytest.Item):
    """A tier or capability the adapter does not have: skipped, with the reason."""

    def __init__(self, *, reason: str, **kwargs):
        super().__init__(**kwargs)
        self.reason = reason

    def runtest(self) -> None:
        pytest.skip(self.reason)  # only reached without pytest's skipping plugin: never a pass

    def reportinfo(self):
        return self.path, 0, self.name  # a skip marker needs a line number


def raised_by_the_harness(excinfo) -> bool:
    """True when the exception comes from a kvspec check, not from the implementation."""
    if not isinstance(excinfo.value, AssertionError) or not excinfo.traceback:
        return False
    module = excinfo.traceback[-1].frame.f_globals.get("__name__", "")
    return module.startswith(("kvspec.conformance.", "kvspec.spec."))


def outside_the_implementation(entry) -> bool:
    """Frames of Hypothesis' engine and of this plugin, around every run."""
    import hypothesis

    path = Path(str(entry.path))
    return path == Path(__file__) or Path(hypothesis.__file__).parent in path.parents
