"""`python -m kvspec.adapters.sglang.releases install RELEASE|all`: see environment.py."""

import argparse

from .environment import RELEASES, install


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kvspec.adapters.sglang.releases",
                                     description="Install SGLang releases for kvspec's sglang@ adapters.")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("install", help="install releases (wheel only, --no-deps) into their own folders")
    add.add_argument("releases", nargs="+", metavar="RELEASE", help=f"one of {', '.join(RELEASES)}, or all")
    args = parser.parse_args()
    for release in RELEASES if args.releases == ["all"] else args.releases:
        print(f"SGLang {release}: {install(release)}", flush=True)


if __name__ == "__main__":
    main()
