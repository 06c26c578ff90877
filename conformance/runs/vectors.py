"""kvspec's language-neutral conformance vectors: traces from the reference that any
implementation, in any language, can replay (`kvspec replay DIR --adapter X`).

`kvspec vectors --out DIR` writes them under DIR/conformance/, by tier, memory model and
policy version, each with its front matter (front_matter.py), and the index of the tree
(tree.py: the layout, the index, what a replay reads). They are:

  * the worked examples of docs/engines/sglang.md (§4.3 chunked prefill, §4.4 decode and
    finish, §5 PD-decode pre-allocation with and without a cached prefix), of
    spec/04-tree.md (an eviction) and of spec/09-state.md (a hit the state component shortens, copied on write);
  * random request lifecycles from the engine state machine with a fixed seed, per
    policy version and page size (windows that are and are not page multiples), and
    with a recurrent-state pool (spec chapter 09) per state run's configuration;
  * the same of the shared block pool (spec chapter 08), per version of it and page
    size, without PD-decode admissions (vLLM's manager has none, and replays them all),
    and the scripted trace of docs/engines/vllm.md §7;
  * random allocator operation sequences per page size;
  * at the scheduler tier (spec chapter 10), the chapter's worked example and random
    arrivals from the scheduler state machine on the reference scheduler, per
    configuration, and with a recurrent-state group per scheduler+state run's
    configuration (SCHED-9): they fix no plan, so they carry no `expect`, and an
    implementation replays them to have every plan it makes checked.

Every step of the other tiers carries the observables the spec fixes (OBS-3) as
`expect`, and every vector ends with `drain` (release everything, evict everything:
every page free; at the scheduler tier, every request ended).
"""

from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.scheduler import STATE, SchedulerConfig
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import (
    BLOCK_POOL_VERSIONS,
    NO_PREFIX_SHARING,
    SGLANG_0_5_23,
    TWO_POOL_VERSIONS,
    VLLM_0_33_DENSE,
    Policy,
    insert_window_at_risk,
)

from ..harness.allocator_machine import allocator_machine
from ..harness.declarations import SCHEDULER_STATE_CONFIGS, STATE_CONFIGS, Capability
from ..harness.engine_machine import LAYOUTS, engine_machine
from ..harness.front_matter import with_front_matter
from ..harness.protocol import Adapter, load_adapter
from ..harness.replay import replay, with_expectations
from ..harness.scheduler_machine import scheduler_config_json, scheduler_machine
from ..harness.trace import Trace, TraceStep, engine_config_json
from .tree import folder, write_index

EXAMPLES_PER_CONFIG = 3
MIN_STEPS = 8
"""A random vector is one of the first examples the seed gives with at least this many steps."""
ENGINE_CONFIGS = ((1, 5, 4), (4, 6, 4), (4, 7, 1), (16, 5, 4))
"""(page size, window, decode eviction interval): P = 1; W % P == 2; W % P == P - 1 with
eviction every step; P > W."""
ALLOCATOR_PAGE_SIZES = (1, 4, 16)
SCHEDULER_VECTOR_CONFIGS = ((1, 3), (4, 7), (16, 5))
"""(page size, window) of the scheduler tier's random vectors."""
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
    """The first `count` examples with MIN_STEPS steps that a run of `machine` with `seed`
    makes (each ends with the teardown's `drain`)."""
    examples: list[tuple[dict, list[TraceStep]]] = []

    def journal(kind, payload):
        if kind == "example":
            examples.append((payload, []))
        else:
            examples[-1][1].append(payload)

    machine.journal = journal
    run_settings = settings(max_examples=2 * count, stateful_step_count=40, database=None, deadline=None,
                            suppress_health_check=list(HealthCheck))
    # the reference conforms: no failure; run_state_machine_as_test reads the seed from the class
    run_state_machine_as_test(hypothesis_seed(seed)(machine), settings=run_settings)
    return [example for example in examples if len(example[1]) >= MIN_STEPS][:count]


def seeded_traces(tier: str, machine, name: str, description: str, seed: int) -> dict[str, Trace]:
    """The first EXAMPLES_PER_CONFIG examples of a seeded run of `machine`, as traces
    `{name}-1`, `{name}-2`, ..."""
    return {f"{name}-{number}": Trace(tier, config, "reference", tuple(steps), seed, f"{name}-{number}", description)
            for number, (config, steps) in enumerate(sampled(machine, EXAMPLES_PER_CONFIG, seed), 1)}


def random_lifecycles(reference: Adapter, seed: int) -> dict[str, Trace]:
    traces = {}
    for version in TWO_POOL_VERSIONS:
        for page_size, window, interval in ENGINE_CONFIGS:
            if insert_window_at_risk(version, window, page_size):
                continue  # the version breaks I10 here by design (spec 05, WIN-2): no conformant vector
            machine = engine_machine(reference.make_engine, page_size, window, Policy(version, interval))
            traces.update(seeded_traces("engine", machine, f"lifecycle-{version}-P{page_size}-W{window}-I{interval}",
                                        f"random lifecycle, {version}, page size {page_size}, window {window}, "
                                        f"decode eviction interval {interval}", seed))
    traces.update(state_lifecycles(reference, seed))
    for page_size in ALLOCATOR_PAGE_SIZES:
        machine = allocator_machine(reference.make_allocator, page_size)
        traces.update(seeded_traces("allocator", machine, f"allocator-P{page_size}",
                                    f"random allocator operations, page size {page_size}", seed))
    return traces


def block_pool_lifecycles(reference: Adapter, seed: int) -> dict[str, Trace]:
    """[BLOCK-1 .. BLOCK-11] Random lifecycles of the shared block pool, per version and
    configuration, and in every other group layout at one configuration, with no PD-decode admission."""
    traces = {}
    for version in BLOCK_POOL_VERSIONS:
        engines = reference.for_version(version)
        for page_size, window, interval in ENGINE_CONFIGS:
            machine = engine_machine(engines.make_engine, page_size, window, Policy(version, interval),
                                     {Capability.CHUNKED_PREFILL}, engines.observables, model=engines.model)
            traces.update(seeded_traces("engine", machine, f"lifecycle-{version}-P{page_size}-W{window}-I{interval}",
                                        f"random lifecycle of a shared block pool, {version}, page size "
                                        f"{page_size}, window {window}", seed))
        for layout in LAYOUTS[1:]:  # [BLOCK-11] every other layout, at one configuration
            machine = engine_machine(engines.make_engine, 4, 6, Policy(version, 4),
                                     {Capability.CHUNKED_PREFILL, Capability.GROUP_LAYOUTS}, engines.observables,
                                     model=engines.model, layouts=(layout,))
            traces.update(seeded_traces("engine", machine, f"lifecycle-{version}-P4-W6-I4-{'+'.join(layout)}",
                                        f"random lifecycle of a shared block pool of groups {'+'.join(layout)}, "
                                        f"{version}, page size 4, window 6", seed))
    return traces


def block_pool_walkthrough() -> dict[str, Trace]:
    """The scripted trace of docs/engines/vllm.md §7 (block size 4, window 7, 63 real
    blocks, dense retention): A's prompt of 30 tokens in chunks of 8 and three decode
    steps, B admitted with a hit of 28 tokens on it, A finished, C admitted with the same
    hit on blocks A released."""
    config = engine_config_json(EngineConfig(4, 7, 128, 124, 4, Policy(VLLM_0_33_DENSE, 4)))
    prompt = [t % 5 for t in range(30)]
    steps = (step("admit", rid="A", prompt=prompt), *[step("prefill_chunk", rid="A", chunk=8, token=1)] * 4,
             *[step("decode", rid="A", token=1)] * 3, step("admit", rid="B", prompt=[*prompt[:28], 9, 9, 9]),
             step("prefill_chunk", rid="B", chunk=8, token=2), step("finish", rid="A", trim=0),
             step("admit", rid="C", prompt=[*prompt[:28], 8, 8]), step("drain"))
    return {"walkthrough-vllm-7-scripted": Trace("engine", config, "reference", steps,
                                                 description="docs/engines/vllm.md §7, the scripted trace")}


def state_walkthrough() -> dict[str, Trace]:
    """spec/09-state.md's worked example at grid 1 (so that an engine that checkpoints at
    every token boundary, as SGLang does without its extra buffer, runs it too): a
    checkpoint, a finish that donates the working state, and a later admission whose
    full-KV match the state component shortens to a checkpoint, copied on write."""
    config = engine_config_json(EngineConfig(1, 3, 64, 64, 2, Policy(SGLANG_0_5_23, 4), state_slots=5, state_grid=1))
    first, second = list(range(1, 11)), [*range(1, 10), 99]
    steps = (step("admit", rid="r1", prompt=first), step("prefill_chunk", rid="r1", chunk=8, token=0),
             step("prefill_chunk", rid="r1", chunk=2, token=50), step("decode", rid="r1", token=51),
             step("finish", rid="r1", trim=0), step("admit", rid="r2", prompt=second),
             step("prefill_chunk", rid="r2", chunk=2, token=60), step("decode", rid="r2", token=61),
             step("finish", rid="r2", trim=0), step("drain"))
    return {"walkthrough-9-state-hit": Trace("engine", config, "reference", steps,
                                             description="spec/09-state.md, worked example, at grid 1")}


def state_lifecycles(reference: Adapter, seed: int) -> dict[str, Trace]:
    """[STATE-1 .. STATE-9] Random lifecycles of full + SWA + state, one set per
    configuration of the state runs (families.STATE_CONFIGS)."""
    traces = {}
    for page_size, window, interval, grid in STATE_CONFIGS:
        machine = engine_machine(reference.make_engine, page_size, window, Policy(SGLANG_0_5_23, interval),
                                 state_grid=grid)
        traces.update(seeded_traces("engine", machine, f"state-P{page_size}-W{window}-I{interval}-G{grid}",
                                    f"random lifecycle with recurrent state, page size {page_size}, window "
                                    f"{window}, decode eviction interval {interval}, checkpoint grid {grid}", seed))
    return traces


def eviction_walkthrough() -> dict[str, Trace]:
    """spec/04-tree.md's worked example (TREE-5): two leaves below a shared node, and an
    eviction that takes one leaf and tombstones the shared node."""
    config = engine_config_json(EngineConfig(4, 8, 128, 64, 8, Policy(SGLANG_0_5_23, 4)))
    steps = [request_step for rid, prompt in (("a", PROMPT[:8]), ("b", [*PROMPT[:4], 120, 121, 122, 123]))
             for request_step in (step("admit", rid=rid, prompt=prompt),
                                  step("prefill_chunk", rid=rid, chunk=8, token=7), step("finish", rid=rid, trim=0))]
    return {"walkthrough-04-eviction": Trace("engine", config, "reference",
                                             (*steps, step("evict", full_tokens=4, swa_tokens=4), step("drain")),
                                             description="spec/04-tree.md, worked example (TREE-5)")}


def batch_walkthrough() -> dict[str, Trace]:
    """spec/06-lifecycle.md's prefill batch (LIFE-9): b's prompt the first 22 of a's 28 tokens,
    both completed in one batch, so b's checkpoint revives a tombstone a's window release made
    in the same free group. An engine whose group end reads the mapping late fails it
    (SGLang 0.5.18: docs/engines/sglang-findings.md, grouped-swa-free-remap)."""
    config = engine_config_json(EngineConfig(4, 8, 128, 64, 8, Policy(SGLANG_0_5_23, 1)))
    chunks = [{"rid": "a", "chunk": 28, "token": 7}, {"rid": "b", "chunk": 22, "token": 7}]
    steps = (step("admit", rid="a", prompt=PROMPT[:28]), step("admit", rid="b", prompt=PROMPT[:22]),
             step("prefill_batch", chunks=chunks), step("decode", rid="b", token=9), step("drain"))
    return {"walkthrough-06-prefill-batch": Trace("engine", config, "reference", steps,
                                                  description="spec/06-lifecycle.md, LIFE-9: a prefill batch")}


def scheduler_walkthrough() -> dict[str, Trace]:
    """spec/10-scheduler.md's worked example: a prefix hit on a running request's pages,
    whose shared window page the engine may release a plan late (SCHED-4)."""
    config = SchedulerConfig(page_size=4, window=7, pages=24, max_batch_size=2, max_scheduled_tokens=8)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    steps = (step("submit", rid="a", prompt=prompt, max_new_tokens=8, outputs=list(range(9, 17))),
             *[step("step")] * 4,
             step("submit", rid="b", prompt=[*prompt, 20, 21, 22], max_new_tokens=2, outputs=[30, 31]),
             *[step("step")] * 3, step("drain"))
    return {"walkthrough-10-scheduler": Trace("scheduler", scheduler_config_json(config), "reference", steps,
                                              description="spec/10-scheduler.md, worked example")}


def scheduler_lifecycles(reference: Adapter, seed: int) -> dict[str, Trace]:
    """[SCHED-1 .. SCHED-9] Random arrivals on the reference scheduler, per configuration,
    with its pool under pressure; and with a recurrent-state group beside the attention
    groups, per configuration of the scheduler+state runs (families.SCHEDULER_STATE_CONFIGS),
    replayed only by an adapter with state_group."""
    traces = {}
    for page_size, window in SCHEDULER_VECTOR_CONFIGS:
        machine = scheduler_machine(reference.make_scheduler, page_size, window)
        traces.update(seeded_traces("scheduler", machine, f"scheduler-P{page_size}-W{window}",
                                    f"random arrivals at the scheduler tier, page size {page_size}, window {window}",
                                    seed))
    for page_size, window in SCHEDULER_STATE_CONFIGS:
        machine = scheduler_machine(reference.make_scheduler, page_size, window, groups=(FULL, SWA, STATE))
        traces.update(seeded_traces("scheduler", machine, f"scheduler-state-P{page_size}-W{window}",
                                    f"random arrivals at the scheduler tier with a recurrent-state group, page "
                                    f"size {page_size}, window {window}", seed))
    return traces


def write_corpus(out: str | Path, seed: int = SEED, progress=print) -> list[Path]:
    """Write every vector, with the reference's observables and its front matter, under
    `out/conformance/` (tree.folder: by tier, memory model and policy version), then the
    index of every trace under `out` (tree.write_index): in kvspec's own tree, the
    regressions, divergences and the rest besides."""
    out = Path(out)
    reference = load_adapter("reference")
    vectors = {**walkthroughs(), **eviction_walkthrough(), **batch_walkthrough(), **state_walkthrough(),
               **block_pool_walkthrough(),
               **random_lifecycles(reference, seed), **block_pool_lifecycles(reference, seed), **scheduler_walkthrough(),
               **scheduler_lifecycles(reference, seed)}
    written = []
    for name, trace in vectors.items():
        trace = replace(with_expectations(trace, reference), label=name)
        conforms = replay(trace, reference).conforms if trace.tier == "scheduler" else all(
            s.expect is not None for s in trace.steps)  # a scheduler's plans are its own: nothing to expect
        if not conforms:
            raise RuntimeError(f"the reference does not conform on vector {name} (a kvspec bug, please report it)")
        path = with_front_matter(trace, reference).save(out / folder(trace) / f"{name}.jsonl")
        written.append(path)
        progress(f"  {path.relative_to(out).as_posix()}: {len(trace.steps)} steps")
    write_index(out, seed)
    return written
