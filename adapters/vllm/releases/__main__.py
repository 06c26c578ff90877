"""vLLM's releases: `python -m kvspec.adapters.vllm.releases install RELEASE|all`
(environment.py), `... history --out DIR [--shard I/N]` (history.py)."""

import argparse
from pathlib import Path

from .environment import RELEASES, SHELF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.adapters.vllm.releases", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="unpack releases (their Python only) and what they import")
    install.add_argument("releases", nargs="+", metavar="RELEASE", help=f"a release, or all ({', '.join(RELEASES)})")
    run = commands.add_parser("history", help="kvspec check of every member (or --members), one process each")
    run.add_argument("--profile", default="ci", choices=("quick", "ci", "deep"))
    run.add_argument("--out", type=Path, required=True, help="folder for the shard's JSON, reports and traces")
    run.add_argument("--shard", metavar="I/N", help="run the I-th of N shards of the members")
    run.add_argument("--members", nargs="+", metavar="PREFIX", help="only members whose name starts so")
    run.add_argument("-n", "--workers", type=int, default=2)
    run.add_argument("--shrink-seconds", type=float, help="each run's shrinking budget (kvspec check's option)")
    run.add_argument("--seed", type=int, help="Hypothesis' seed of every member's check (default: a fresh one)")
    args = parser.parse_args(argv)
    if args.command == "history":
        from .history import history
        history(args.profile, args.out, args.shard, args.members, args.workers, args.shrink_seconds, args.seed)
        return 0
    chosen = RELEASES if args.releases == ["all"] else args.releases
    unknown = [release for release in chosen if release not in RELEASES]
    if unknown:
        parser.error(f"unknown vLLM release(s) {', '.join(unknown)}; kvspec covers {', '.join(RELEASES)}")
    SHELF.install_requirements()
    for release in chosen:
        print(f"vLLM {release}: {SHELF.install(release)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
