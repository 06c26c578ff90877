"""The allocator-tier state machine: random operation sequences against any hybrid
allocator, every invariant checked after every step.

`allocator_machine(make_allocator, page_size)` returns a Hypothesis
`RuleBasedStateMachine` class. The machine plays the allocator's caller: it holds
sequences (rows of full slots, as requests and tree nodes do), grows them, forks them
at a page-aligned prefix, releases SWA KV from their front as window eviction does, and
frees them. It also tries what a buggy caller would do (double frees, the padding page,
unaligned segments, full frees with live SWA peers) and asserts each is refused with a
spec error and changes nothing. Every call is `note()`d, so a failure prints the exact
calls that reproduce it.

`make_allocator(size_full, size_swa, page_size)` must return an object with the
allocator operations of kvspec.adapters.reference.ReferenceAllocatorAdapter.
"""

import sys
from dataclasses import dataclass
from typing import Callable

from hypothesis import note, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvspec.spec.accounting import HeldSequence, allocator_violations
from kvspec.spec.allocator import new_pages_available, swa_tail_split
from kvspec.spec.outcomes import KvSpecError, OutOfMemory
from kvspec.spec.pages import floor_page, new_pages_for_decode, new_pages_for_extend


@dataclass
class Sequence:
    """One run of positions the machine holds (see spec.accounting.HeldSequence)."""

    row: list[int]
    first: int = 0
    swa_live_from: int = 0

    def held(self) -> HeldSequence:
        return HeldSequence(tuple(self.row[self.first:]), self.first, self.swa_live_from)

    @property
    def live_from(self) -> int:
        return max(self.first, self.swa_live_from)


class InvariantViolation(AssertionError):
    """An implementation broke a clause; the message lists every violation."""


def allocator_machine(make_allocator: Callable, page_size: int) -> type[RuleBasedStateMachine]:
    P = page_size
    lengths = st.integers(1, 3 * P + 1)

    class AllocatorMachine(RuleBasedStateMachine):
        examples = 0  # how many runs and checked steps this class saw, for reports
        steps = 0

        @initialize(full_pages=st.integers(2, 8), swa_pages=st.integers(1, 8))
        def build(self, full_pages, swa_pages):
            self.sequences: list[Sequence] = []
            self.group_open = False
            type(self).examples += 1
            note(f"make_allocator(size_full={full_pages * P}, size_swa={swa_pages * P}, page_size={P})")
            self.allocator = make_allocator(full_pages * P, swa_pages * P, P)

        # -- helpers --------------------------------------------------------------

        def call(self, operation: str, *args):
            note(f"{operation}{args}")
            return getattr(self.allocator, operation)(*args)

        def free_counts(self) -> tuple[int, int]:
            state = self.allocator.state()
            return len(state.full.free_pages), len(state.swa.free_pages)

        def expect_allocation(self, result, full_pages: int, swa_pages: int, before, new_tokens: int):
            """[ALLOC-2, ALLOC-4] Fails exactly when a pool is short, and then changes nothing."""
            fits = new_pages_available(full_pages, swa_pages, len(before.full.free_pages), len(before.swa.free_pages))
            if isinstance(result, OutOfMemory):
                assert not fits, f"[ALLOC-2] OutOfMemory although both pools had room: {result}"
                assert self.allocator.state() == before, "[ALLOC-4] a failed allocation changed the allocator"
                return None
            assert fits, f"[ALLOC-2] allocation of {full_pages} full / {swa_pages} SWA pages succeeded without room"
            assert len(result) == new_tokens, f"[ALLOC-1] asked for {new_tokens} slots, got {len(result)}"
            return list(result)

        def expect_refusal(self, operation: str, *args):
            """[ALLOC-5, ALLOC-6] An invalid call raises a spec error and changes nothing."""
            before = self.allocator.state()
            try:
                self.call(operation, *args)
            except KvSpecError as error:
                note(f"  refused: {error}")
            else:
                raise InvariantViolation(f"[ALLOC-6] {operation}{args} was accepted, but it frees what is not held")
            assert self.allocator.state() == before, f"[ALLOC-6] refused {operation} changed the allocator"

        def pick(self, data) -> Sequence:
            return self.sequences[data.draw(st.integers(0, len(self.sequences) - 1))]

        # -- allocation -----------------------------------------------------------

        @rule(length=lengths)
        def new_sequence(self, length):
            before = self.allocator.state()
            result = self.call("alloc_extend", [0], [length], [-1])
            pages = new_pages_for_extend(0, length, P)
            row = self.expect_allocation(result, pages, pages, before, length)
            if row is not None:
                self.sequences.append(Sequence(row))

        @precondition(lambda self: P == 1)
        @rule(length=lengths)
        def alloc_tokens(self, length):
            before = self.allocator.state()
            row = self.expect_allocation(self.call("alloc", length), length, length, before, length)
            if row is not None:
                self.sequences.append(Sequence(row))

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), grow=st.lists(lengths, min_size=1, max_size=3))
        def extend(self, data, grow):
            chosen = data.draw(st.lists(st.integers(0, len(self.sequences) - 1), min_size=len(grow),
                                        max_size=len(grow), unique=True)) if len(self.sequences) >= len(grow) else [0]
            grow = grow[:len(chosen)]
            seqs = [self.sequences[i] for i in chosen]
            prefix = [len(s.row) for s in seqs]
            seq_lens = [p + g for p, g in zip(prefix, grow)]
            last = [s.row[-1] if s.row else -1 for s in seqs]
            before = self.allocator.state()
            result = self.call("alloc_extend", prefix, seq_lens, last)
            pages = sum(new_pages_for_extend(p, n, P) for p, n in zip(prefix, seq_lens))
            slots = self.expect_allocation(result, pages, pages, before, sum(grow))
            if slots is not None:
                for s, g in zip(seqs, grow):
                    s.row.extend(slots[:g])
                    slots = slots[g:]

        @precondition(lambda self: self.sequences)
        @rule(data=st.data())
        def decode(self, data):
            s = self.pick(data)
            seq_len = len(s.row) + 1
            before = self.allocator.state()
            result = self.call("alloc_decode", [seq_len], [s.row[-1]])
            pages = new_pages_for_decode(seq_len, P)
            slots = self.expect_allocation(result, pages, pages, before, 1)
            if slots is not None:
                s.row.extend(slots)

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), prefix_pages=st.integers(0, 3), length=lengths, use_tail=st.booleans())
        def fork(self, data, prefix_pages, length, use_tail):
            """A new sequence on a page-aligned prefix of another (a prefix-cache hit),
            grown by a plain extend or by the PD-decode SWA-tail pre-allocation."""
            parent = self.pick(data)
            prefix = min(prefix_pages * P, floor_page(len(parent.row), P))
            seq_len = prefix + length
            last = parent.row[prefix - 1] if prefix else -1
            before = self.allocator.state()
            if use_tail and P > 1:
                # the tail starts on a page boundary (ALLOC-3); choose how many pages it covers
                lowest_start = -(-prefix // P) * P
                starts = list(range(lowest_start, floor_page(seq_len, P) + 1, P))
                tail = seq_len - data.draw(st.sampled_from(starts)) if starts else length
                split = swa_tail_split(prefix, seq_len, tail, P)
                result = self.call("alloc_extend_swa_tail", prefix, seq_len, last, tail)
                row = self.expect_allocation(result, split.full_pages, split.swa_pages, before, length)
                swa_live_from = seq_len - tail
            else:
                result = self.call("alloc_extend", [prefix], [seq_len], [last])
                pages = new_pages_for_extend(prefix, seq_len, P)
                row = self.expect_allocation(result, pages, pages, before, length)
                swa_live_from = prefix
            if row is not None:
                self.sequences.append(Sequence(parent.row[:prefix] + row, first=prefix, swa_live_from=swa_live_from))

        # -- freeing --------------------------------------------------------------

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), pages=st.integers(1, 3), set_shaped=st.booleans())
        def release_swa(self, data, pages, set_shaped):
            """Window eviction: release SWA KV from the front, never the last token's page."""
            s = self.pick(data)
            lo, hi = s.live_from, floor_page(len(s.row) - 1, P)
            end = min(lo + pages * P, hi)
            if end <= lo:
                return
            if set_shaped and P > 1:
                self.call("free_swa", s.row[lo:end])
            else:
                self.call("free_swa_segment", s.row[lo:end], lo)
            s.swa_live_from = end

        def free_range(self, s: Sequence, lo: int, hi: int, set_shaped: bool):
            """Free positions [lo, hi) of s: full-only below its SWA-live boundary."""
            dead_end = min(hi, max(lo, s.swa_live_from))
            if dead_end > lo:
                if set_shaped:
                    self.call("free_full", s.row[lo:dead_end])
                else:
                    self.call("free_full_segment", s.row[lo:dead_end], lo)
            if hi > dead_end:
                if set_shaped and P > 1:
                    self.call("free", s.row[dead_end:hi])
                else:
                    self.call("free_segment", s.row[dead_end:hi], dead_end)

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), set_shaped=st.booleans())
        def free_sequence(self, data, set_shaped):
            s = self.pick(data)
            self.free_range(s, s.first, len(s.row), set_shaped)
            self.sequences.remove(s)

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), pages=st.integers(1, 3))
        def free_front(self, data, pages):
            """Free whole pages from the front, as prefix-cache eviction does."""
            s = self.pick(data)
            end = min(s.first + pages * P, floor_page(len(s.row), P))
            if end <= s.first:
                return
            self.free_range(s, s.first, end, set_shaped=False)
            s.first = end
            s.swa_live_from = max(s.swa_live_from, end)

        @rule()
        def toggle_free_group(self):
            self.call("free_group_end" if self.group_open else "free_group_begin")
            self.group_open = not self.group_open

        # -- what a buggy caller does: refused, nothing changes ---------------------

        @rule()
        def free_padding_page(self):
            self.expect_refusal("free", [0])

        @precondition(lambda self: P > 1 or self.free_counts()[0] > 0)
        @rule(data=st.data())
        def free_a_free_page(self, data):
            state = self.allocator.state()
            free = sorted(state.full.free_pages) + sorted(state.full.pending_pages)
            if free:
                self.expect_refusal("free", [data.draw(st.sampled_from(free)) * P])

        @precondition(lambda self: self.sequences)
        @rule(data=st.data())
        def free_slot_twice(self, data):
            s = self.pick(data)
            if len(s.row) > s.first:
                slot = s.row[data.draw(st.integers(s.first, len(s.row) - 1))]
                self.expect_refusal("free", [slot, slot])

        @precondition(lambda self: self.sequences)
        @rule(data=st.data())
        def free_full_with_live_peer(self, data):
            s = self.pick(data)
            if len(s.row) > s.live_from:
                self.expect_refusal("free_full", [s.row[data.draw(st.integers(s.live_from, len(s.row) - 1))]])

        @precondition(lambda self: self.sequences)
        @rule(data=st.data())
        def free_swa_of_released(self, data):
            s = self.pick(data)
            if s.live_from > s.first:
                self.expect_refusal("free_swa_segment", s.row[s.first:s.live_from], s.first)

        @precondition(lambda self: self.sequences and P > 1)
        @rule(data=st.data())
        def free_unaligned_segment(self, data):
            s = self.pick(data)
            starts = [p for p in range(s.live_from, len(s.row)) if p % P]
            if starts:
                start = data.draw(st.sampled_from(starts))
                self.expect_refusal("free_segment", s.row[start:], start)

        # -- invariants ---------------------------------------------------------------

        @invariant()
        def allocator_invariants(self):
            type(self).steps += 1
            state = self.allocator.state()
            violations = allocator_violations(state, [s.held() for s in self.sequences])
            if violations:
                raise InvariantViolation("\n".join(map(str, violations)))
            full_size, swa_size = self.allocator.available_sizes()
            assert (full_size, swa_size) == (len(state.full.free_pages) * P, len(state.swa.free_pages) * P), \
                "[ALLOC-1] available sizes disagree with the free lists"

        def teardown(self):
            """Drain to empty: once everything is freed, every page is free and unmapped."""
            if not hasattr(self, "allocator") or sys.exc_info()[1] is not None:
                return  # a step already failed: its report must not be hidden by the drain's
            if self.group_open:
                self.call("free_group_end")
            for s in list(self.sequences):
                self.free_range(s, s.first, len(s.row), set_shaped=False)
            self.sequences.clear()
            violations = allocator_violations(self.allocator.state(), [])
            if violations:
                raise InvariantViolation("after freeing everything:\n" + "\n".join(map(str, violations)))

    AllocatorMachine.__name__ = AllocatorMachine.__qualname__ = f"AllocatorMachine_page{P}"
    return AllocatorMachine
