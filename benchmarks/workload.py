"""One lifecycle workload, the same for every engine: it drives any adapter's engine
through the engine protocol (kvspec.conformance.harness.protocol), unchecked or with every
invariant checked after every step (kvspec.conformance.harness.engine_driver, as `kvspec check`).

The workload is deterministic (random.Random(seed)): up to four requests at a time,
prompts that share prefixes (cut from a few stems), prefilled in random chunks, decoded,
finished (some after a stop), aborted, and now and then an explicit evict. It keeps its own
account of which requests prefill or decode and how long each is; the one thing it reads
from the engine is where an admitted request's prefill starts (its prefix match). Its random choices depend on
outcomes only (an OutOfMemory aborts a prefill, finishes a decode), which conforming
engines agree on (OBS-3), so the reference and SGLang run the same steps.

With a `cache_budget` the workload also bounds the prefix cache: once more tokens were
written since the last such evict than the budget, it evicts the excess. The cache then
holds about the same at any pool size, so a run on a larger pool does the same work.
"""

import random
import time

from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.protocol import PARAMETERS, Adapter
from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy

MAX_RUNNING = 4
ALPHABET = 50


def small_pools(page_size: int, window: int, policy: Policy) -> EngineConfig:
    """Pools of two longest requests (full) and about two windows and two pages per
    running request (SWA): the cache is evicted often and allocations sometimes fail."""
    longest = 6 * window
    size_full = -(-2 * longest // page_size) * page_size
    size_swa = -(-(8 * window + 8 * page_size) // page_size) * page_size
    return EngineConfig(page_size=page_size, window=window, size_full=size_full, size_swa=size_swa,
                        max_requests=MAX_RUNNING, policy=policy)


class Workload:
    """Runs the workload on one engine of `adapter`, checked or not."""

    def __init__(self, adapter: Adapter, config: EngineConfig, seed: int, check: bool,
                 cache_budget: int | None = None):
        self.config, self.window, self.cache_budget = config, config.window, cache_budget
        self.rng = random.Random(seed)
        self.engine = adapter.make_engine(config)
        self.driver = EngineDriver(self.engine, adapter.model, adapter.observables) if check else None
        self.stems = [[self.rng.randrange(ALPHABET) for _ in range(3 * self.window)] for _ in range(4)]
        self.prefilling: dict[str, list[int]] = {}  # rid -> [prompt length, tokens prefilled]
        self.decoding: dict[str, list[int]] = {}  # rid -> [tokens, decode steps]
        self.next_id = 0
        self.written = 0  # tokens whose KV was written since the last budget evict
        self.counts: dict[str, int] = {}

    def step(self, operation: str, *arguments) -> bool:
        """Run one operation (checked, with a driver); True unless it ran out of memory."""
        if self.driver is not None:
            ok = self.driver.call(operation, dict(zip(PARAMETERS[operation], arguments))) == "ok"
        else:
            ok = not isinstance(getattr(self.engine, operation)(*arguments), OutOfMemory)
        key = operation if ok else f"{operation} (OutOfMemory)"
        self.counts[key] = self.counts.get(key, 0) + 1
        return ok

    def matched(self, rid: str) -> int:
        """How much of a just admitted request's prompt the prefix cache had: prefill
        starts there. The one thing the workload reads from the engine (where a checked
        run's driver has it already, an unchecked run takes a snapshot, partial if it can)."""
        if self.driver is not None:
            snapshot = self.driver.previous
        else:
            snapshot = getattr(self.engine, "partial_snapshot", self.engine.snapshot)()
        return next(r.kv_committed_len for r in snapshot.requests if r.rid == rid)

    def prompt(self) -> list[int]:
        stem = self.rng.choice(self.stems)
        length = self.rng.randint(1, 4 * self.window)
        keep = self.rng.randint(0, min(len(stem), length))
        return stem[:keep] + [self.rng.randrange(ALPHABET) for _ in range(length - keep)]

    def release(self, operation: str, rid: str, *arguments) -> None:
        """Finish or abort a request; then keep the cache within its budget."""
        self.step(operation, rid, *arguments)
        if self.cache_budget is not None and self.written > self.cache_budget:
            excess, self.written = self.written - self.cache_budget, self.cache_budget
            self.step("evict", excess, excess)

    def one(self) -> None:
        rng, running = self.rng, len(self.prefilling) + len(self.decoding)
        choice = rng.random()
        if running == 0 or (running < MAX_RUNNING and choice < 0.15):
            self.next_id += 1
            rid, prompt = f"r{self.next_id}", self.prompt()
            if self.step("admit", rid, prompt):
                self.prefilling[rid] = [len(prompt), self.matched(rid)]
        elif 0.15 <= choice < 0.16:
            pages = self.config.page_size
            self.step("evict", rng.randint(0, 4) * pages, rng.randint(0, 4) * pages)
        elif self.prefilling and (not self.decoding or choice < 0.45):
            rid = rng.choice(sorted(self.prefilling))
            length, done = self.prefilling[rid]
            chunk = rng.randint(1, 2 * self.window)
            if rng.random() < 0.02:
                del self.prefilling[rid]
                self.release("abort", rid)
            elif not self.step("prefill_chunk", rid, chunk, rng.randrange(ALPHABET)):
                del self.prefilling[rid]
                self.release("abort", rid)  # no room for its chunk: give its KV back
            else:
                done = min(length, done + chunk)
                self.written += done - self.prefilling[rid][1]
                self.prefilling[rid][1] = done
                if done == length:  # the last chunk sampled the first output token
                    del self.prefilling[rid]
                    self.decoding[rid] = [length + 1, 0]
        else:
            rid = rng.choice(sorted(self.decoding))
            tokens, steps = self.decoding[rid]
            if rng.random() < 0.04 or tokens + 2 > self.config.size_full:
                # a stop trims at most half a window of the outputs whose KV is written
                trim = rng.randint(0, min(steps, self.window // 2)) if rng.random() < 0.3 else 0
                del self.decoding[rid]
                self.release("finish", rid, trim)
            elif self.step("decode", rid, rng.randrange(ALPHABET)):
                self.decoding[rid] = [tokens + 1, steps + 1]
                self.written += 1
            else:
                del self.decoding[rid]
                self.release("finish", rid, 0)

    def run(self, steps: int) -> float:
        """Run at least `steps` operations; the seconds they took."""
        start = time.perf_counter()
        while sum(self.counts.values()) < steps:
            self.one()
        return time.perf_counter() - start

    @property
    def steps(self) -> int:
        return sum(self.counts.values())
