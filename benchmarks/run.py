"""kvspec's benchmarks, in one command that writes a Markdown and a JSON table.

    python benchmarks/run.py --quick             # CI (--out DIR): a few minutes
    python benchmarks/run.py                     # the full run behind docs/benchmarks.md's tables

Sections (--sections picks some), each measured side by side in one run and reported
as ratios, since this machine is shared and noisy:
  speed     the same lifecycle workload (workload.py) on the reference and on each real
            engine installed (SGLang's Python and Rust tree cores, vLLM), page sizes 1 and
            16, unchecked and with every invariant checked after every step;
  overhead  checked over unchecked time per step, per engine (from the speed runs);
  scaling   time per step at pools of 1K, 64K and 1M slots (same workload, the prefix
            cache held to the same budget), reference and SGLang, unchecked and checked;
  profile   where a checked step's time goes, per engine (engine, snapshot, each check);
  detection per bug-zoo mutant, time to the first counterexample and shrunk length
            over several seeds (detection.py);
  gpu       the speed runs of the reference on CUDA, when a GPU is present.
The goals of issues 9 and 20 are judged at the end. Results go to DIR/results.md,
DIR/results.json and a picture, DIR/results.png.
"""

import argparse
import cProfile
import dataclasses
import importlib.util
import json
import platform
import pstats
import sys
import time
from functools import partial
from pathlib import Path

import detection
import torch
from workload import Workload, small_pools

from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.harness.protocol import load_adapter
from kvspec.spec.snapshot import EngineConfig, pool_check_period
from kvspec.spec.window import Policy

WINDOW = 24
INTERVAL = 16  # SGLang's default decode eviction interval is larger; 16 makes eviction frequent
SCALING_POOLS = (1 << 10, 1 << 16, 1 << 20)
CACHE_BUDGET = 512  # tokens the scaling workload keeps cached at any pool size
MODES = {"full": dict(steps=10_000, rounds=3, seeds=10, zoo=("reference", "sglang", "vllm"), only=None),
         "quick": dict(steps=600, rounds=1, seeds=2, zoo=("reference",), only=["mutant-stale-mapping", "mutant-leak-on-release"])}
ENGINES = {"reference": None, "sglang-python": "sglang", "sglang": "sglang", "vllm": "vllm"}
"""Each engine of the speed runs, and the package it needs."""


def installed(engine: str) -> bool:
    return ENGINES[engine] is None or importlib.util.find_spec(ENGINES[engine]) is not None


def adapter_of(engine: str, device: str = "cpu"):
    adapter = load_adapter(engine)
    if device != "cpu":
        adapter = dataclasses.replace(adapter, make_engine=partial(ReferenceEngineAdapter, device=device))
    return adapter


def policy_of(adapter) -> Policy:
    return Policy(adapter.policy_version, INTERVAL)


def timed(adapter, config: EngineConfig, steps: int, seed: int, check: bool, cache_budget=None) -> dict:
    workload = Workload(adapter, config, seed, check, cache_budget)
    seconds = workload.run(steps)
    return {"steps": workload.steps, "seconds": round(seconds, 4), "us_per_step": round(1e6 * seconds / workload.steps, 1),
            "steps_per_second": round(workload.steps / seconds, 1), "operations": dict(sorted(workload.counts.items()))}


def measure(cases: list[tuple], steps: int, seed: int, rounds: int, progress) -> list[dict]:
    """Each case (label, adapter, config, cache budget) unchecked then checked, the same
    workload. All cases run once per round, interleaved, and each keeps its fastest
    round: load that comes and goes on a shared machine then hits every case alike."""
    best: dict[tuple, dict] = {}
    for round_ in range(rounds):
        for label, adapter, config, cache_budget in cases:
            for mode, check in (("unchecked", False), ("checked", True)):
                row = {**label, "mode": mode, **timed(adapter, config, steps, seed, check, cache_budget)}
                key = (*label.values(), mode)
                if key not in best or row["seconds"] < best[key]["seconds"]:
                    best[key] = row
                progress(f"  round {round_ + 1}/{rounds} {' '.join(f'{k}={v}' for k, v in label.items())} {mode}: "
                         f"{row['steps_per_second']:,.0f} steps/s")
    rows = list(best.values())
    for unchecked, checked in zip(rows[::2], rows[1::2]):
        checked["checked_over_unchecked"] = round(checked["us_per_step"] / unchecked["us_per_step"], 2)
    return rows


# -- sections ---------------------------------------------------------------------------

def speed(engines, steps, seed, rounds, progress, device="cpu") -> list[dict]:
    cases = []
    for engine in engines:
        adapter = adapter_of(engine, device)
        for page_size in (1, 16):
            label = {"engine": engine, "device": device, "page_size": page_size}
            cases.append((label, adapter, small_pools(page_size, WINDOW, policy_of(adapter)), None))
    return measure(cases, steps, seed, rounds, progress)


def scaling(engines, steps, seed, rounds, progress) -> list[dict]:
    cases = []
    for engine in engines:
        adapter = adapter_of(engine)
        for slots in SCALING_POOLS:
            config = EngineConfig(1, WINDOW, slots, slots, 4, policy_of(adapter))
            label = {"engine": engine, "pool_slots": slots, "whole_snapshot_every": pool_check_period(config)}
            cases.append((label, adapter, config, CACHE_BUDGET))
    return measure(cases, steps, seed, rounds, progress)


def profile(engines, steps, seed, progress) -> list[dict]:
    """Where a checked step's time goes, per engine (page size 1): the engine's own
    operation, the snapshot, and each invariant check, as shares of the run under
    cProfile (which slows everything alike, so only the shares are reported)."""
    from kvspec.conformance.harness.checks import Checks

    rows = []
    for engine in engines:
        adapter = adapter_of(engine)
        workload = Workload(adapter, small_pools(1, WINDOW, policy_of(adapter)), seed, check=True)
        profiler = cProfile.Profile()
        profiler.runcall(workload.run, steps)
        stats = pstats.Stats(profiler).stats  # (file, line, function) -> (calls, ..., cumulative time, callers)

        def cumulative(file_end: str, function: str) -> float:
            return sum(entry[3] for (file, _, name), entry in stats.items() if file.endswith(file_end) and name == function)

        total, check = cumulative("workload.py", "run"), cumulative("engine_driver.py", "check")
        snapshot = cumulative("engine_driver.py", "snapshot")
        parts = {"engine operation": cumulative("engine_driver.py", "call") - check, "snapshot": snapshot}
        checks = Checks(adapter.model.snapshot_type, adapter.observables, incremental=True)
        for c in checks.run:
            # the spec's predicate where it runs, and its certificate (incremental checking) where it has one
            for function in (c.function, checks.certificates.by_function.get(c.function)):
                if function is not None:
                    inner = getattr(function, "__wrapped__", function)  # a block-pool certificate's own method
                    code = getattr(inner, "__func__", inner).__code__
                    parts[c.clause] = parts.get(c.clause, 0) + cumulative(code.co_filename[-24:], code.co_name)
        parts["harness and workload"] = total - sum(parts.values())
        shares = {part: round(100 * seconds / total, 1) for part, seconds in parts.items()}
        rows.append(dict(engine=engine, steps=workload.steps, shares=dict(sorted(shares.items(), key=lambda kv: -kv[1]))))
        progress(f"  {engine}: " + ", ".join(f"{part} {share}%" for part, share in list(rows[-1]["shares"].items())[:5]))
    return rows


def gpu(steps, seed, progress) -> list[dict] | str:
    if not torch.cuda.is_available():
        return "skipped: no CUDA device (torch.cuda.is_available() is False)"
    progress(f"gpu: {torch.cuda.get_device_name(0)}")
    return speed(["reference"], steps, seed, 1, progress, "cpu") + speed(["reference"], steps, seed, 1, progress, "cuda")


# -- goals ------------------------------------------------------------------------------

def row(rows, mode, **where):
    return next((r for r in rows if r["mode"] == mode and all(r.get(k) == v for k, v in where.items())), None)


OVERHEAD_GOALS = {"sglang": 1.5}
"""Checked over unchecked, per engine: 2x, and 1.5x for SGLang's Rust core (issue 20)."""


def goals(results: dict) -> list[dict]:
    """Issues 9's and 20's goals, each judged on what this run measured (a goal whose runs
    did not happen is not judged)."""
    judged = []

    def judge(goal, measured, target, met):
        judged.append(dict(goal=goal, measured=measured, target=target, met=met))

    speed_rows = results.get("speed", [])
    for page_size in (1, 16):
        ours, theirs = (row(speed_rows, "unchecked", engine=e, page_size=page_size) for e in ("reference", "sglang-python"))
        if ours and theirs:
            ratio = ours["steps_per_second"] / theirs["steps_per_second"]
            judge(f"speed P={page_size}: reference / SGLang Python core, unchecked steps/s", f"{ratio:.2f}x", ">= 1x",
                  ratio >= 1)
    for checked in (r for r in speed_rows if r["mode"] == "checked"):
        limit = OVERHEAD_GOALS.get(checked["engine"], 2.0)
        judge(f"overhead {checked['engine']} P={checked['page_size']}: checked / unchecked time per step",
              f"{checked['checked_over_unchecked']:.2f}x", f"<= {limit:g}x", checked["checked_over_unchecked"] <= limit)
    scaling_rows = results.get("scaling", [])
    for engine in dict.fromkeys(r["engine"] for r in scaling_rows):
        for mode in ("unchecked", "checked"):
            small, large = (row(scaling_rows, mode, engine=engine, pool_slots=s) for s in (SCALING_POOLS[0], SCALING_POOLS[-1]))
            if small and large:
                ratio = large["us_per_step"] / small["us_per_step"]
                judge(f"scaling {engine} {mode}: time per step, 1M / 1K slots", f"{ratio:.2f}x", "<= 1.5x", ratio <= 1.5)
    for mutant in results.get("detection", []):
        if mutant["median_seconds"] is not None:
            judge(f"detection {mutant['adapter']}: median s to the first counterexample (a missed seed: never)",
                  f"{mutant['median_seconds']:.1f} s where caught, {mutant['caught']} of {mutant['seeds']} seeds",
                  "< 10 s", mutant["goal_met"])
    return judged


# -- output -----------------------------------------------------------------------------

def table(header: list[str], lines: list[list]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(map(str, line)) + " |" for line in lines])


def speed_table(rows) -> str:
    return table(["engine", "device", "page size", "mode", "steps", "steps/s", "µs/step", "checked / unchecked"],
                 [[r["engine"], r["device"], r["page_size"], r["mode"], r["steps"], f"{r['steps_per_second']:,.0f}",
                   f"{r['us_per_step']:,.0f}", f"{r['checked_over_unchecked']:.2f}x" if "checked_over_unchecked" in r else ""]
                  for r in rows])


def markdown(results: dict) -> str:
    meta = results["run"]
    parts = [f"# kvspec benchmarks ({meta['mode']} mode)",
             f"{meta['started']}, {meta['seconds']:.0f} s; Python {meta['python']}, torch {meta['torch']}, "
             f"{meta['machine']}; {meta['steps']} steps per run, the fastest of {meta['rounds']} interleaved rounds, "
             f"window {WINDOW}, seed {meta['seed']}; "
             f"engines skipped: {', '.join(meta['skipped']) or 'none'}."]
    if meta.get("provenance"):  # a table put together from several runs says which
        parts.append(meta["provenance"])
    if "speed" in results:
        parts += ["## Speed and checking overhead",
                  "The same lifecycle workload (`benchmarks/workload.py`) through each engine's adapter: unchecked, "
                  "then with every invariant checked after every step (`kvspec check`'s driver). Small pools, so the "
                  "cache is evicted and allocations fail now and then.", speed_table(results["speed"])]
    if "scaling" in results:
        parts += ["## Scaling with the pool",
                  f"Page size 1, both pools of the given size, the prefix cache held to {CACHE_BUDGET} tokens, so "
                  "every pool does the same work. Checked runs take a partial snapshot (OBS-4) between whole ones.",
                  table(["engine", "pool slots", "whole snapshot every", "mode", "steps/s", "µs/step", "checked / unchecked"],
                        [[r["engine"], f"{r['pool_slots']:,}", r["whole_snapshot_every"], r["mode"],
                          f"{r['steps_per_second']:,.0f}", f"{r['us_per_step']:,.0f}",
                          f"{r['checked_over_unchecked']:.2f}x" if "checked_over_unchecked" in r else ""]
                         for r in results["scaling"]])]
    if "profile" in results:
        parts += ["## Where a checked step's time goes",
                  "One checked run per engine at page size 1 under cProfile: shares of its time, by the engine's "
                  "own operation, taking the snapshot, and each clause's checks (largest first).",
                  table(["engine", "shares of a checked run's time"],
                        [[r["engine"], ", ".join(f"{part} {share:.0f}%" for part, share in r["shares"].items()
                                                 if share >= 1)] for r in results["profile"]])]
    if "detection" in results:
        parts += ["## Detection", f"Each bug-zoo mutant on its exposing run (`kvspec zoo`, ci profile) over "
                  f"{meta['seeds']} seeds: seconds to the first counterexample (before shrinking) and shrunk length.",
                  detection.markdown(results["detection"])]
    if "gpu" in results:
        gpu_result = results["gpu"]
        parts += ["## GPU", gpu_result if isinstance(gpu_result, str) else speed_table(gpu_result)]
    if results.get("goals"):
        parts += ["## Goals", table(["goal", "measured", "target", "met"],
                                    [[g["goal"], g["measured"], g["target"], "yes" if g["met"] else "**no**"]
                                     for g in results["goals"]])]
    return "\n\n".join(parts) + "\n"


def plot(results: dict, path: Path) -> bool:
    """Steps per second per engine, and time per step against the pool size."""
    if "speed" not in results and "scaling" not in results:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    speed_rows = results.get("speed", [])
    labels = list(dict.fromkeys(f"{r['engine']}\nP={r['page_size']}" for r in speed_rows))
    for offset, mode in ((-0.2, "unchecked"), (0.2, "checked")):
        values = [r["steps_per_second"] for r in speed_rows if r["mode"] == mode]
        left.bar([i + offset for i in range(len(values))], values, width=0.4, label=mode)
    left.set_xticks(range(len(labels)), labels, fontsize=7)
    left.set_yscale("log")  # the engines span two orders of magnitude
    left.set_ylabel("lifecycle steps per second (log)")
    left.set_title("Speed: the same workload, each engine")
    if speed_rows:
        left.legend()
    for engine in dict.fromkeys(r["engine"] for r in results.get("scaling", [])):
        for mode, style in (("unchecked", "--"), ("checked", "-")):
            points = [(r["pool_slots"], r["us_per_step"]) for r in results["scaling"] if r["engine"] == engine and r["mode"] == mode]
            right.plot(*zip(*points), style, marker="o", label=f"{engine} {mode}")
    right.set_xscale("log", base=2)
    right.set_xlabel("slots per pool")
    right.set_ylabel("µs per step")
    right.set_ylim(bottom=0)
    right.set_title("Scaling: time per step against the pool size")
    if results.get("scaling"):
        right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs, two zoo mutants, two seeds (CI)")
    parser.add_argument("--sections", nargs="+", choices=("speed", "scaling", "profile", "detection", "gpu"),
                        default=["speed", "scaling", "profile", "detection", "gpu"], help="what to measure (default: all)")
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES),
                        help="engines of the speed and scaling runs (default: every one installed)")
    parser.add_argument("--steps", type=int, help="lifecycle steps per run (default 10000; quick 600)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the speed and scaling runs, each run "
                                                    "keeping its fastest (default 3; quick 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload (default 0)")
    parser.add_argument("-n", "--workers", type=int, default=2, help="worker processes for detection (default 2)")
    parser.add_argument("--detection-json", nargs="+", metavar="FILE",
                        help="take the detection rows from these files of detection.py --json instead of "
                             "measuring them again (the long part of a full run)")
    parser.add_argument("--out", help="where results.md/.json/.png go (default benchmarks/results, the committed "
                                      "full tables; quick: benchmarks/quick-results, not kept)")
    arguments = parser.parse_args(argv)
    mode = "quick" if arguments.quick else "full"
    settings = MODES[mode]
    steps = arguments.steps or settings["steps"]
    rounds = arguments.rounds or settings["rounds"]
    if steps < 1 or rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    torch.set_num_threads(1)  # the engines' tensors are tiny: threads only add overhead
    engines = [engine for engine in arguments.engines if installed(engine)]
    skipped = [f"{engine} (pip install --no-deps -r adapters/{ENGINES[engine]}/requirements.txt)"
               for engine in arguments.engines if not installed(engine)]
    out = Path(arguments.out or ("benchmarks/quick-results" if arguments.quick else "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    started, clock = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.perf_counter()
    results: dict = {}

    def progress(line, **print_options):  # run_zoo passes flush=True
        print(line, flush=True)

    for section in arguments.sections:
        progress(f"{section} ...")
        if section == "speed":
            results["speed"] = speed(engines, steps, arguments.seed, rounds, progress)
        elif section == "scaling":
            results["scaling"] = scaling([e for e in ("reference", "sglang", "vllm") if e in engines], steps, arguments.seed,
                                         rounds, progress)
        elif section == "profile":
            results["profile"] = profile(engines, min(steps, 2000), arguments.seed, progress)
        elif section == "detection" and arguments.detection_json:
            results["detection"] = [row for path in arguments.detection_json
                                    for row in json.loads(Path(path).read_text(encoding="utf-8"))["rows"]]
        elif section == "detection":
            zoo = tuple(i for i in settings["zoo"] if installed(i))
            results["detection"] = detection.measure(zoo, range(settings["seeds"]), arguments.workers,
                                                     only=settings["only"], progress=progress)
        else:
            results["gpu"] = gpu(steps, arguments.seed, progress)
    results["goals"] = goals(results)
    results["run"] = dict(mode=mode, started=started, seconds=round(time.perf_counter() - clock, 1), steps=steps,
                          rounds=rounds,
                          seed=arguments.seed, seeds=settings["seeds"], skipped=skipped, python=sys.version.split()[0],
                          torch=torch.__version__, machine=f"{platform.machine()}, {torch.get_num_threads()} torch thread",
                          arguments=vars(arguments))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "results.md").write_text(markdown(results), encoding="utf-8")
    drawn = plot(results, out / "results.png")
    print()
    print(markdown(results))
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}" + (f", {out / 'results.png'}" if drawn else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
