"""vLLM's releases: `python -m kvspec.adapters.vllm.releases install RELEASE|all`
(environment.py)."""

import argparse

from .environment import RELEASES, SHELF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.adapters.vllm.releases", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="unpack releases (their Python only) and what they import")
    install.add_argument("releases", nargs="+", metavar="RELEASE", help=f"a release, or all ({', '.join(RELEASES)})")
    args = parser.parse_args(argv)
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
