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
-m kvspec` to run only them. Each item carries the marker `kvspec(tier=..., **config)`,
made from its planned run (kvspec.conformance.runs.plan), so a run can be narrowed to a
tier, a configuration, a memory model or the runs with recurrent state:

    -m "kvspec(tier='allocator')"        the allocator tier only
    -m "kvspec(tier='engine', P=4)"      engine runs at page size 4
    -m "kvspec(state=True)"              the runs with recurrent state
    -m "kvspec(model='block-pool')"      the runs of the shared block pool
    -k engine                            the same words also match with -k

What the adapter does not offer (a tier, a capability) becomes a skipped item such as
`kvspec[lacks engine tier]` (marker `kvspec(lacks=...)`), so `-rs` lists what was not
checked.

Each item runs through the same runner as `kvspec check` (kvspec.conformance.runs.runner),
in pytest's own process (pytest-timeout is the usual answer to an implementation that
hangs). A violation fails its item; the report names the broken clause (`[I2] ...`),
lists the shrunk steps, and saves them as a trace (`--kvspec-traces`, default
kvspec-traces) that `kvspec replay` reproduces; a crash also shows the implementation's
own traceback. `--kvspec-seed` fixes Hypothesis' seed, so a failure seen in CI replays on
your machine with the same command line.

Without `--kvspec-adapter` the plugin does nothing: it is loaded in every pytest
session once kvspec is installed (`-p no:kvspec` unloads it), so it adds options and
nothing else.
"""

from __future__ import annotations

import pytest


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
    group.addoption("--kvspec-traces", metavar="DIR", default="kvspec-traces",
                    help="where counterexample traces are saved (default: kvspec-traces)")


def pytest_configure(config: pytest.Config) -> None:
    adapter_spec = config.getoption("kvspec_adapter")
    if adapter_spec is None:
        return  # installed everywhere: stay out of sessions that did not ask for kvspec
    # Imported only now, so that a session without the option never pays for (or
    # trips over) the conformance machinery.
    import argparse

    from kvspec.conformance.harness.outputs import output_directory
    from kvspec.conformance.harness.profiles import profile, shrink_budget
    from kvspec.conformance.harness.protocol import AdapterError, load_adapter
    from kvspec.conformance.runs.plan import plan

    # Refused here, before any collection or xdist worker starts, so that a wrong
    # adapter or profile is one usage error line and not one traceback per worker.
    try:
        adapter = load_adapter(adapter_spec)
        the_plan = plan(adapter.declaration)
    except AdapterError as error:
        raise pytest.UsageError(f"--kvspec-adapter: {error}") from None
    profile_name = config.getoption("kvspec_profile")
    try:
        profile(profile_name)
    except ValueError as error:
        raise pytest.UsageError(f"--kvspec-profile: {error}") from None
    shrink_seconds = config.getoption("kvspec_shrink_seconds")
    if shrink_seconds is not None and not 0 < shrink_seconds < float("inf"):
        raise pytest.UsageError(f"--kvspec-shrink-seconds: {shrink_seconds:g} is not a positive number of seconds")
    try:
        traces = output_directory(config.getoption("kvspec_traces"))
    except argparse.ArgumentTypeError as error:
        raise pytest.UsageError(f"--kvspec-traces: {error}") from None
    config.addinivalue_line(
        "markers", "kvspec(tier, **config): a kvspec conformance run (added by --kvspec-adapter)")
    config.pluginmanager.register(
        ConformanceRuns(adapter_spec, adapter, the_plan, profile_name, config.getoption("kvspec_seed"),
                        shrink_seconds or shrink_budget(profile_name), traces),
        "kvspec-conformance-runs")


class ConformanceRuns:
    """The hooks that exist only in a session given --kvspec-adapter."""

    def __init__(self, adapter_spec, adapter, the_plan, profile_name, seed, shrink_seconds, traces):
        self.adapter_spec = adapter_spec
        self.adapter = adapter
        self.plan = the_plan
        self.profile_name = profile_name
        self.seed = seed
        self.shrink_seconds = shrink_seconds
        self.traces = traces

    def pytest_report_header(self) -> str:
        seed = "random" if self.seed is None else self.seed
        return (f"kvspec: adapter {self.adapter_spec} ({self.adapter.name}, policy "
                f"{self.adapter.policy_version}), profile {self.profile_name}, seed {seed}, "
                f"shrinking for at most {self.shrink_seconds:g} s")

    # tryfirst: the runs must be in the list before -k, -m and --deselect filter it.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        # On a pytest-xdist worker this runs once per worker; the ids depend only on
        # the adapter's declaration, so every worker collects the same list, as xdist requires.
        # genitems sends the suite through the ordinary collection hooks, so the
        # items are counted, reported and shown by --collect-only like any others.
        suite = ConformanceSuite.from_parent(session, name="kvspec", nodeid="kvspec", runs=self)
        items.extend(session.genitems(suite))


class ConformanceSuite(pytest.Collector):
    """Every planned run of one adapter, like the rows of `kvspec check`."""

    def __init__(self, *, runs: ConformanceRuns, **kwargs):
        super().__init__(**kwargs)
        self.runs = runs

    def collect(self):
        for planned in self.runs.plan.runs:
            item = ConformanceRun.from_parent(self, name=f"kvspec[{planned.label}]", nodeid=f"kvspec[{planned.label}]",
                                              planned=planned, runs=self.runs)
            item.add_marker(pytest.mark.kvspec(**planned.markers))
            yield item
        # What the adapter lacks is reported as skipped, never silently absent, so that a
        # green run says which parts of the spec it did not check.
        for skipped in self.runs.plan.skipped:
            name = f"kvspec[lacks {skipped.what}]"
            item = LeftOut.from_parent(self, name=name, nodeid=name, reason=skipped.why)
            item.add_marker(pytest.mark.kvspec(lacks=skipped.what))
            # A skip marker rather than pytest.skip() alone: the summary line then points
            # at the item, not at a line of this plugin.
            item.add_marker(pytest.mark.skip(reason=skipped.why))
            yield item


class ConformanceFailure(Exception):
    """A planned run that did not pass: its result's verdict, message and trace."""

    def __init__(self, result, adapter_spec: str):
        self.result = result
        lines = [result.message or result.verdict]
        if result.trace:
            from kvspec.conformance.harness.trace import load

            lines += ["", f"shrunk steps ({result.trace_steps}), saved as {result.trace}:",
                      *(f"  {step}" for step in load(result.trace).steps),
                      f"replay: kvspec replay {result.trace} --adapter {result.replay_adapter or adapter_spec}"]
        if result.cause:
            lines += ["", "The implementation raised:", result.cause.rstrip()]
        super().__init__("\n".join(lines))


class ConformanceRun(pytest.Item):
    """One planned run, through the runner of `kvspec check`."""

    def __init__(self, *, planned, runs: ConformanceRuns, **kwargs):
        super().__init__(**kwargs)
        self.planned = planned
        self.runs = runs

    def runtest(self) -> None:
        from kvspec.conformance.runs.runner import Job, check_job

        runs = self.runs
        result = check_job(Job(runs.adapter_spec, self.planned, runs.profile_name, runs.seed, runs.traces,
                               shrink_seconds=runs.shrink_seconds, adapter_name=runs.adapter.name))
        if result.verdict != "ok":
            raise ConformanceFailure(result, runs.adapter_spec)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            # the verdict, the shrunk steps, the trace and the implementation's own traceback:
            # the runner's and Hypothesis' frames around them would not help an implementer
            return str(excinfo.value)
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
