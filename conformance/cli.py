"""The `kvspec` command line.

    kvspec check [--adapter reference] [--profile quick|ci|deep] [--seed N]

runs the allocator-tier state machine at page sizes 1, 2, 4 and 16 and the engine-tier
state machine (request lifecycles) at windows that are and are not page multiples,
then prints a summary table. Exit status: 0 conformant, 1 a violation was found, 2
usage or adapter error.
"""

import argparse
import sys
import time
import traceback

from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from kvspec.spec.window import Policy

from .allocator_machine import allocator_machine
from .engine_machine import engine_machine
from .profiles import PROFILES, profile
from .protocol import Adapter, AdapterError, load_adapter

PAGE_SIZES = (1, 2, 4, 16)
ENGINE_CONFIGS = (  # (page size, window, decode eviction interval): W % P == 0, 1..P-2, P-1, and P > W
    (1, 3, 4), (2, 5, 1), (4, 6, 4), (4, 7, 1), (4, 8, 128), (16, 5, 4))


def machines(adapter: Adapter):
    """(label, state machine) of every run a check makes, for the tiers the adapter has."""
    if adapter.make_allocator is not None:
        for page_size in PAGE_SIZES:
            yield f"allocator P={page_size}", allocator_machine(adapter.make_allocator, page_size)
    if adapter.make_engine is not None:
        for page_size, window, interval in ENGINE_CONFIGS:
            policy = Policy(adapter.policy_version, decode_eviction_interval=interval)
            yield (f"engine P={page_size} W={window} I={interval}",
                   engine_machine(adapter.make_engine, page_size, window, policy))


def check(args) -> int:
    runs = list(machines(load_adapter(args.adapter)))
    rows, failed = [], False
    print(f"kvspec check: adapter {args.adapter}, profile {args.profile}", flush=True)
    for index, (label, machine) in enumerate(runs, 1):
        if args.seed is not None:
            machine.TestCase = hypothesis_seed(args.seed)(machine.TestCase)
        print(f"[{index}/{len(runs)}] {label} ...", end=" ", flush=True)
        started = time.perf_counter()
        try:
            run_state_machine_as_test(machine, settings=profile(args.profile))
            verdict = "ok"
        except AdapterError:
            raise
        except Exception:  # a violation: Hypothesis has shrunk it and printed the steps
            verdict, failed = "VIOLATED", True
            print()
            traceback.print_exc()
        elapsed = time.perf_counter() - started
        print(f"{verdict} ({elapsed:.1f} s)", flush=True)
        rows.append((label, machine.examples, machine.steps, verdict, elapsed))
    print()
    print(f"{'run':<26}  {'examples':>8}  {'steps':>7}  {'steps/s':>8}  result")
    for label, examples, steps, verdict, elapsed in rows:
        print(f"{label:<26}  {examples:>8}  {steps:>7}  {steps / elapsed:>8.0f}  {verdict}")
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
    except AdapterError as error:
        print(f"kvspec: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
