"""`kvspec diff-helpers --adapter X`: CrossHair compares an adapter's own versions of the
spec's pure helpers with the spec's, input by input.

An adapter may expose its helpers:

    helpers = {
        "pages.ceil_page": my_engine.paging.ceil_page,            # a module-level function
        "window.eviction_frontier": "my_adapter:eviction_frontier",  # or "module:function"
    }

Each key names a helper of kvspec.spec by module and function (SPEC_MODULES below); each
value is the adapter's own function, importable at module level, taking the spec
helper's parameters in the same order (compared by position) and returning what the spec
returns (the spec's dataclasses, e.g. kvspec.spec.window.WindowEviction, where it returns
one). For every pair `crosshair diffbehavior` runs in a subprocess (a hang is cut off at
--helper-timeout and the run goes on) and searches for an input on which the two differ.
Only inputs that meet the spec helper's PEP 316 preconditions (its `pre:` lines) are
compared: diffbehavior itself ignores preconditions, and outside them the spec says
nothing, so an adapter may raise or return anything there.

"same" is what CrossHair could show within its budget: "all paths exhausted" is as close
to a proof as it gets; "no difference in N iterations" is a bounded search.

An adapter without `helpers` is not an error: there is nothing to compare, the command
says so and exits 0. Exit status: 0 every exposed helper behaves the same, 1 some helper
differs (the counterexample is printed), 2 the adapter or its `helpers` mapping is
unusable (an AdapterError saying how to fix it), or some helper could not be compared
(CrossHair failed, timed out, or found the helper nondeterministic; see its row).
"""

import ast
import dataclasses
import difflib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Mapping
from typing import Any

from ..harness.protocol import AdapterError, load_adapter

SPEC_MODULES = ("pages", "allocator", "window", "lifecycle")
"""The kvspec.spec modules whose module-level functions an adapter may expose."""

PRECONDITION_NOT_MET = "<outside the spec helper's preconditions: not compared>"
"""What both sides return for an input the spec helper's preconditions exclude."""

DEFAULT_PER_CONDITION_TIMEOUT = 10.0


# --- the spec's helpers and the adapter's mapping ---------------------------------------

def spec_helpers() -> dict[str, Callable]:
    """Every helper an adapter may expose, by its name within kvspec.spec ("pages.ceil_page")."""
    helpers = {}
    for module_name in SPEC_MODULES:
        module = importlib.import_module(f"kvspec.spec.{module_name}")
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_"):
                helpers[f"{module_name}.{name}"] = value
    return helpers


def preconditions(function: Callable) -> list[str]:
    """The `pre:` expressions of a PEP 316 docstring, one per line."""
    lines = (line.strip() for line in (function.__doc__ or "").splitlines())
    return [line[len("pre:"):].strip() for line in lines if line.startswith("pre:")]


@dataclasses.dataclass(frozen=True)
class HelperPair:
    """A spec helper and the adapter's version of it."""

    helper: str
    """The spec helper's name within kvspec.spec, e.g. "pages.ceil_page"."""
    target: str
    """The adapter's function as "module:qualname", importable in a fresh interpreter."""
    note: str = ""
    """Something the user should know about the pair (parameter names that differ)."""


def import_target(target: str) -> Any:
    """The object a "module:qualname" string names."""
    module_name, _, qualname = target.partition(":")
    value = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def describe_parameters(signature: inspect.Signature) -> str:
    return "(" + ", ".join(signature.parameters) + ")"


def check_pair(helper: str, value: Any, known: dict[str, Callable]) -> HelperPair | str:
    """The pair, or a sentence saying what is wrong with one entry and how to fix it."""
    where = f"helpers[{helper!r}]"
    if not isinstance(helper, str) or helper not in known:
        suggestions = difflib.get_close_matches(str(helper), known, n=3, cutoff=0.5)
        suggestions += [name for name in known if name.endswith(f".{helper}") and name not in suggestions]
        if suggestions:
            return f"{where}: kvspec.spec has no helper {helper!r}; did you mean {' or '.join(suggestions)}?"
        return (f"{where}: kvspec.spec has no helper {helper!r}; keys are module.function within "
                f"kvspec.spec, one of: {', '.join(known)}")
    if isinstance(value, str):
        if ":" not in value:
            return f"{where}: {value!r} is not \"module:function\"; write it as e.g. \"my_adapter:{helper.split('.')[1]}\""
        try:
            function = import_target(value)
        except AttributeError as error:
            return f"{where}: cannot find {value!r} ({error}); name a function its module defines"
        except Exception as error:  # noqa: BLE001 (whatever the adapter's module raises on import)
            return f"{where}: cannot import {value!r} ({type(error).__name__}: {error}); is it on PYTHONPATH?"
        target = value
    else:
        function = value
        target = None
    if not callable(function):
        return f"{where}: {function!r} is not callable; map the name to your own function (or \"module:function\")"
    if not inspect.isfunction(function):
        return (f"{where}: {function!r} is not a plain function; CrossHair imports the adapter's helper "
                f"by name in a fresh interpreter, so wrap it in a module-level `def`")
    if target is None:
        target = f"{function.__module__}:{function.__qualname__}"
        try:
            importable = import_target(target) is function
        except (ImportError, AttributeError):
            importable = False
        if not importable:
            return (f"{where}: {function.__qualname__} (in {function.__module__}) cannot be imported by name; "
                    f"CrossHair loads the adapter's helper in a fresh interpreter, so define it with `def` "
                    f"at module level (not a lambda or a nested function)")
    spec_signature = inspect.signature(known[helper])
    signature = inspect.signature(function)
    try:
        signature.bind(*spec_signature.parameters)
    except TypeError as error:
        return (f"{where}: {target}{describe_parameters(signature)} cannot be called like the spec's "
                f"{helper}{describe_parameters(spec_signature)} ({error}); take the same parameters, in the same order")
    note = ""
    theirs = list(signature.parameters)[:len(spec_signature.parameters)]
    if theirs != list(spec_signature.parameters):
        note = (f"parameters {describe_parameters(signature)} are named unlike the spec's "
                f"{describe_parameters(spec_signature)}; compared by position")
    return HelperPair(helper, target, note)


def validate_helpers(helpers: Any, adapter: str) -> list[HelperPair]:
    """The pairs of an adapter's `helpers` mapping; AdapterError listing every problem."""
    if not isinstance(helpers, Mapping):
        raise AdapterError(f"adapter {adapter!r}: `helpers` must be a mapping from a spec helper name "
                           f"(e.g. \"pages.ceil_page\") to your function (got {type(helpers).__name__})")
    known = spec_helpers()
    checked = [check_pair(helper, value, known) for helper, value in helpers.items()]
    problems = [entry for entry in checked if isinstance(entry, str)]
    if problems:
        raise AdapterError(f"adapter {adapter!r}: its `helpers` mapping is not usable:\n  - "
                           + "\n  - ".join(problems))
    return checked


def adapter_helpers(spec: str) -> Any:
    """The adapter's `helpers` attribute (None when it has none), after the protocol's
    own validation of the adapter."""
    adapter = load_adapter(spec)
    helpers = getattr(adapter, "helpers", None)
    if helpers is None:
        # The loaded Adapter record may not carry it: read the object the spec names.
        from ..harness import protocol

        helpers = getattr(protocol.resolve(spec), "helpers", None)
    return helpers


# --- the two sides CrossHair compares (built in the subprocess) -------------------------

def conjuncts(expressions: list[str]) -> list[str]:
    """The preconditions as a list of single comparisons: `a and b` and `a <= b <= c`
    split into their parts (the same condition, for the pure expressions of a contract)."""
    parts = []

    def split(node: ast.expr) -> None:
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for value in node.values:
                split(value)
        elif isinstance(node, ast.Compare) and len(node.ops) > 1:
            operands = [node.left, *node.comparators]
            for left, op, right in zip(operands, node.ops, operands[1:]):
                parts.append(ast.unparse(ast.Compare(left, [op], [right])))
        else:
            parts.append(ast.unparse(node))

    for expression in expressions:
        split(ast.parse(expression, mode="eval").body)
    return parts


def prefer_true(condition: Any) -> bool:
    """A precondition's truth, with CrossHair told to try to make it hold: left to its
    usual branch choices, a search that must satisfy a dozen comparisons at once (a
    frontier's page alignments, its policy version) almost never gets past them. This is
    what `crosshair check` does with each `pre:` line; here each comparison gets it."""
    try:
        from crosshair.statespace import prefer_true as crosshair_prefer_true
        from crosshair.tracers import NoTracing, is_tracing
    except ImportError:  # another CrossHair: it explores as it will
        return bool(condition)
    if not is_tracing():  # called outside an analysis
        return bool(condition)
    with NoTracing():
        return bool(crosshair_prefer_true(condition))


def paired(helper: str, target: str) -> tuple[Callable, Callable]:
    """Two functions with the spec helper's signature: the spec's helper and the adapter's,
    each called only on inputs that meet the spec helper's preconditions. CrossHair reads
    their signatures to make symbolic arguments."""
    spec_function = spec_helpers()[helper]
    adapter_function = import_target(target)
    signature = inspect.signature(spec_function)
    conditions = [compile(text, f"<precondition of {helper}>", "eval")
                  for text in conjuncts(preconditions(spec_function))]
    spec_globals = spec_function.__globals__
    names = list(signature.parameters)

    def in_domain(args: tuple, kwargs: dict) -> dict | None:
        if kwargs or len(args) != len(names):  # CrossHair passes every argument by position
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = tuple(bound.arguments.values())
        arguments = dict(zip(names, args))
        for condition in conditions:
            try:
                met = prefer_true(eval(condition, spec_globals, dict(arguments)))
            except (ArithmeticError, TypeError, ValueError):  # one that cannot be evaluated is not met
                met = False
            if not met:
                return None
        return arguments

    def spec(*args, **kwargs):
        arguments = in_domain(args, kwargs)
        if arguments is None:
            return PRECONDITION_NOT_MET
        spec.inputs_compared += 1
        return spec_function(*arguments.values())

    def adapter(*args, **kwargs):
        arguments = in_domain(args, kwargs)
        return PRECONDITION_NOT_MET if arguments is None else adapter_function(*arguments.values())

    annotations = typing.get_type_hints(spec_function)
    for side in (spec, adapter):
        side.__signature__ = signature
        side.__annotations__ = dict(annotations)
    spec.inputs_compared = 0  # a search that never got inside the preconditions compared nothing
    return spec, adapter


PAIR_MODULE = """\
# Written by kvspec diff-helpers: `crosshair diffbehavior` compares `spec` with `adapter`.
import atexit
import sys

from kvspec.conformance.review.diff_helpers import paired

spec, adapter = paired({helper!r}, {target!r})
atexit.register(lambda: print(f"{COMPARED_MARK}{{spec.inputs_compared}}", file=sys.stderr))
"""
COMPARED_MARK = "kvspec diff-helpers: inputs inside the preconditions: "


# --- running CrossHair and reading what it says ----------------------------------------

@dataclasses.dataclass
class Outcome:
    """What CrossHair found for one pair."""

    helper: str
    target: str
    verdict: str  # "same", "DIFFERENT" or "error"
    seconds: float
    detail: str = ""
    """same: how far the search went; error: why there is no verdict."""
    counterexamples: list[dict[str, str]] = dataclasses.field(default_factory=list)
    """Per input found: {"given": the arguments, "spec": ..., "adapter": ...} (returns/raises)."""
    crosshair_output: str = ""


GIVEN = re.compile(r"^Given: \((.*)\),$")
SIDE = re.compile(r"^\s*\S+\.(spec|adapter) : (.*)$")


def counterexamples(stdout: str) -> list[dict[str, str]]:
    """The inputs `crosshair diffbehavior` printed, with what each side did:
        Given: (x=0, page_size=1),
          kvspec_diff_pages_ceil_page.spec : returns 0
          kvspec_diff_pages_ceil_page.adapter : returns 1
    """
    found = []
    for line in stdout.splitlines():
        given, side = GIVEN.match(line), SIDE.match(line)
        if given:
            found.append({"given": given[1]})
        elif side and found:
            found[-1][side[1]] = side[2]
    return found


def crosshair_options(args) -> list[str]:
    """CrossHair's budget per helper: the CPU seconds given, or the iterations given, or
    DEFAULT_PER_CONDITION_TIMEOUT seconds."""
    options = []
    if args.per_condition_timeout is not None or args.max_uninteresting_iterations is None:
        options.append(f"--per_condition_timeout={args.per_condition_timeout or DEFAULT_PER_CONDITION_TIMEOUT:g}")
    if args.max_uninteresting_iterations is not None:
        options.append(f"--max_uninteresting_iterations={args.max_uninteresting_iterations}")
    return options


def helper_timeout(args) -> float:
    """The wall-clock limit of one subprocess: CrossHair's own budget is CPU time, and a
    hanging helper (or solver) must not hang the run."""
    if args.helper_timeout is not None:
        return args.helper_timeout
    if args.per_condition_timeout is None and args.max_uninteresting_iterations is not None:
        return 600
    return 3 * (args.per_condition_timeout or DEFAULT_PER_CONDITION_TIMEOUT) + 60


def diff_pair(pair: HelperPair, args, workdir: str) -> Outcome:
    """Run `crosshair diffbehavior` on one pair in a subprocess and read its verdict."""
    module = "kvspec_diff_" + pair.helper.replace(".", "_")
    with open(os.path.join(workdir, f"{module}.py"), "w") as file:
        file.write(PAIR_MODULE.format(helper=pair.helper, target=pair.target, COMPARED_MARK=COMPARED_MARK))
    # The child sees what this process sees (an adapter found through its sys.path too).
    path = [workdir, *(entry or os.getcwd() for entry in sys.path)]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    command = [sys.executable, "-m", "crosshair", "diffbehavior", *crosshair_options(args),
               f"{module}.spec", f"{module}.adapter"]
    started = time.perf_counter()
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, env=environment, cwd=workdir,
                                timeout=helper_timeout(args))
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or b""  # bytes, whatever `text` says
        output = output.decode(errors="replace") if isinstance(output, bytes) else output
        return Outcome(pair.helper, pair.target, "error", time.perf_counter() - started,
                       f"timed out after {helper_timeout(args):.0f} s (a hanging helper? raise --helper-timeout)",
                       crosshair_output=output)
    seconds = time.perf_counter() - started
    output = result.stdout + result.stderr
    found = counterexamples(result.stdout)
    compared = re.search(re.escape(COMPARED_MARK) + r"(\d+)", result.stderr)
    if result.returncode == 0 and compared and compared[1] == "0":
        return Outcome(pair.helper, pair.target, "error", seconds,
                       "CrossHair found no input that meets the spec helper's preconditions, so compared "
                       "nothing; raise --per-condition-timeout", crosshair_output=output)
    if result.returncode == 0:
        iterations = re.search(r"attempted (\d+) iterations", result.stdout)
        detail = ("all paths exhausted" if "All paths exhausted" in result.stdout
                  else f"no difference in {iterations[1] if iterations else '?'} iterations")
        if compared:
            detail += f", {compared[1]} inside the preconditions"
        return Outcome(pair.helper, pair.target, "same", seconds, detail, crosshair_output=output)
    if result.returncode == 1 and found:
        return Outcome(pair.helper, pair.target, "DIFFERENT", seconds, "", found, output)
    # Exit 2 is an import failure or nondeterminism; 1 without a difference, a crash.
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    reason = lines[-1] if lines else f"crosshair exited {result.returncode}"
    if "nondetermin" in output.lower():
        reason = "the helper is nondeterministic (the same input gave different results): " + reason
    return Outcome(pair.helper, pair.target, "error", seconds, reason, found, output)


# --- the command -----------------------------------------------------------------------

def describe(counterexample: dict[str, str]) -> str:
    return (f"given ({counterexample['given']}): spec {counterexample.get('spec', '?')}, "
            f"adapter {counterexample.get('adapter', '?')}")


def print_table(outcomes: list[Outcome]) -> None:
    width = max([len("helper")] + [len(outcome.helper) for outcome in outcomes])
    print(f"{'helper':<{width}}  {'verdict':<9}  {'seconds':>7}  counterexample / detail")
    for outcome in outcomes:
        detail = f"({outcome.counterexamples[0]['given']})" if outcome.verdict == "DIFFERENT" else outcome.detail
        print(f"{outcome.helper:<{width}}  {outcome.verdict:<9}  {outcome.seconds:>7.1f}  {detail}")


def exit_status(outcomes: list[Outcome]) -> int:
    verdicts = {outcome.verdict for outcome in outcomes}
    return 1 if "DIFFERENT" in verdicts else 2 if "error" in verdicts else 0


def write_json(path: str, adapter: str, outcomes: list[Outcome], status: int, args) -> None:
    report = {"command": "diff-helpers", "adapter": adapter, "exit_status": status,
              "crosshair_options": crosshair_options(args),
              "helpers": [dataclasses.asdict(outcome) for outcome in outcomes]}
    with open(path, "w") as file:
        json.dump(report, file, indent=2)


def run(args) -> int:
    """`kvspec diff-helpers`; raises AdapterError (exit 2) for an unusable adapter or mapping."""
    helpers = adapter_helpers(args.adapter)
    if helpers is None:
        print(f"kvspec diff-helpers: adapter {args.adapter} exposes no helpers: nothing to compare. "
              f"To compare your own versions of the spec's helpers, give the adapter a `helpers` mapping, "
              f"e.g. {{\"pages.ceil_page\": my_ceil_page}} (see kvspec.conformance.review.diff_helpers).")
        if args.json:
            write_json(args.json, args.adapter, [], 0, args)
        return 0
    pairs = validate_helpers(helpers, args.adapter)
    if args.helper:
        unknown = sorted(set(args.helper) - {pair.helper for pair in pairs})
        if unknown:
            raise AdapterError(f"adapter {args.adapter!r} does not expose {', '.join(unknown)}; "
                               f"it exposes {', '.join(pair.helper for pair in pairs) or 'none'}")
        pairs = [pair for pair in pairs if pair.helper in args.helper]
    print(f"kvspec diff-helpers: adapter {args.adapter}, {len(pairs)} helper(s), "
          f"crosshair diffbehavior {' '.join(crosshair_options(args))}", flush=True)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="kvspec-diff-helpers-") as workdir:
        for index, pair in enumerate(pairs, 1):
            print(f"[{index}/{len(pairs)}] {pair.helper} vs {pair.target} ...", end=" ", flush=True)
            outcome = diff_pair(pair, args, workdir)
            print(f"{outcome.verdict} ({outcome.seconds:.1f} s)", flush=True)
            if pair.note:
                print(f"      note: {pair.note}")
            outcomes.append(outcome)
    print()
    print_table(outcomes)
    for outcome in outcomes:
        if outcome.verdict == "DIFFERENT":
            print(f"\n{outcome.helper} differs from kvspec.spec.{outcome.helper} ({outcome.target}):")
            for counterexample in outcome.counterexamples:
                print(f"  {describe(counterexample)}")
        elif outcome.verdict == "error":
            print(f"\n{outcome.helper}: could not compare: {outcome.detail}")
            if args.verbose:
                print(outcome.crosshair_output)
    status = exit_status(outcomes)
    if args.json:
        write_json(args.json, args.adapter, outcomes, status, args)
    return status


def add_command(subparsers) -> Any:
    """Register `diff-helpers` on the CLI's subparsers; `args.func(args)` runs it."""
    parser = subparsers.add_parser(
        "diff-helpers", help="compare an adapter's own pure helpers with the spec's (crosshair diffbehavior)",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", default="reference", help="adapter name or module:attribute (default: reference)")
    parser.add_argument("--helper", action="append", metavar="NAME",
                        help="compare only this spec helper, e.g. pages.ceil_page (repeatable)")
    parser.add_argument("--per-condition-timeout", type=float, metavar="SECONDS",
                        help=f"CrossHair's CPU-time budget per helper (default {DEFAULT_PER_CONDITION_TIMEOUT:g}, "
                             f"unless only --max-uninteresting-iterations is given)")
    parser.add_argument("--max-uninteresting-iterations", type=int, metavar="N",
                        help="stop a helper's search after N iterations without new coverage (CrossHair's option)")
    parser.add_argument("--helper-timeout", type=float, metavar="SECONDS",
                        help="wall-clock limit per helper, after which it is an error "
                             "(default: 3 x the CPU budget + 60, or 600 with iterations alone)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="print CrossHair's output for helpers it could not compare")
    parser.set_defaults(func=run)
    return parser
