"""`kvspec diff-helpers --adapter X`: CrossHair compares an adapter's own versions of the
spec's pure helpers with the spec's, input by input.

An adapter may expose its helpers:

    helpers = {
        "pages.ceil_page": my_engine.paging.ceil_page,            # a module-level function
        "window.eviction_frontier": "my_adapter:eviction_frontier",  # or "module:function"
    }

Each key names a helper of kvspec.spec by module and function (helper_pairs.SPEC_MODULES); each
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

import dataclasses
import json
import tempfile
from typing import Any

from ..harness.outputs import output_file, write_text
from ..harness.protocol import AdapterError
from .crosshair_diff import DEFAULT_PER_CONDITION_TIMEOUT, HelperComparison, crosshair_options, diff_pair
from .helper_pairs import adapter_helpers, validate_helpers


def describe(counterexample: dict[str, str]) -> str:
    return (f"given ({counterexample['given']}): spec {counterexample.get('spec', '?')}, "
            f"adapter {counterexample.get('adapter', '?')}")


def print_table(comparisons: list[HelperComparison]) -> None:
    width = max([len("helper")] + [len(comparison.helper) for comparison in comparisons])
    print(f"{'helper':<{width}}  {'verdict':<9}  {'seconds':>7}  counterexample / detail")
    for comparison in comparisons:
        different = comparison.verdict == "DIFFERENT"
        detail = f"({comparison.counterexamples[0]['given']})" if different else comparison.detail
        print(f"{comparison.helper:<{width}}  {comparison.verdict:<9}  {comparison.seconds:>7.1f}  {detail}")


def exit_status(comparisons: list[HelperComparison]) -> int:
    verdicts = {comparison.verdict for comparison in comparisons}
    return 1 if "DIFFERENT" in verdicts else 2 if "error" in verdicts else 0


def write_json(path: str, adapter: str, comparisons: list[HelperComparison], status: int, args) -> None:
    report = {"command": "diff-helpers", "adapter": adapter, "exit_status": status,
              "crosshair_options": crosshair_options(args),
              "helpers": [dataclasses.asdict(comparison) for comparison in comparisons]}
    write_text(path, json.dumps(report, indent=2))


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
    comparisons = []
    with tempfile.TemporaryDirectory(prefix="kvspec-diff-helpers-") as workdir:
        for index, pair in enumerate(pairs, 1):
            print(f"[{index}/{len(pairs)}] {pair.helper} vs {pair.target} ...", end=" ", flush=True)
            comparison = diff_pair(pair, args, workdir)
            print(f"{comparison.verdict} ({comparison.seconds:.1f} s)", flush=True)
            if pair.note:
                print(f"      note: {pair.note}")
            comparisons.append(comparison)
    print()
    print_table(comparisons)
    for comparison in comparisons:
        if comparison.verdict == "DIFFERENT":
            print(f"\n{comparison.helper} differs from kvspec.spec.{comparison.helper} ({comparison.target}):")
            for counterexample in comparison.counterexamples:
                print(f"  {describe(counterexample)}")
        elif comparison.verdict == "error":
            print(f"\n{comparison.helper}: could not compare: {comparison.detail}")
            if args.verbose:
                print(comparison.crosshair_output)
    status = exit_status(comparisons)
    if args.json:
        write_json(args.json, args.adapter, comparisons, status, args)
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
    parser.add_argument("--json", metavar="FILE", type=output_file, help="also write the results as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="print CrossHair's output for helpers it could not compare")
    parser.set_defaults(func=run)
    return parser
