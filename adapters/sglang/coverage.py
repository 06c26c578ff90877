"""How much of SGLang's SWA memory management a conformance check drives: line coverage of
the three files that hold it, measured while every run of `kvspec check` drives the
real SGLang through an adapter.

    pip install coverage
    python -m kvspec.adapters.sglang.coverage --adapter sglang-python --profile ci

The runs execute one after another in this process (kvspec check forks a worker per
run, which coverage.py would not follow), under coverage.py started before SGLang is
imported, so module-level lines count. A run that finds a violation is reported, and
its lines still count.
"""

import argparse
import sys
import time

FILES = ("srt/mem_cache/allocator/swa.py", "srt/mem_cache/common.py", "srt/mem_cache/unified_cache/components/swa.py")
"""Relative to the sglang package: the allocator, the scheduler-level helpers (window
eviction, release), and the prefix tree's SWA component."""


def measure(adapter: str, profile: str, seed: int | None, traces: str, runs: list[str] | None,
            missing: bool = False) -> int:
    try:
        import coverage
    except ImportError:
        sys.exit("kvspec.adapters.sglang.coverage needs coverage.py: pip install coverage")
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sglang")  # finds the package without importing it
    if spec is None:
        sys.exit("SGLang is not installed: pip install --no-deps -r adapters/sglang/requirements.txt")
    paths = [str(Path(spec.origin).parent / file) for file in FILES]
    measured = coverage.Coverage(include=paths, data_file=None)
    measured.start()
    from kvspec.conformance.harness.protocol import load_adapter
    from kvspec.conformance.runs.plan import plan
    from kvspec.conformance.runs.runner import Job, check_job

    chosen = plan(load_adapter(adapter))
    chosen = chosen.select(runs) if runs else chosen
    failed = 0
    for number, planned in enumerate(chosen.runs, 1):
        started = time.perf_counter()
        result = check_job(Job(adapter, planned, profile, seed, traces))
        failed += result.verdict != "ok"
        print(f"[{number}/{len(chosen.runs)}] {planned.label}: {result.verdict}, {result.steps} steps in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
    measured.stop()
    print(f"\nline coverage of SGLang by kvspec check --adapter {adapter} --profile {profile}:")
    for file, path in zip(FILES, paths):
        _, statements, _, missing, _ = measured.analysis2(path)
        covered = len(statements) - len(missing)
        print(f"  sglang/{file}: {covered} of {len(statements)} lines, {100 * covered / len(statements):.0f}%")
    if missing:
        measured.report(show_missing=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", default="sglang-python", help="sglang-python (default) or sglang")
    parser.add_argument("--profile", default="ci", choices=("quick", "ci", "deep"))
    parser.add_argument("--seed", type=int, help="Hypothesis' seed")
    parser.add_argument("--traces", default="kvspec-traces", help="where a counterexample is saved")
    parser.add_argument("--run", action="append", metavar="TEXT", help="only the runs whose label contains TEXT")
    parser.add_argument("--missing", action="store_true", help="also list the line numbers not reached")
    args = parser.parse_args(argv)
    return measure(args.adapter, args.profile, args.seed, args.traces, args.run, args.missing)


if __name__ == "__main__":
    sys.exit(main())
