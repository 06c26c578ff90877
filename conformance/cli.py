"""The `kvspec` command line.

    kvspec check [--adapter reference] [--profile quick|ci|deep] [--seed N]

runs the allocator-tier state machine at page sizes 1, 2, 4 and 16 and prints a summary
table. Exit status: 0 conformant, 1 a violation was found, 2 usage or adapter error.
"""

import argparse
import sys
import time
import traceback

from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from .allocator_machine import allocator_machine
from .profiles import PROFILES, profile

PAGE_SIZES = (1, 2, 4, 16)


def load_adapter(name: str):
    """The allocator factory of a named adapter."""
    if name == "reference":
        from kvspec.adapters.reference import ReferenceAllocatorAdapter
        return ReferenceAllocatorAdapter
    raise UsageError(f"unknown adapter {name!r}; available: reference")


class UsageError(Exception):
    """A mistake in how kvspec was called: exit status 2."""


def check(args) -> int:
    make_allocator = load_adapter(args.adapter)
    rows, failed = [], False
    print(f"kvspec check: adapter {args.adapter}, profile {args.profile}, page sizes {PAGE_SIZES}", flush=True)
    for index, page_size in enumerate(PAGE_SIZES, 1):
        machine = allocator_machine(make_allocator, page_size)
        if args.seed is not None:
            machine.TestCase = hypothesis_seed(args.seed)(machine.TestCase)
        print(f"[{index}/{len(PAGE_SIZES)}] allocator tier, page_size {page_size} ...", end=" ", flush=True)
        started = time.perf_counter()
        try:
            run_state_machine_as_test(machine, settings=profile(args.profile))
            verdict = "ok"
        except Exception:  # a violation: Hypothesis has shrunk it and printed the steps
            verdict, failed = "VIOLATED", True
            print()
            traceback.print_exc()
        elapsed = time.perf_counter() - started
        print(f"{verdict} ({elapsed:.1f} s)", flush=True)
        rows.append((page_size, machine.examples, machine.steps, verdict, elapsed))
    print()
    print(f"{'page_size':>9}  {'examples':>8}  {'steps':>7}  {'steps/s':>8}  result")
    for page_size, examples, steps, verdict, elapsed in rows:
        print(f"{page_size:>9}  {examples:>8}  {steps:>7}  {steps / elapsed:>8.0f}  {verdict}")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kvspec", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="run the conformance state machines against an adapter")
    check_parser.add_argument("--adapter", default="reference", help="adapter name (default: reference)")
    check_parser.add_argument("--profile", default="quick", choices=sorted(PROFILES), help="how hard to search")
    check_parser.add_argument("--seed", type=int, help="fix Hypothesis' seed to reproduce a run")
    args = parser.parse_args(argv)
    try:
        return check(args)
    except UsageError as error:
        print(f"kvspec: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
