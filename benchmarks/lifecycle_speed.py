"""How many lifecycle steps per second the reference engine runs, unchecked and with
`check_invariants` after every step, at page sizes 1 and 16.

The workload is deterministic (random.Random(seed)) and the same for both modes: up to
four requests at a time, prompts that share prefixes (cut from a few stems), prefilled
in random chunks, decoded, finished (some after a stop), aborted, and now and then an
explicit evict. The pools are small, so allocations evict from the prefix cache and
some fail with OutOfMemory (a failed prefill is aborted, a failed decode finished).

    python benchmarks/lifecycle_speed.py --steps 10000 --json speed.json
"""

import argparse
import json
import platform
import random
import sys
import time

import torch

from kvspec.reference.engine import Engine
from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.snapshot import EngineConfig, Step
from kvspec.spec.window import POLICY_VERSIONS, SGLANG_0_5_23, Policy

MAX_RUNNING = 4


def bench_config(page_size: int, window: int, version: str, interval: int) -> EngineConfig:
    """Pools of two longest requests (full) and about two windows and two pages per
    running request (SWA): the cache is evicted often and allocations sometimes fail."""
    longest = 6 * window
    size_full = -(-2 * longest // page_size) * page_size
    size_swa = -(-(8 * window + 8 * page_size) // page_size) * page_size
    return EngineConfig(page_size=page_size, window=window, size_full=size_full, size_swa=size_swa,
                        max_requests=MAX_RUNNING, policy=Policy(version, interval))


class Workload:
    """Drives one engine for `steps` operations; `check` runs every invariant after each."""

    def __init__(self, config: EngineConfig, seed: int, check: bool):
        self.config = config
        self.window = config.window
        self.rng = random.Random(seed)
        self.engine = Engine(config)
        self.check = check
        self.previous = self.engine.check_invariants() if check else None
        self.stems = [[self.rng.randrange(50) for _ in range(3 * self.window)] for _ in range(4)]
        self.prefilling: list[str] = []
        self.decoding: list[str] = []
        self.next_id = 0
        self.counts: dict[str, int] = {}

    def step(self, operation: str, rid: str | None, *arguments):
        outcome = getattr(self.engine, operation)(*(() if rid is None else (rid,)), *arguments)
        failed = isinstance(outcome, OutOfMemory)
        key = operation + (" (OutOfMemory)" if failed else "")
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.check:
            self.previous = self.engine.check_invariants(self.previous, Step(operation, rid, "OutOfMemory" if failed else "ok"))
        return outcome

    def prompt(self) -> list[int]:
        stem = self.rng.choice(self.stems)
        length = self.rng.randint(1, 4 * self.window)
        keep = self.rng.randint(0, min(len(stem), length))
        return stem[:keep] + [self.rng.randrange(50) for _ in range(length - keep)]

    def one(self) -> None:
        rng, running = self.rng, len(self.prefilling) + len(self.decoding)
        choice = rng.random()
        if running == 0 or (running < MAX_RUNNING and choice < 0.15):
            self.next_id += 1
            rid = f"r{self.next_id}"
            if self.step("admit", rid, self.prompt()) is None:
                self.prefilling.append(rid)
        elif 0.15 <= choice < 0.16:
            self.step("evict", None, rng.randint(0, 4) * self.config.page_size, rng.randint(0, 4) * self.config.page_size)
        elif self.prefilling and (not self.decoding or choice < 0.45):
            rid = rng.choice(self.prefilling)
            if rng.random() < 0.02:
                self.step("abort", rid)
                self.prefilling.remove(rid)
            elif self.step("prefill_chunk", rid, rng.randint(1, 2 * self.window), rng.randrange(50)) is not None:
                self.step("abort", rid)  # no room for its chunk: give its KV back
                self.prefilling.remove(rid)
            elif self.engine.requests[rid].finished_prefill:
                self.prefilling.remove(rid)
                self.decoding.append(rid)
        else:
            rid = rng.choice(self.decoding)
            request = self.engine.requests[rid]
            if rng.random() < 0.04 or len(request.tokens) + 2 > self.config.size_full:
                own = request.kv_committed_len - request.cache_protected_len
                # a stop trims at most half a window: never below the SWA cursor
                trim = rng.randint(0, min(own, self.window // 2)) if rng.random() < 0.3 else 0
                self.step("finish", rid, trim)
                self.decoding.remove(rid)
            elif self.step("decode", rid, rng.randrange(50)) is not None:
                self.step("finish", rid)
                self.decoding.remove(rid)

    def run(self, steps: int) -> float:
        start = time.perf_counter()
        while sum(self.counts.values()) < steps:
            self.one()
        return time.perf_counter() - start


def measure(page_size: int, steps: int, seed: int, window: int, version: str, interval: int) -> list[dict]:
    rows = []
    config = bench_config(page_size, window, version, interval)
    for mode, check in (("unchecked", False), ("checked", True)):
        workload = Workload(config, seed, check)
        seconds = workload.run(steps)
        done = sum(workload.counts.values())
        rows.append(dict(page_size=page_size, mode=mode, steps=done, seconds=seconds, steps_per_second=done / seconds,
                         operations=dict(sorted(workload.counts.items())), config=repr(config)))
    rows[1]["checked_over_unchecked"] = rows[1]["seconds"] / rows[0]["seconds"] * rows[0]["steps"] / rows[1]["steps"]
    assert rows[0]["operations"] == rows[1]["operations"], "both modes run the same workload"
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| page size | mode | steps | seconds | steps/s | checked/unchecked time per step |",
             "|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        ratio = f"{row['checked_over_unchecked']:.1f}x" if "checked_over_unchecked" in row else ""
        lines.append(f"| {row['page_size']} | {row['mode']} | {row['steps']} | {row['seconds']:.2f} | "
                     f"{row['steps_per_second']:,.0f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10_000, help="lifecycle steps per page size and mode (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload (default 0)")
    parser.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16], help="page sizes to measure (default 1 16)")
    parser.add_argument("--window", type=int, default=24, help="sliding window in tokens (default 24)")
    parser.add_argument("--policy", choices=POLICY_VERSIONS, default=SGLANG_0_5_23)
    parser.add_argument("--interval", type=int, default=16, help="decode eviction interval I (default 16)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    arguments = parser.parse_args(argv)
    if arguments.steps < 1:
        parser.error("--steps must be >= 1")
    torch.set_num_threads(1)  # the engine's tensors are tiny: threads only add overhead
    try:
        rows = [row for page_size in arguments.page_sizes
                for row in measure(page_size, arguments.steps, arguments.seed, arguments.window, arguments.policy,
                                   arguments.interval)]
    except AssertionError as violation:  # check_invariants: e.g. drop-margin where 1 <= W % P <= P - 2 (I10)
        print(f"the checked run stopped: {violation}", file=sys.stderr)
        return 1
    print(markdown(rows))
    if arguments.json:
        with open(arguments.json, "w") as out:
            json.dump(dict(python=sys.version.split()[0], torch=torch.__version__, machine=platform.machine(),
                           arguments=vars(arguments), results=rows), out, indent=2)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
