"""`kvspec explore`: the check at fresh seeds, to find what the gating seeds have not.

CI gates on checks at fixed seeds (`kvspec check --seed N`, the zoo's seed 0), so a red
CI means a change broke something, never that a random search happened to meet an old
bug. Searching further is this command: it makes the same check at `--seeds N` seeds
from `--first-seed S` (a fresh one by default, printed), one report and traces folder per
seed under `--out`, and ends with every find and the command that reproduces it. Each
find is then triaged by a person: a bug of the implementation (kept as a regression
vector), a known divergence (recorded with its trace), or a mistake of the spec (fixed
for every version); none is a reason for CI to turn red.

Exit status: 0 nothing found, 1 a find, 2 an adapter or usage error.
"""

import argparse
import json
import secrets
from pathlib import Path

from .harness.outputs import output_directory


def add_command(commands, add_check_options):
    """Register `explore` on the CLI's subparsers, with the check's options."""
    parser = commands.add_parser("explore", help="run the check at fresh seeds and list every find, for triage "
                                                 "(CI gates on fixed seeds)",
                                 description=__doc__.split("\n\n")[0])
    add_check_options(parser)
    parser.add_argument("--seeds", type=int, default=3, metavar="N", help="how many seeds (default 3)")
    parser.add_argument("--first-seed", type=int, metavar="S",
                        help="the first seed (default: a fresh one, printed); the others follow it")
    parser.add_argument("--out", default="kvspec-explore", metavar="DIR", type=output_directory,
                        help="where each seed's report (seed-S.json) and traces (seed-S/) go "
                             "(default: kvspec-explore)")
    parser.set_defaults(func=explore)
    return parser


def explore(args) -> int:
    from .commands import check  # the same check, seed by seed

    if args.seeds < 1:
        raise argparse.ArgumentTypeError("--seeds must be at least 1")
    first = args.first_seed if args.first_seed is not None else secrets.randbelow(1 << 31)
    seeds = list(range(first, first + args.seeds))
    out = Path(args.out)
    print(f"kvspec explore: adapter {args.adapter}, profile {args.profile}, seeds {first}..{seeds[-1]} "
          f"(each reproduces with `kvspec check --seed S`); reports and traces in {out}", flush=True)
    statuses, finds = [], []
    for seed in seeds:
        print(f"\n== seed {seed} ==", flush=True)
        report = out / f"seed-{seed}.json"
        seeded = argparse.Namespace(**{**vars(args), "seed": seed, "json": str(report),
                                       "traces": str(out / f"seed-{seed}")})
        statuses.append(check(seeded))
        if report.is_file():
            for run in json.loads(report.read_text())["runs"]:
                if run["verdict"] != "ok":
                    finds.append((seed, run))
    print(f"\nkvspec explore: {len(finds)} find(s) over {len(seeds)} seed(s)")
    for seed, run in finds:
        what = ", ".join(run["clauses"]) or run["verdict"]
        print(f"  seed {seed}, {run['label']}: {what}"
              + (f"\n    trace: {run['trace']}\n    replay: kvspec replay {run['trace']} --adapter "
                 f"{run.get('replay_adapter') or args.adapter}" if run["trace"] else "")
              + f"\n    again: kvspec check --adapter {args.adapter} --profile {args.profile} --seed {seed} "
                f"--run '{run['label']}'")
    if finds:
        print("Triage each: a bug of the implementation (keep its trace as a regression vector), a known divergence "
              "(record it with its trace), or a mistake of the spec (fix it for every version).")
    if any(status not in (0, 1) for status in statuses) and not finds:
        return max(statuses)
    return 1 if finds else 0
