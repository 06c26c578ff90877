"""`python -m kvspec.adapters.sglang.releases`: install releases, run the history matrix,
write its table, replay the regression vectors, bisect them against their findings' ranges.
See environment.py, history.py, regressions.py."""

import argparse
from pathlib import Path

from .environment import RELEASES, install, install_requirements


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.adapters.sglang.releases",
                                     description="SGLang's releases, for kvspec's sglang@ adapters.")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("install", help="install releases (wheel only, --no-deps) into their own folders")
    add.add_argument("releases", nargs="+", metavar="RELEASE", help=f"one of {', '.join(RELEASES)}, or all")
    run = sub.add_parser("history", help="kvspec check of every member (or --members), one process each")
    run.add_argument("--profile", default="ci", choices=("quick", "ci", "deep"))
    run.add_argument("--out", type=Path, required=True, help="folder for the shard's JSON, reports and traces")
    run.add_argument("--shard", metavar="I/N", help="run the I-th of N shards of the members")
    run.add_argument("--members", nargs="+", metavar="PREFIX", help="only members whose name starts so")
    run.add_argument("--defaults", action="store_true", help="only each tree at its release's default knobs")
    run.add_argument("-n", "--workers", type=int, default=2)
    run.add_argument("--shrink-seconds", type=float, help="each run's shrinking budget (kvspec check's option)")
    run.add_argument("--seed", type=int, help="Hypothesis' seed of every member's check (CI gates on a fixed one; "
                                              "default: a fresh one per check)")
    run.add_argument("--example-database", type=Path, help="Hypothesis' example database shared by the members "
                     "and shards (default: none)")
    merge = sub.add_parser("table", help="merge history shards into sglang-history.md and .json")
    merge.add_argument("shards", nargs="+", type=Path)
    merge.add_argument("--out", type=Path, default=Path("docs"))
    merge.add_argument("--no-bisect", action="store_true", help="explain violations by their findings' patterns "
                       "only, without bisecting each one's trace along its line (the table says so)")
    merge.add_argument("-n", "--workers", type=int, default=1, help="releases bisected at once (one process each)")
    regress = sub.add_parser("regressions", help="replay the regression vectors on releases (one process each)")
    regress.add_argument("releases", nargs="*", metavar="RELEASE", help="default: every installed release")
    regress.add_argument("-n", "--workers", type=int, default=1, help="releases replayed at once (one process each)")
    bisected = sub.add_parser("ranges", help="bisect each finding's vector on every member: does it reproduce on "
                                             "exactly the releases the finding declares, on each line?")
    bisected.add_argument("findings", nargs="*", metavar="FINDING", help="default: every finding with a vector")
    bisected.add_argument("-n", "--workers", type=int, default=1, help="releases replayed at once")
    write = sub.add_parser("reproduce", help="write a trace as one Python file that shows it with SGLang alone "
                                             "(reproduce.py)")
    write.add_argument("trace", type=Path)
    write.add_argument("--member", required=True, help="the member whose release and tree it drives: sglang@0.5.18")
    write.add_argument("--out", type=Path, required=True, help="the Python file to write")
    args = parser.parse_args()
    if args.command == "install":
        install_requirements()
        for release in RELEASES if args.releases == ["all"] else args.releases:
            print(f"SGLang {release}: {install(release)}", flush=True)
        return 0
    if args.command == "history":
        from .history import history
        history(args.profile, args.out, args.shard, args.members, args.workers, args.defaults,
                args.shrink_seconds, args.example_database, args.seed)
        return 0
    if args.command == "table":
        from .history import table
        return table(args.shards, args.out, bisect=not args.no_bisect, workers=args.workers)
    if args.command == "ranges":
        from .regressions import ranges
        return ranges(args.findings, args.workers)
    if args.command == "reproduce":
        from .reproduce import main as reproduce
        return reproduce(args.trace, args.member, args.out)
    from .regressions import report
    return report(args.releases, args.workers)


if __name__ == "__main__":
    raise SystemExit(main())
