"""The replay a reproduction is written from: the trace run on the member's adapter (built as
catalog.make_engine builds it) with SGLang recorded (reproduce_recording.py), each step
described in words and followed by the checks that apply (reproduce_checks.py)."""

import contextlib
import json
import os
from dataclasses import dataclass, replace

from kvspec.conformance.harness.protocol import PARAMETERS
from kvspec.conformance.harness.trace import Trace
from kvspec.spec.outcomes import OutOfMemory

from .catalog import Release
from .reproduce_checks import CHECKS, Check
from .reproduce_preamble import BATCH_FIELDS, HELPERS, PD_QUEUE_FIELDS
from .reproduce_recording import Namespace, Proxy, Recorder, ReproductionError, unwrap
from .reproduce_rendering import identifier, render


def recording_engine(base: type, recorder: Recorder) -> type:
    """The member's engine class, recorded: what it builds and calls at its seams is written
    as the file builds and calls it; what it reads to show kvspec its state is not recorded."""

    class Recorded(base):
        def make_cache(self):
            """The tree, over the pools themselves: what the adapter adds to them to observe
            them (add_free_page_census, before 0.5.20) is not the file's."""
            pools = self.allocator, self.req_to_token_pool
            for proxy in pools:
                recorder.names[id(proxy._target)] = proxy
            self.allocator, self.req_to_token_pool = (proxy._target for proxy in pools)
            try:
                return super().make_cache()
            finally:
                self.allocator, self.req_to_token_pool = pools

        def batch(self, reqs: list, mode: str):
            with recorder.paused():
                batch = super().batch(reqs, mode)
            fields = set(vars(batch))
            if fields != BATCH_FIELDS:
                raise ReproductionError(f"the adapter's batch() sets {sorted(fields ^ BATCH_FIELDS)} unlike "
                                        "reproduce.BATCH: bring them in step")
            for name, value in vars(batch).items():
                setattr(batch, name, unwrap(value))
            proxy = Proxy(recorder, batch)
            iteration = f", forward_iter={batch.forward_iter}" if batch.forward_iter else ""
            mode_literal = recorder.literal(batch.forward_mode)
            recorder.add(["schedule_batch(", *recorder.literal(list(reqs)), ", ", *mode_literal, iteration, ")"], proxy)
            recorder.preset[proxy] = "batch"
            return proxy

        def kv(self, req):
            with recorder.paused():
                return super().kv(req)

        if any(generation.__name__ == "Engine_0_5_14" for generation in base.__mro__):
            def start_extend(self, req, chunk_len: int):
                """The 0.5.14 shim spells the extend range per release (0.5.14 or 0.5.15): so does
                the file (EXTEND_RANGE), so that it runs on both."""
                with recorder.paused():
                    prefix_len, extend_end, fill_len = super().start_extend(req, chunk_len)
                recorder.add(["set_extend_range(", req, f", {prefix_len}, {extend_end})"])
                return prefix_len, extend_end, fill_len

        def refuse_misuse(self, operation, **args):
            with recorder.paused():
                return super().refuse_misuse(operation, **args)

        def out_of_memory(self):
            with recorder.paused():
                return super().out_of_memory()

    return Recorded


@contextlib.contextmanager
def recorded_pd_decode(recorder: Recorder):
    """pd_decode's queue and decode-radix-cache switch, as the file writes them: the queue
    built by PD_QUEUE, the switch as SGLang's own scoped override around the admission."""
    from .. import pd_decode
    build, switch = pd_decode.prealloc_queue, pd_decode.decode_radix_cache

    def prealloc_queue(engine):
        with recorder.paused():
            queue = build(engine)
        fields = set(vars(queue))
        if fields != PD_QUEUE_FIELDS:
            raise ReproductionError(f"pd_decode.prealloc_queue sets {sorted(fields ^ PD_QUEUE_FIELDS)} unlike "
                                    "reproduce.PD_QUEUE: bring them in step")
        for name, value in vars(queue).items():
            setattr(queue, name, unwrap(value))
        recorder.imported(type(queue))
        proxy = Proxy(recorder, queue)
        recorder.add(["prealloc_queue()"], proxy)
        recorder.preset[proxy] = "queue"
        return proxy

    @contextlib.contextmanager
    def decode_radix_cache():
        from sglang.srt.runtime_context import get_disagg
        recorder.imported(get_disagg)
        recorder.add(["with get_disagg().override(disaggregation_decode_enable_radix_cache=True):  "
                      + "# SGLang's decode-side radix cache on"])
        recorder.indent += 1
        try:
            with switch():
                yield
        finally:
            recorder.indent -= 1

    pd_decode.prealloc_queue, pd_decode.decode_radix_cache = prealloc_queue, decode_radix_cache
    try:
        yield
    finally:
        pd_decode.prealloc_queue, pd_decode.decode_radix_cache = build, switch


OPERATIONS = {
    "admit": "admit {rid} ({prompt_len} prompt tokens): the scheduler matches its prompt against the tree and "
             "locks the node the match ends on",
    "pd_admit": "a PD decode server takes {rid} ({prompt_len} prompt tokens, their KV computed by a prefill "
                "server): match, pre-allocate, then checkpoint the prompt into the tree",
    "prefill_chunk": "extend {rid} by its prompt's next chunk (at most {chunk} tokens), then checkpoint it into "
                     "the tree",
    "prefill_batch": "one extend batch (at most {chunks}); the requests whose prompts it completes are "
                     "checkpointed into the tree, or released if their first token ends them",
    "decode": "one decode step of {rid}",
    "finish": "{rid} finishes{stop}; its KV goes into the tree",
    "finish_batch": "one decode batch's results: {finishes} finish, each one's KV going into the tree, "
                    "inside one free group",
    "abort": "{rid} is aborted: its KV is released",
    "retract": "{rid} is retracted: its KV is released, and it waits to be admitted again",
    "evict": "evict up to {full_tokens} full and {swa_tokens} SWA tokens from the tree",
    "match": "the scheduler matches a waiting request's prompt ({prompt_len} tokens) against the tree, "
             "admitting no one (a cache-aware policy ordering its queue)",
    "flush": "the idle server flushes its cache (Scheduler.flush_cache): the tree is reset, the request "
             "and token pools cleared",
    "drain": "the end: every request is released (those decoding finish, the others are aborted), "
             "then the whole tree is evicted",
}


def describe(number: int, op: str, args: dict) -> str:
    words = dict(args, prompt_len=len(args.get("prompt") or ()),
                 chunks=", ".join(f"{chunk['rid']}: {chunk['chunk']} tokens" + (", its first token ending it"
                                                                                  if chunk.get("finish") else "")
                                  for chunk in args.get("chunks", ())),
                 finishes=", ".join(finish["rid"] + (f" (at a stop {finish['trim']} tokens back)" if finish["trim"] else "")
                                    for finish in args.get("finishes", ())),
                 stop=f" at a stop {args['trim']} tokens back" if args.get("trim") else "")
    return f"step {number}: " + OPERATIONS[op].format(**words)


@dataclass
class Recording:
    """What a replay recorded, for the file: its lines, and what the code around them needs."""

    trace: Trace
    member: str
    release: str
    config: object
    """The EngineConfig it ran (the trace's, at the member's policy version)."""
    lines: list[str]
    imports: dict[str, set[str]]
    environment: dict[str, str | None]
    tree: str
    """"legacy", "unified" (a Python tree, walked) or "rust" (a tree that cannot be walked)."""
    tree_root: str
    checks: tuple[Check, ...]
    portable: set[str]
    """The PORTABLE arguments it passes."""
    crashed: int | None
    """The step at which SGLang raised, where it did: the file ends with that call."""


def applies(check: Check, trace: Trace, tree: str) -> bool:
    ops = {step.op for step in trace.steps}
    if check.when != "step" and check.when not in ops:
        return False
    if check.when == "drain":
        return True  # a drain always ends in every page free, once (engine_driver.drain)
    if (check.needs and check.needs not in ops) or (check.trees and tree not in check.trees):
        return False
    return bool(set(check.clauses) & set(trace.violates)) and (tree not in ("rust", "chunk") or "tree_nodes" not in check.uses)


def record(trace: Trace, member: str) -> Recording:
    """Replay the trace on the member with its SGLang objects recorded (this process imports the
    member's release)."""
    from .catalog import MEMBERS
    slug = member.removeprefix("sglang@")
    if not member.startswith("sglang@") or slug not in MEMBERS:
        raise ReproductionError(f"{member!r} is no member of the sglang@ family (catalog.py): e.g. sglang@0.5.18")
    if trace.tier != "engine":
        raise ReproductionError(f"a reproduction is written from an engine-tier trace; this one is {trace.tier}-tier")
    if trace.engine_config().state_slots:
        raise ReproductionError("a trace with recurrent state is not written as a reproduction (yet)")
    adapter = MEMBERS[slug]  # makes its release this process's SGLang
    engine, recorder = build(adapter, trace)
    base = type(engine).__mro__[1]
    environment = {name: os.environ.get(name) for name in ("SGLANG_SWA_EVICTION_INTERVAL", *base.ENVIRONMENT)}
    config = engine.config
    cache = engine.cache._target
    tree = ("chunk" if adapter.tree == "chunk" else  # no prefix tree: the file reads no node
            "legacy" if type(cache).__name__ == "SWARadixCache" else
            "rust" if type(getattr(cache, "tree_core", None)).__module__.endswith("rust_tree_core.adapter") else
            "unified")
    tree_root = "tree_cache.tree_core.root_node" if hasattr(cache, "tree_core") else "tree_cache.root_node"
    checks = tuple(check for check in CHECKS if applies(check, trace, tree))
    names: dict[str, str] = {}
    crashed, invoked = None, set()
    for number, step in enumerate(trace.steps, 1):
        recorder.comment()
        recorder.comment(describe(number, step.op, step.args))
        if step.refuse:
            recorder.comment("(a call the lifecycle forbids: kvspec's adapter refuses it before SGLang is called)")
            continue
        try:
            with recorder.on(), recorded_pd_decode(recorder):
                outcome = drain(engine, recorder) if step.op == "drain" else \
                    getattr(engine, step.op)(*(step.args[name] for name in PARAMETERS[step.op]))
        except Exception as error:
            if not any(statement.raised is error for statement in recorder.statements):
                raise ReproductionError(f"step {number} ({step.op}) failed in kvspec's adapter, not in SGLang: "
                                        f"{type(error).__name__}: {error}") from error
            crashed = number
            break
        for rid, req in engine.requests.items():
            if req not in recorder.preset:
                recorder.preset[req] = names.setdefault(rid, identifier(rid, set(names.values())))
        if isinstance(outcome, OutOfMemory):
            recorder.comment(f"(out of memory: {outcome}; the scheduler would not run this step)")
        after = json.dumps(f"after step {number} ({step.op})")
        if any(check.when == "step" for check in checks):
            recorder.add([f"check({after}, ", *recorder.literal(list(engine.requests.values())), ")"])
            invoked.update(check for check in checks if check.when == "step")
        for check in checks:
            if check.when == "pd_admit" == step.op and step.args["rid"] in engine.requests:
                req = engine.requests[step.args["rid"]]
                recorder.add([f"{check.function}({after}, ", req, f", {engine.kv(req).protected})"])
                invoked.add(check)
            elif check.when == "drain" == step.op:
                recorder.add([f"{check.function}({after})"])
                invoked.add(check)
    return Recording(trace, member, adapter.release, config, render(recorder.statements, recorder.preset),
                     recorder.imports, environment, tree, tree_root,
                     tuple(check for check in checks if check in invoked), recorder.portable, crashed)


def build(adapter, trace: Trace):
    """The member's engine, as its adapter builds it (catalog.make_engine), of its recorded
    class, with what it builds recorded: the server arguments, the pools, the tree."""
    from .. import runtime
    from . import catalog
    from .api_0_5_21 import use_cpu_kernels
    config = trace.engine_config()
    config = replace(config, policy=replace(config.policy, version=adapter.policy_version))
    base = catalog.engine_class(Release(adapter.release), adapter.tree)  # its shim first: it may register what runs before import
    s = runtime.sglang()
    use_cpu_kernels(s)  # before the engine sees SGLang through a Namespace (a no-op from 0.5.22)
    recorder = Recorder(s.torch)
    classes, runtime.SGLANG = catalog.engine_class, Namespace(recorder, s)
    catalog.engine_class = lambda release, tree=None: recording_engine(base, recorder)
    try:
        with recorder.on():
            engine = adapter.make_engine(config)
    finally:
        catalog.engine_class, runtime.SGLANG = classes, s
    recorder.add([HELPERS])
    for proxy, name in ((engine.allocator, "allocator"), (engine.req_to_token_pool, "req_to_token_pool"),
                        (engine.cache, "tree_cache")):
        recorder.preset[proxy] = name
    return engine, recorder


def drain(engine, recorder: Recorder) -> None:
    """kvspec's drain (engine_driver.py): finish every decoding request, abort the others, then
    evict the whole tree."""
    for rid in sorted(engine.requests):
        finished = rid in engine.finished_prefill
        recorder.comment(f"{rid} {'finishes' if finished else 'is aborted'}")
        engine.finish(rid, 0) if finished else engine.abort(rid)
    recorder.comment("evict the whole tree")
    engine.evict(engine.config.size_full, engine.config.size_swa)
