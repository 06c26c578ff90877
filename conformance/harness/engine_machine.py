"""The engine-tier state machine: random request lifecycles against any engine, every
invariant of kvspec.spec.invariants checked after every step.

`engine_machine(make_engine, page_size, window, policy)` returns a Hypothesis
`RuleBasedStateMachine` class. Requests share prefixes (prompts grow from a few common
stems over a tiny token alphabet), are admitted interleaved, prefilled in chunks,
decoded past their window several times, finished (some with a stop that leaves
over-allocated KV), aborted, retracted and admitted again, or pre-allocated as
PD-decode requests; the pools are small, so allocations evict from the prefix cache and
sometimes fail. Misuse (unknown requests, finishing twice, decoding during prefill) must
be refused with InvalidRequest. Every step is `note()`d and recorded (see trace.py).

`make_engine(config)` must return an object with kvspec.conformance.harness.protocol's
ENGINE_OPERATIONS. Capabilities the adapter lacks turn rules off: without `pd_decode`
no PD-decode admissions (without `pd_checkpoint_keeps_window`, none at windows where an
admission checkpoint over WIN-6's tail is short of a window: SGL-11), without
`short_leaf_checkpoints` no prefill ends where its checkpoint leaves a short leaf, without
`chunked_prefill` every prefill is one chunk, without `batched_prefill` every prefill
step is one request's, without `batched_finish` every finish step is, without `flush` no
run flushes, without `waiting_matches` every match is an admission's, without
`group_layouts` every block-pool engine has one full and one sliding-window group. With
`shadow` (another adapter, the reference by default) every step also runs on it, and the
observables the spec fixes must agree (differential.py).
"""

from collections.abc import Callable, Iterable

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvspec.spec.models import BLOCK_POOL, TWO_POOL, MemoryModel, model_for
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.state import min_state_slots
from kvspec.spec.window import (
    EVERY_GROUP,
    FULL,
    SWA,
    Policy,
    checkpoint_leaves_short_leaf,
    insert_window_at_risk,
    pd_checkpoint_at_risk,
)

from .declarations import Capability
from .differential import DifferentialDriver
from .engine_driver import EngineDriver
from .recording import RecordingMachine
from .trace import engine_config_json

ALPHABET = st.integers(0, 2)
ALL = frozenset({Capability.PD_DECODE, Capability.PD_CHECKPOINT_KEEPS_WINDOW, Capability.CHUNKED_PREFILL,
                 Capability.SHORT_LEAF_CHECKPOINTS})
MAX_REQUESTS = 4
LAYOUTS = (EVERY_GROUP, (FULL,), (SWA,), (FULL, SWA, SWA), (FULL, FULL, SWA))
"""[BLOCK-11] The layouts a block-pool run draws (with `group_layouts`): one group of each
kind, full attention only, a window only, several groups of one kind."""


def engine_machine(make_engine: Callable, page_size: int, window: int, policy: Policy,
                   capabilities: Iterable[str] = ALL, observables: Iterable[str] = TWO_POOL.observables,
                   shadow=None, model: MemoryModel = TWO_POOL, state_grid: int | None = None,
                   layouts: tuple[tuple[str, ...], ...] = LAYOUTS) -> type[RecordingMachine]:
    """With `state_grid`, every engine has a recurrent-state pool (chapter 09) of a few
    slots more than it must have at least, with that checkpoint grid. With `group_layouts`,
    a block-pool engine has one of `layouts` (BLOCK-11)."""
    P, W, G = page_size, window, state_grid
    capabilities = frozenset(capabilities)
    longest_prompt = 2 * W + 4 * P
    # Without short_leaf_checkpoints, where the policy lets a checkpoint leave a leaf short of a
    # window, prompts and chunks end where each checkpoint keeps one: an engine that matches again
    # after such an insert (SGLang 0.5.15 - 0.5.22) would meet that recorded bug in every run. The
    # steering draws nothing, so every other adapter's runs draw as before.
    steer_short_leaves = (Capability.SHORT_LEAF_CHECKPOINTS not in capabilities and policy.chunk_release
                          and Capability.CHUNKED_PREFILL in capabilities
                          and insert_window_at_risk(policy.version, W, P))

    class EngineMachine(RecordingMachine):
        tier = "engine"

        def build_engine(self, full_pages, swa_pages, stems, max_requests=MAX_REQUESTS, spare_state_slots=None,
                         layout=EVERY_GROUP):
            # the full pool holds at least the longest request a step can grow
            full_pages = max(full_pages, (longest_prompt + 3 * W) // P + 2)
            state_slots = 0 if spare_state_slots is None else min_state_slots(max_requests) + spare_state_slots
            self.config = EngineConfig(page_size=P, window=W, size_full=full_pages * P, size_swa=swa_pages * P,
                                       max_requests=max_requests, policy=policy, state_slots=state_slots,
                                       state_grid=G or 1, layout=layout)
            note(f"make_engine({self.config})")
            self.start_example(engine_config_json(self.config))
            engine = make_engine(self.config)
            self.stems = stems
            self.next_id = 0
            self.prefilling: set[str] = set()
            self.decoding: set[str] = set()
            self.retracted: dict[str, int] = {}  # each retracted request's tokens
            self.prompts: list[list[int]] = []  # every prompt admitted: what a waiting match often follows
            driver = EngineDriver(engine, model_for(model, self.config), self.observables, log=note)
            if shadow is not None:  # differential mode: the other adapter takes every step too
                driver = DifferentialDriver(driver, EngineDriver(shadow.make_engine(self.config),
                                                                 model_for(shadow.model, self.config), shadow.observables),
                                            shadow.name)
            self.driver = driver

        POOLS = dict(full_pages=st.integers(4, 24), swa_pages=st.integers(3, 16),
                     stems=st.lists(st.lists(ALPHABET, min_size=P, max_size=longest_prompt), min_size=1, max_size=3))
        if Capability.GROUP_LAYOUTS in capabilities and model.name == BLOCK_POOL.name:
            POOLS["layout"] = st.sampled_from(layouts)
        if G is None:
            build = initialize(**POOLS)(build_engine)
        else:  # a tight state pool: at most a few unlocked checkpoints fit beside the locked ones,
            # fewest when few requests may run (each new checkpoint then evicts an older one)
            build = initialize(**POOLS, max_requests=st.integers(1, MAX_REQUESTS),
                               spare_state_slots=st.integers(0, 2))(build_engine)

        # -- helpers ----------------------------------------------------------------------

        def new_rid(self) -> str:
            self.next_id += 1
            return f"r{self.next_id}"

        def prompt(self, data) -> list[int]:
            stem = data.draw(st.sampled_from(self.stems))
            length = data.draw(st.integers(1, longest_prompt))
            # often the whole stem up to `length`: a prompt that follows a cached path as far
            # as it goes, through its tombstones (where a match must find W live tokens)
            keep = data.draw(st.just(min(len(stem), length)) | st.integers(0, min(len(stem), length)))
            tail = data.draw(st.lists(ALPHABET, min_size=length - keep, max_size=length - keep))
            prompt = stem[:keep] + tail
            while steer_short_leaves and len(prompt) > 1 and self.short_leaf_at(len(prompt), 0, 0):
                prompt = prompt[:-1]  # its last checkpoint, from a fresh request, keeps a window
            return prompt

        def short_leaf_at(self, up_to: int, cursor: int, protected: int) -> bool:
            fits = cursor % P == 0 and protected % P == 0 and cursor <= protected < up_to  # the definition's pre
            return fits and checkpoint_leaves_short_leaf(up_to, cursor, protected, W, P, policy.version)

        def steered_chunk(self, rid: str, chunk: int) -> int:
            """The longest chunk up to `chunk` whose checkpoint keeps a window (`steer_short_leaves`),
            or `chunk` itself where none does (the prompt's own end may not)."""
            if not steer_short_leaves:
                return chunk
            view = self.view(rid)
            for size in range(chunk, 0, -1):
                up_to = min(view.kv_committed_len + size, view.seq_len)
                if not self.short_leaf_at(up_to, view.swa_evicted_seqlen, view.cache_protected_len):
                    return size
            return chunk

        def running(self) -> int:
            return len(self.prefilling) + len(self.decoding)

        def view(self, rid: str):
            """The request `rid` as the last snapshot showed it; None where it shows none (an
            admission not yet extended may show no request)."""
            return next((r for r in self.driver.previous.requests if r.rid == rid), None)

        # -- lifecycle --------------------------------------------------------------------

        @precondition(lambda self: self.running() < self.config.max_requests)
        @rule(data=st.data())
        def admit(self, data):
            rid = self.new_rid()
            prompt = self.prompt(data)
            self.prompts.append(prompt)
            if self.run("admit", rid=rid, prompt=prompt)["outcome"] == "ok":
                self.prefilling.add(rid)

        @precondition(lambda self: self.running() < self.config.max_requests and P > 1
                      and Capability.PD_DECODE in self.capabilities
                      and (Capability.PD_CHECKPOINT_KEEPS_WINDOW in self.capabilities or not pd_checkpoint_at_risk(W, P)))
        @rule(data=st.data(), first_output=ALPHABET)
        def pd_admit(self, data, first_output):
            rid = self.new_rid()
            prompt = self.prompt(data)
            self.prompts.append(prompt)
            if self.run("pd_admit", rid=rid, prompt=prompt, first_output=first_output)["outcome"] == "ok":
                self.decoding.add(rid)

        @precondition(lambda self: self.prefilling)
        @rule(data=st.data(), chunk=st.integers(1, 2 * W + 2 * P), token=ALPHABET)
        def prefill_chunk(self, data, chunk, token):
            rid = data.draw(st.sampled_from(sorted(self.prefilling)))
            if Capability.CHUNKED_PREFILL not in self.capabilities:
                chunk = longest_prompt + 3 * W  # the whole prompt at once
            elif G is not None:  # often to the grid, where a checkpoint is taken (STATE-3)
                chunk = data.draw(st.just(chunk) | st.integers(1, 3).map(lambda k: k * G))
            chunk = self.steered_chunk(rid, chunk)
            if self.run("prefill_chunk", rid=rid, chunk=chunk, token=token)["outcome"] == "ok" \
                    and self.view(rid).finished_prefill:
                self.prefilling.remove(rid)
                self.decoding.add(rid)

        def prefill_batch(self, data):
            """One chunk of each of several prefilling requests in one step (LIFE-9), often each
            to the end of its prompt: requests sharing a prefix then checkpoint in one free group,
            and a request whose chunk completes its prompt may end there (its first token a stop),
            released in the group among the others' checkpoints."""
            rids = data.draw(st.lists(st.sampled_from(sorted(self.prefilling)), min_size=2, unique=True))
            whole = longest_prompt + 3 * W
            chunked = Capability.CHUNKED_PREFILL in capabilities
            sizes = st.just(whole) | st.integers(1, 2 * W + 2 * P) if chunked else st.just(whole)
            chunks = []
            for rid in rids:
                chunk = {"rid": rid, "chunk": self.steered_chunk(rid, data.draw(sizes)), "token": data.draw(ALPHABET)}
                view = self.view(rid)
                if view is not None and view.kv_committed_len + chunk["chunk"] >= view.seq_len \
                        and data.draw(st.booleans()):
                    chunk["finish"] = True
                chunks.append(chunk)
            if self.run("prefill_batch", chunks=chunks)["outcome"] == "ok":
                for chunk in chunks:
                    rid = chunk["rid"]
                    if chunk.get("finish"):
                        self.prefilling.remove(rid)
                    elif self.view(rid).finished_prefill:
                        self.prefilling.remove(rid)
                        self.decoding.add(rid)

        if Capability.BATCHED_PREFILL in capabilities:  # a rule, even one never enabled, would change every run's draws
            prefill_batch = precondition(lambda self: len(self.prefilling) >= 2)(rule(data=st.data())(prefill_batch))

        @precondition(lambda self: self.decoding)
        @rule(data=st.data(), steps=st.integers(1, 2 * W + 8), token=ALPHABET)
        def decode(self, data, steps, token):
            """Several decode steps of one request (each checked), to slide past the window."""
            rid = data.draw(st.sampled_from(sorted(self.decoding)))
            for _ in range(steps):
                if self.view(rid).seq_len + 2 > self.config.size_full:
                    break
                if self.run("decode", rid=rid, token=token)["outcome"] != "ok":
                    break

        @precondition(lambda self: self.decoding)
        @rule(data=st.data(), stop=st.booleans())
        def finish(self, data, stop):
            rid = data.draw(st.sampled_from(sorted(self.decoding)))
            self.run("finish", rid=rid, trim=self.trim(data, rid, stop))
            self.decoding.remove(rid)

        def trim(self, data, rid: str, stop: bool) -> int:
            view = self.view(rid)
            # a stop lies among the outputs whose KV is written: one per decode step; the
            # deepest one is drawn often, as it leaves whole pages over-allocated (LIFE-5)
            most = min(2 * P, view.decode_steps, view.kv_committed_len - view.cache_protected_len)
            if G is not None and Capability.RELEASES_STATE_AT_STOP not in self.capabilities:
                most = 0  # the engine keeps a state that has read past the stop (STATE-3, SGL-10): not drawn
            return data.draw(st.just(most) | st.integers(0, most)) if stop else 0

        def finish_batch(self, data):
            """The requests one decode batch finishes (LIFE-10), each with a stop drawn as `finish`
            draws it, released inside one free group: requests that share a cached path then
            insert it, and free what they own, while the others' frees are still queued."""
            rids = data.draw(st.lists(st.sampled_from(sorted(self.decoding)), min_size=2, unique=True))
            finishes = [{"rid": rid, "trim": self.trim(data, rid, data.draw(st.booleans()))} for rid in rids]
            self.run("finish_batch", finishes=finishes)
            self.decoding.difference_update(rids)

        if Capability.BATCHED_FINISH in capabilities:  # as prefill_batch: a rule changes every run's draws
            finish_batch = precondition(lambda self: len(self.decoding) >= 2)(rule(data=st.data())(finish_batch))

        @precondition(lambda self: self.running())
        @rule(data=st.data(), retract=st.booleans())
        def abort_or_retract(self, data, retract):
            rid = data.draw(st.sampled_from(sorted(self.prefilling | self.decoding)))
            view = self.view(rid)
            tokens = view.seq_len if view is not None else 0  # what its readmission prefills again
            self.run("retract" if retract else "abort", rid=rid)
            self.prefilling.discard(rid)
            self.decoding.discard(rid)
            if retract:
                self.retracted[rid] = tokens

        def flush(self):
            """[LIFE-11] An idle server's cache flush: every page free after it. With a request
            running it is misuse, which the engine must refuse, changing nothing."""
            self.run("flush", refuse=bool(self.running()))

        if Capability.FLUSH in capabilities:  # as prefill_batch: a rule changes every run's draws
            flush = precondition(lambda self: self.next_id > 0)(rule()(flush))

        def match(self, data):
            """[LIFE-12] A waiting request's prompt matched by the scheduler before it admits
            anyone: often an earlier prompt cut short and run on, so that the match follows a
            cached path and ends inside one of its nodes, where the tree splits it."""
            earlier = data.draw(st.sampled_from(self.prompts))
            keep = data.draw(st.integers(1, len(earlier)))
            prompt = earlier[:keep] + data.draw(st.lists(ALPHABET, max_size=2 * P)) \
                if data.draw(st.booleans()) else self.prompt(data)
            self.run("match", prompt=prompt)

        if Capability.WAITING_MATCHES in capabilities:
            match = precondition(lambda self: self.prompts)(rule(data=st.data())(match))

        @precondition(lambda self: self.retracted and self.running() < self.config.max_requests)
        @rule(data=st.data())
        def readmit(self, data):
            rid = data.draw(st.sampled_from(sorted(self.retracted)))
            if steer_short_leaves and self.short_leaf_at(self.retracted[rid], 0, 0):
                return  # the last checkpoint of its prefill would leave a short leaf (steer_short_leaves)
            if self.run("admit", rid=rid, prompt=None)["outcome"] == "ok":
                del self.retracted[rid]
                self.prefilling.add(rid)

        @rule(full=st.integers(0, 6), swa=st.integers(0, 6))
        def evict(self, full, swa):
            self.run("evict", full_tokens=full * P, swa_tokens=swa * P)

        # -- misuse: refused, nothing changes ---------------------------------------------

        @rule()
        def decode_unknown_request(self):
            self.run("decode", refuse=True, rid="nobody", token=0)

        @precondition(lambda self: self.prefilling)
        @rule(data=st.data())
        def decode_during_prefill(self, data):
            self.run("decode", refuse=True, rid=data.draw(st.sampled_from(sorted(self.prefilling))), token=0)

        @precondition(lambda self: self.next_id > 0)
        @rule(data=st.data())
        def finish_twice(self, data):
            rid = f"r{data.draw(st.integers(1, self.next_id))}"
            if rid not in self.decoding:
                self.run("finish", refuse=True, rid=rid, trim=0)

    EngineMachine.capabilities = capabilities
    EngineMachine.observables = frozenset(observables)
    EngineMachine.reset_counters()
    EngineMachine.__name__ = EngineMachine.__qualname__ = f"EngineMachine_P{P}_W{W}_{policy.version}"
    return EngineMachine
