"""The pytest plugin: `pytest --kvspec-adapter=X` runs the conformance suite as test items.

Each test runs pytest inside pytest (the `pytester` fixture) on an empty directory, as an
implementer's CI would, and selects one or two machines with `-m` to stay quick.
"""

import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest

# kvspec.adapters.reference is imported before pytester snapshots sys.modules, so that
# its in-process runs share it: pytester drops what a run imported, and torch cannot be
# imported a second time.
import kvspec.adapters.reference  # noqa: F401

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent


def plugin_arguments() -> tuple[str, ...]:
    """Load the plugin by module until kvspec's pytest11 entry point loads it: loading it
    both ways is an error ("Plugin already registered under a different name")."""
    if entry_points(group="pytest11", name="kvspec") and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return ()
    return ("-p", "kvspec.conformance.pytest_plugin")


PLUGIN = plugin_arguments()
# One run of each tier, so that both kinds of item run without running all ten.
ONE_PER_TIER = ("-m", "kvspec(tier='allocator', P=4) or kvspec(tier='engine', P=4, W=6, state=False, "
                      "model='two-pool')")
QUICK = ("--kvspec-profile=quick", "--kvspec-seed=1")


def test_without_the_option_the_plugin_adds_nothing(pytester):
    pytester.makepyfile(test_own="def test_own():\n    pass\n")
    result = pytester.runpytest(*PLUGIN, "-v")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("kvspec: adapter*")
    result.stdout.no_fnmatch_line("*kvspec[[]*")
    markers = pytester.runpytest(*PLUGIN, "--markers")
    assert "@pytest.mark.kvspec" not in markers.stdout.str()


def test_the_reference_passes_one_item_per_machine(pytester):
    collected = pytester.runpytest(*PLUGIN, "--kvspec-adapter=reference", "--collect-only", "-q")
    collected.stdout.fnmatch_lines(["kvspec[[]allocator P=1]", "kvspec[[]engine P=4 W=6 I=4]"])
    result = pytester.runpytest(*PLUGIN, "--kvspec-adapter=reference", *QUICK, *ONE_PER_TIER, "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["kvspec: adapter reference *profile quick, seed 1, shrinking for at most 30 s",
                                 "kvspec[[]allocator P=4] PASSED*", "kvspec[[]engine P=4 W=6 I=4] PASSED*"])


def test_a_leaky_adapter_fails_naming_the_clause_and_the_shrunk_calls(pytester, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    # Shrinking for 5 s, not the quick profile's 30 (unbounded, as the plugin once was, 2-3 min)
    result = pytester.runpytest(*PLUGIN, "--kvspec-adapter=sample_adapters:LEAKY", *QUICK, "-rfs",
                                "--kvspec-shrink-seconds=5", "-m", "kvspec(P=1) or kvspec(lacks='engine tier')")
    result.assert_outcomes(failed=1, skipped=1)
    # the same runner as kvspec check: the shrunk steps, saved as a trace that kvspec replay reproduces
    result.stdout.fnmatch_lines(["*[[]I2] full pool*leaked pages*", "shrunk steps (*), saved as *kvspec-traces/*.jsonl:",
                                 "  free_sequence(*", "replay: kvspec replay *--adapter sample_adapters:LEAKY",
                                 "FAILED kvspec[[]allocator P=1] - *[[]I2]*"])
    assert list((pytester.path / "kvspec-traces").glob("*.jsonl"))
    # LEAKY has no engine tier: reported as skipped, never as passed.
    result.stdout.fnmatch_lines(["SKIPPED [[]1] *: adapter has no engine tier"])
    # The suite's own stack would not help an implementer: only the clause and the calls.
    assert "Traceback" not in result.stdout.str() and "hypothesis/core.py" not in result.stdout.str()


def test_a_crash_in_the_implementation_shows_its_own_traceback(pytester):
    pytester.makepyfile(crashing='''
        from kvspec.adapters.reference import ReferenceAllocatorAdapter

        class CrashingAllocatorAdapter(ReferenceAllocatorAdapter):
            def alloc_extend(self, *args):
                raise RuntimeError("the engine's own bug")

        class CRASHING:
            name = "crashing"
            policy_version = "sglang-0.5.23"
            capabilities = ("page_size_1",)
            make_allocator = CrashingAllocatorAdapter
    ''')
    result = pytester.runpytest(*PLUGIN, "--kvspec-adapter=crashing:CRASHING", *QUICK, "-m", "kvspec(P=1)")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*alloc_extend(*", "*crashing.py*", "*RuntimeError: the engine's own bug*"])
    assert "hypothesis/core.py" not in result.stdout.str()


def test_an_adapter_that_cannot_build_fails_with_its_message(pytester):
    pytester.makepyfile(incomplete='''
        class IncompleteAllocator:
            def __init__(self, size_full, size_swa, page_size):
                pass

        class INCOMPLETE:
            name = "incomplete"
            policy_version = "sglang-0.5.23"
            capabilities = ("page_size_1",)
            make_allocator = IncompleteAllocator
    ''')
    result = pytester.runpytest(*PLUGIN, "--kvspec-adapter=incomplete:INCOMPLETE", *QUICK, "-m", "kvspec(P=1)")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*its allocator lacks state, available_sizes, alloc*"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("option, message", [
    ("--kvspec-adapter=no-such-engine", "*--kvspec-adapter: unknown adapter 'no-such-engine'*"),
    ("--kvspec-adapter=no_such_module:ADAPTER", "*cannot import module 'no_such_module'*"),
])
def test_an_unknown_adapter_is_a_usage_error(pytester, option, message):
    result = pytester.runpytest(*PLUGIN, option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()


def test_an_unknown_profile_is_a_usage_error(pytester):
    result = pytester.runpytest(*PLUGIN, "--kvspec-adapter=reference", "--kvspec-profile=forever")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kvspec-profile: unknown profile 'forever'*"])


def test_xdist_workers_collect_the_same_items_and_share_them(pytester):
    pytest.importorskip("xdist")
    two = ("-m", "kvspec(tier='allocator', P=4) or kvspec(tier='allocator', P=16)")  # the quickest
    result = pytester.runpytest_subprocess("-n", "2", *PLUGIN, "--kvspec-adapter=reference", *QUICK, *two, "-v")
    result.assert_outcomes(passed=2)
    # Two items on two workers: xdist hands one to each, which it does only when every
    # worker collected the same ids.
    output = result.stdout.str()
    assert "[gw0]" in output and "[gw1]" in output
    result.stdout.fnmatch_lines_random(["*PASSED kvspec[[]allocator P=4]*", "*PASSED kvspec[[]allocator P=16]*"])


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-1"])
def test_a_shrink_budget_that_is_no_positive_number_is_a_usage_error(pytester, value):
    result = pytester.runpytest(*PLUGIN, "--kvspec-adapter=reference", f"--kvspec-shrink-seconds={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kvspec-shrink-seconds: * is not a positive number of seconds*"])
