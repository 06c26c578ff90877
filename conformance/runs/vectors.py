"""kvspec's language-neutral conformance vectors: traces from the reference that any
implementation, in any language, can replay (`kvspec replay DIR --adapter X`).

A corpus is a directory of traces (trace.py's format) and an `index.json` naming each
with its step count and SHA-256, so a replay notices a vector that is missing, altered,
or not listed. It holds:

  * the worked examples of docs/engines/sglang.md (§4.3 chunked prefill, §4.4 decode and
    finish, §5 PD-decode pre-allocation with and without a cached prefix);
  * random request lifecycles from the engine state machine with a fixed seed, per
    policy version and page size (windows that are and are not page multiples);
  * random allocator operation sequences per page size.

Every step carries the observables the spec fixes (OBS-3) as `expect`, and every
vector ends with `drain` (release everything, evict everything: every page free).
"""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import DROP_MARGIN, NO_PREFIX_SHARING, SGLANG_0_5_23, TWO_POOL_VERSIONS, Policy

from ..harness.allocator_machine import allocator_machine
from ..harness.engine_machine import engine_machine
from ..harness.protocol import Adapter, load_adapter
from ..harness.replay import with_expectations
from ..harness.trace import Trace, TraceError, TraceStep, engine_config_json, trace_files

INDEX = "index.json"
INDEX_VERSION = 1
EXAMPLES_PER_CONFIG = 3
MIN_STEPS = 8
"""A random vector is one of the first examples the seed gives with at least this many steps."""
ENGINE_CONFIGS = ((1, 5, 4), (4, 6, 4), (4, 7, 1), (16, 5, 4))
"""(page size, window, decode eviction interval): P = 1; W % P == 2; W % P == P - 1 with
eviction every step; P > W."""
ALLOCATOR_PAGE_SIZES = (1, 4, 16)
SEED = 20261130

PROMPT = list(range(100, 140))


def step(op: str, **args) -> TraceStep:
    return TraceStep(op, args)


def walkthroughs() -> dict[str, Trace]:
    """The worked examples of docs/engines/sglang.md (P = 4, W = 8), as in tests/test_walkthroughs.py."""
    def config(version=SGLANG_0_5_23, interval=4):
        return engine_config_json(EngineConfig(4, 8, 128, 64, 8, Policy(version, interval)))

    prefill = [step("admit", rid="r", prompt=PROMPT), *[step("prefill_chunk", rid="r", chunk=16, token=7)] * 3]
    decode = [step("decode", rid="r", token=9)] * 13  # seq_len 41 -> 54: two cursor moves at I = 4
    cached_12 = [step("admit", rid="a", prompt=PROMPT[:12]), step("prefill_chunk", rid="a", chunk=12, token=0),
                 step("finish", rid="a", trim=0)]
    walks = {
        "4.3-chunked-prefill": (config(), prefill),
        "4.4-decode-and-finish": (config(), [*prefill, *decode, step("finish", rid="r", trim=0)]),
        "5-pd-decode-without-prefix-cache": (config(NO_PREFIX_SHARING), [
            step("pd_admit", rid="r", prompt=PROMPT[:30], first_output=7), step("decode", rid="r", token=9),
            step("finish", rid="r", trim=0)]),
        "5-pd-decode-with-cached-prefix-12": (config(), [
            *cached_12, step("pd_admit", rid="r", prompt=PROMPT[:30], first_output=7), step("abort", rid="r")]),
        "5-pd-decode-with-cached-prefix-12-finished": (config(), [
            *cached_12, step("pd_admit", rid="r", prompt=PROMPT[:30], first_output=7),
            step("decode", rid="r", token=9), step("finish", rid="r", trim=0)]),
    }
    return {f"walkthrough-{name}": Trace("engine", cfg, "reference", (*steps, step("drain")),
                                         description=f"docs/engines/sglang.md §{name.split('-')[0]}: {name}")
            for name, (cfg, steps) in walks.items()}


def sampled(machine, count: int, seed: int) -> list[tuple[dict, list[TraceStep]]]:
    """The first `count` examples with MIN_STEPS steps that a seeded run of `machine` makes
    (each ends with the teardown's `drain`)."""
    examples: list[tuple[dict, list[TraceStep]]] = []

    def journal(kind, payload):
        if kind == "example":
            examples.append((payload, []))
        else:
            examples[-1][1].append(payload)

    machine.journal = journal
    run_settings = settings(max_examples=2 * count, stateful_step_count=40, database=None, deadline=None,
                            derandomize=True, suppress_health_check=list(HealthCheck))
    run_state_machine_as_test(machine, settings=run_settings)  # the reference conforms: no failure
    return [example for example in examples if len(example[1]) >= MIN_STEPS][:count]


def random_lifecycles(reference: Adapter, seed: int) -> dict[str, Trace]:
    traces = {}
    for version in TWO_POOL_VERSIONS:
        for page_size, window, interval in ENGINE_CONFIGS:
            if version == DROP_MARGIN and 1 <= window % page_size <= page_size - 2:
                continue  # drop-margin breaks I10 here by design (spec 05, WIN-6): no conformant vector
            policy = Policy(version, interval)
            machine = engine_machine(reference.make_engine, page_size, window, policy)
            for number, (config, steps) in enumerate(sampled(machine, EXAMPLES_PER_CONFIG, seed), 1):
                name = f"lifecycle-{version}-P{page_size}-W{window}-I{interval}-{number}"
                traces[name] = Trace("engine", config, "reference", tuple(steps), seed, name,
                                     f"random lifecycle, {version}, page size {page_size}, window {window}, "
                                     f"decode eviction interval {interval}")
    for page_size in ALLOCATOR_PAGE_SIZES:
        machine = allocator_machine(reference.make_allocator, page_size)
        for number, (config, steps) in enumerate(sampled(machine, EXAMPLES_PER_CONFIG, seed), 1):
            name = f"allocator-P{page_size}-{number}"
            traces[name] = Trace("allocator", config, "reference", tuple(steps), seed, name,
                                 f"random allocator operations, page size {page_size}")
    return traces


def write_corpus(out: str | Path, seed: int = SEED, progress=print) -> list[Path]:
    """Write every vector, with the reference's observables, and the index."""
    out = Path(out)
    reference = load_adapter("reference")
    vectors = {**walkthroughs(), **random_lifecycles(reference, seed)}
    written, index = [], []
    for name, trace in vectors.items():
        trace = replace(with_expectations(trace, reference), label=name)
        if any(s.expect is None for s in trace.steps):
            raise RuntimeError(f"the reference does not conform on vector {name} (a kvspec bug, please report it)")
        path = trace.save(out / f"{name}.jsonl")
        written.append(path)
        index.append({"file": path.name, "steps": len(trace.steps), "sha256": sha256(path)})
        progress(f"  {path.name}: {len(trace.steps)} steps")
    (out / INDEX).write_text(json.dumps({"kvspec_vectors": INDEX_VERSION, "seed": seed, "vectors": index}, indent=1))
    return written


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def corpus_files(directory: Path) -> list[tuple[Path, int | None]]:
    """The traces of a directory with their expected step counts, checked against its
    index when it has one: a listed vector missing or altered, or one not listed, is an
    error (TraceError)."""
    files = trace_files(directory)
    index_path = directory / INDEX
    if not index_path.exists():
        return [(path, None) for path in files]
    try:
        index = json.loads(index_path.read_text())
        listed = {entry["file"]: entry for entry in index["vectors"]}
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise TraceError(f"{index_path}: not a kvspec vector index ({error})") from None
    problems = [f"{name} is listed but missing" for name in listed if not (directory / name).exists()]
    problems += [f"{path.name} is not listed in {INDEX}" for path in files if path.name not in listed]
    problems += [f"{name} was altered (its SHA-256 differs from the index)" for name in listed
                 if (directory / name).exists() and sha256(directory / name) != listed[name]["sha256"]]
    if problems:
        raise TraceError(f"{directory}: corpus does not match its index: " + "; ".join(problems))
    return [(path, listed[path.name]["steps"]) for path in files]
