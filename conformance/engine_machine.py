"""The engine-tier state machine: random request lifecycles against any engine, every
invariant of kvspec.spec.invariants checked after every step.

`engine_machine(make_engine, page_size, window, policy)` returns a Hypothesis
`RuleBasedStateMachine` class. Requests share prefixes (prompts grow from a few common
stems over a tiny token alphabet), are admitted interleaved, prefilled in chunks,
decoded past their window several times, finished (some with a stop that leaves
over-allocated KV), aborted, retracted and admitted again, or pre-allocated as
PD-decode requests; the pools are small, so allocations evict from the prefix cache and
sometimes fail. Misuse (unknown requests, finishing twice, decoding during prefill) must
be refused with InvalidRequest. Every call is `note()`d.

`make_engine(config)` must return an object with the engine operations of
kvspec.adapters.reference.ReferenceEngineAdapter and `snapshot()`.
"""

import sys
from typing import Callable

from hypothesis import note, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvspec.spec.invariants import engine_violations
from kvspec.spec.outcomes import InvalidRequest, OutOfMemory
from kvspec.spec.snapshot import EngineConfig, Step
from kvspec.spec.window import Policy

from .allocator_machine import InvariantViolation

ALPHABET = st.integers(0, 2)


def engine_machine(make_engine: Callable, page_size: int, window: int, policy: Policy) -> type[RuleBasedStateMachine]:
    P, W = page_size, window
    longest_prompt = 2 * W + 4 * P

    class EngineMachine(RuleBasedStateMachine):
        examples = 0
        steps = 0

        @initialize(full_pages=st.integers(4, 24), swa_pages=st.integers(3, 16),
                    stems=st.lists(st.lists(ALPHABET, min_size=P, max_size=longest_prompt), min_size=1, max_size=3))
        def build(self, full_pages, swa_pages, stems):
            type(self).examples += 1
            # the full pool holds at least the longest request a step can grow
            full_pages = max(full_pages, (longest_prompt + 3 * W) // P + 2)
            self.config = EngineConfig(page_size=P, window=W, size_full=full_pages * P,
                                       size_swa=swa_pages * P, max_requests=4, policy=policy)
            note(f"make_engine({self.config})")
            self.engine = make_engine(self.config)
            self.stems = stems
            self.next_id = 0
            self.prefilling: set[str] = set()
            self.decoding: set[str] = set()
            self.retracted: set[str] = set()
            self.previous = self.engine.snapshot()
            self.step: Step | None = None

        # -- helpers ----------------------------------------------------------------------

        def call(self, operation: str, rid: str | None, *args):
            note(f"{operation}{(rid, *args) if rid is not None else args}")
            outcome = getattr(self.engine, operation)(*(() if rid is None else (rid,)), *args)
            self.step = Step(operation, rid, type(outcome).__name__ if isinstance(outcome, OutOfMemory) else "ok")
            if isinstance(outcome, OutOfMemory):
                note(f"  -> {outcome}")
            return outcome

        def refused(self, operation: str, *args):
            before = self.engine.snapshot()
            try:
                self.call(operation, *args)
            except InvalidRequest as error:
                note(f"  refused: {error}")
            else:
                raise InvariantViolation(f"[LIFE-1] {operation}{args} was accepted but the lifecycle forbids it")
            self.step = None
            assert self.engine.snapshot() == before, f"[LIFE-1] refused {operation} changed the engine"

        def new_rid(self) -> str:
            self.next_id += 1
            return f"r{self.next_id}"

        def prompt(self, data) -> list[int]:
            stem = data.draw(st.sampled_from(self.stems))
            length = data.draw(st.integers(1, longest_prompt))
            keep = data.draw(st.integers(0, min(len(stem), length)))
            tail = data.draw(st.lists(ALPHABET, min_size=length - keep, max_size=length - keep))
            return stem[:keep] + tail

        def running(self) -> int:
            return len(self.prefilling) + len(self.decoding)

        # -- lifecycle --------------------------------------------------------------------

        @precondition(lambda self: self.running() < 4)
        @rule(data=st.data())
        def admit(self, data):
            rid = self.new_rid()
            if self.call("admit", rid, self.prompt(data)) is None:
                self.prefilling.add(rid)

        @precondition(lambda self: self.running() < 4 and P > 1)
        @rule(data=st.data(), first_output=ALPHABET)
        def pd_admit(self, data, first_output):
            rid = self.new_rid()
            if self.call("pd_admit", rid, self.prompt(data), first_output) is None:
                self.decoding.add(rid)

        @precondition(lambda self: self.prefilling)
        @rule(data=st.data(), chunk=st.integers(1, 2 * W + 2 * P), token=ALPHABET)
        def prefill_chunk(self, data, chunk, token):
            rid = data.draw(st.sampled_from(sorted(self.prefilling)))
            if self.call("prefill_chunk", rid, chunk, token) is None:
                view = next(r for r in self.engine.snapshot().requests if r.rid == rid)
                if view.finished_prefill:
                    self.prefilling.remove(rid)
                    self.decoding.add(rid)

        @precondition(lambda self: self.decoding)
        @rule(data=st.data(), steps=st.integers(1, 2 * W + 8), token=ALPHABET)
        def decode(self, data, steps, token):
            """Several decode steps of one request (each checked), to slide past the window."""
            rid = data.draw(st.sampled_from(sorted(self.decoding)))
            for _ in range(steps):
                view = next(r for r in self.previous.requests if r.rid == rid)
                if view.seq_len + 2 > self.config.size_full:
                    break
                if self.call("decode", rid, token) is not None:
                    break
                self.check()

        @precondition(lambda self: self.decoding)
        @rule(data=st.data(), stop=st.booleans())
        def finish(self, data, stop):
            rid = data.draw(st.sampled_from(sorted(self.decoding)))
            view = next(r for r in self.previous.requests if r.rid == rid)
            trim = data.draw(st.integers(0, min(2 * P, view.kv_committed_len - view.cache_protected_len))) if stop else 0
            self.call("finish", rid, trim)
            self.decoding.remove(rid)

        @precondition(lambda self: self.running())
        @rule(data=st.data(), retract=st.booleans())
        def abort_or_retract(self, data, retract):
            rid = data.draw(st.sampled_from(sorted(self.prefilling | self.decoding)))
            self.call("retract" if retract else "abort", rid)
            self.prefilling.discard(rid)
            self.decoding.discard(rid)
            if retract:
                self.retracted.add(rid)

        @precondition(lambda self: self.retracted and self.running() < 4)
        @rule(data=st.data())
        def readmit(self, data):
            rid = data.draw(st.sampled_from(sorted(self.retracted)))
            if self.call("admit", rid, None) is None:
                self.retracted.remove(rid)
                self.prefilling.add(rid)

        @rule(full=st.integers(0, 6), swa=st.integers(0, 6))
        def evict(self, full, swa):
            self.call("evict", None, full * P, swa * P)

        # -- misuse: refused, nothing changes ---------------------------------------------

        @rule()
        def decode_unknown_request(self):
            self.refused("decode", "nobody", 0)

        @precondition(lambda self: self.prefilling)
        @rule(data=st.data())
        def decode_during_prefill(self, data):
            self.refused("decode", data.draw(st.sampled_from(sorted(self.prefilling))), 0)

        @precondition(lambda self: self.next_id > 0)
        @rule(data=st.data())
        def finish_twice(self, data):
            rid = f"r{data.draw(st.integers(1, self.next_id))}"
            if rid not in self.decoding:
                self.refused("finish", rid, 0)

        # -- invariants -------------------------------------------------------------------

        @invariant()
        def check(self):
            type(self).steps += 1
            now = self.engine.snapshot()
            violations = engine_violations(self.previous, self.step, now)
            if violations:
                raise InvariantViolation(f"after {self.step}:\n" + "\n".join(map(str, violations)))
            self.previous, self.step = now, None

        def teardown(self):
            """Drain to empty: release every request, evict the whole cache: every page free."""
            if not hasattr(self, "engine") or sys.exc_info()[1] is not None:
                return  # a step already failed: its report must not be hidden by the drain's
            for rid in sorted(self.decoding):
                self.call("finish", rid, 0)
                self.check()
            for rid in sorted(self.prefilling):
                self.call("abort", rid)
                self.check()
            self.call("evict", None, self.config.size_full, self.config.size_swa)
            self.check()
            state = self.engine.snapshot().allocator
            leaked = (state.full.num_pages - len(state.full.free_pages), state.swa.num_pages - len(state.swa.free_pages))
            if leaked != (0, 0):
                raise InvariantViolation(f"[I2, I3] after releasing every request and evicting the whole cache, "
                                         f"{leaked[0]} full and {leaked[1]} SWA pages are not free (leak)")

    EngineMachine.__name__ = EngineMachine.__qualname__ = f"EngineMachine_P{P}_W{W}_{policy.version}"
    return EngineMachine
