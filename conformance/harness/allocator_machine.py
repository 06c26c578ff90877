"""The allocator-tier state machine: random operation sequences against any hybrid
allocator, every invariant checked after every step.

`allocator_machine(make_allocator, page_size)` returns a Hypothesis
`RuleBasedStateMachine` class whose rules choose portable steps (see
allocator_driver.py for what each does) on tiny pools, tight enough that allocations
fail: growing, forking with and without the PD-decode SWA tail, window releases,
frees set-shaped and segment-shaped, free groups, and the misuse the spec requires to
be refused. Every step is `note()`d and recorded, so a failure is a replayable trace.

With `shadow` (another adapter, the reference by default) every step also runs on it,
and the observables the spec fixes must agree (differential.py).

`make_allocator(size_full, size_swa, page_size)` must return an object with the
allocator operations of kvspec.conformance.harness.protocol.ALLOCATOR_OPERATIONS.
"""

from collections.abc import Callable, Iterable

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvspec.spec.models import TWO_POOL
from kvspec.spec.pages import floor_page

from .allocator_driver import AllocatorDriver
from .declarations import Capability
from .differential import DifferentialDriver
from .recording import RecordingMachine

ALL = frozenset({Capability.SWA_TAIL, Capability.FREE_GROUPS, Capability.REFUSES_MISUSE, Capability.ATOMIC_ALLOC_DECODE,
                 Capability.FULL_FREES, Capability.SEGMENT_FREES})


def allocator_machine(make_allocator: Callable, page_size: int, capabilities: Iterable[str] = ALL,
                      observables: Iterable[str] = TWO_POOL.observables,
                      shadow=None) -> type[RecordingMachine]:
    P = page_size
    lengths = st.integers(1, 3 * P + 1)

    class AllocatorMachine(RecordingMachine):
        tier = "allocator"

        @initialize(full_pages=st.integers(2, 8), swa_pages=st.integers(1, 8))
        def build(self, full_pages, swa_pages):
            config = {"page_size": P, "size_full": full_pages * P, "size_swa": swa_pages * P}
            self.start_example(config)
            allocator = make_allocator(config["size_full"], config["size_swa"], P)
            driver = AllocatorDriver(allocator, P, self.observables, log=note, capabilities=self.capabilities)
            if shadow is not None:  # differential mode: the other adapter takes every step too
                other = shadow.make_allocator(config["size_full"], config["size_swa"], P)
                driver = DifferentialDriver(driver, AllocatorDriver(other, P, shadow.observables,
                                                                    capabilities=shadow.capabilities), shadow.name)
            self.driver = driver
            self.shadowed = shadow is not None

        @property
        def sequences(self):
            return self.driver.sequences

        def index(self, data) -> int:
            return data.draw(st.integers(0, len(self.sequences) - 1))

        # -- allocation -----------------------------------------------------------------------

        @rule(length=lengths)
        def new_sequence(self, length):
            self.run("new_sequence", length=length)

        @precondition(lambda self: P == 1)
        @rule(length=lengths)
        def alloc_tokens(self, length):
            self.run("alloc_tokens", length=length)

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), grow=st.lists(lengths, min_size=1, max_size=3))
        def extend(self, data, grow):
            count = min(len(grow), len(self.sequences))
            chosen = data.draw(st.lists(st.integers(0, len(self.sequences) - 1), min_size=count, max_size=count,
                                        unique=True))
            self.run("extend", sequences=chosen, grow=grow[:count])

        @precondition(lambda self: self.sequences)
        @rule(data=st.data())
        def decode(self, data):
            sequence = self.index(data)
            if (self.shadowed and Capability.ATOMIC_ALLOC_DECODE not in self.capabilities
                    and not self.driver.decode_fits(sequence)):
                # A failed alloc_decode that keeps what it took (SGLang's does) leaves the two
                # sides of a differential run apart for good: there, do not call it without room.
                self.driver.tally.skip("atomicity", "adapter lacks capability atomic_alloc_decode")
                return
            self.run("decode", sequence=sequence)  # without room, too: driver.failed_without_room

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), prefix_pages=st.integers(0, 3), length=lengths, use_tail=st.booleans())
        def fork(self, data, prefix_pages, length, use_tail):
            parent = self.index(data)
            tail = None
            if use_tail and P > 1 and Capability.SWA_TAIL in self.capabilities:
                # the tail starts on a page boundary (ALLOC-3) among the new tokens
                prefix = min(prefix_pages * P, floor_page(len(self.sequences[parent].row), P))
                starts = list(range(-(-prefix // P) * P, floor_page(prefix + length, P) + 1, P))
                if starts:
                    tail = prefix + length - data.draw(st.sampled_from(starts))
            self.run("fork", parent=parent, prefix_pages=prefix_pages, length=length, tail=tail or None)

        # -- freeing ----------------------------------------------------------------------------

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), pages=st.integers(1, 3), set_shaped=st.booleans())
        def release_swa(self, data, pages, set_shaped):
            self.run("release_swa", sequence=self.index(data), pages=pages, set_shaped=set_shaped)

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), set_shaped=st.booleans())
        def free_sequence(self, data, set_shaped):
            self.run("free_sequence", sequence=self.index(data), set_shaped=set_shaped)

        @precondition(lambda self: self.sequences)
        @rule(data=st.data(), pages=st.integers(1, 3))
        def free_front(self, data, pages):
            self.run("free_front", sequence=self.index(data), pages=pages)

        @precondition(lambda self: Capability.FREE_GROUPS in self.capabilities)
        @rule()
        def toggle_free_group(self):
            self.run("free_group_end" if self.driver.group_open else "free_group_begin")

        # -- what a buggy caller does: refused, nothing changes -----------------------------------
        # (only for an adapter that refuses misuse; the report says the rest skipped them)

        @precondition(lambda self: Capability.REFUSES_MISUSE in self.capabilities)
        @rule()
        def free_padding_page(self):
            self.run("free_padding_page")

        @precondition(lambda self: Capability.REFUSES_MISUSE in self.capabilities
                      and (any(self.driver.free_page_counts()) or P > 1))
        @rule(index=st.integers(0, 64))
        def free_a_free_page(self, index):
            state = self.driver.state()
            if state.full.free_pages or state.full.pending_pages:
                self.run("free_a_free_page", index=index)

        @precondition(lambda self: Capability.REFUSES_MISUSE in self.capabilities and self.sequences)
        @rule(data=st.data())
        def free_slot_twice(self, data):
            sequence = self.index(data)
            s = self.sequences[sequence]
            if len(s.row) > s.first:
                self.run("free_slot_twice", sequence=sequence, position=data.draw(st.integers(s.first, len(s.row) - 1)))

        @precondition(lambda self: {Capability.REFUSES_MISUSE, Capability.FULL_FREES} <= self.capabilities
                      and self.sequences)
        @rule(data=st.data())
        def free_full_with_live_peer(self, data):
            sequence = self.index(data)
            s = self.sequences[sequence]
            if len(s.row) > s.live_from:
                self.run("free_full_with_live_peer", sequence=sequence,
                         position=data.draw(st.integers(s.live_from, len(s.row) - 1)))

        @precondition(lambda self: {Capability.REFUSES_MISUSE, Capability.SEGMENT_FREES} <= self.capabilities
                      and self.sequences)
        @rule(data=st.data())
        def free_swa_of_released(self, data):
            sequence = self.index(data)
            if self.sequences[sequence].live_from > self.sequences[sequence].first:
                self.run("free_swa_of_released", sequence=sequence)

        @precondition(lambda self: {Capability.REFUSES_MISUSE, Capability.SEGMENT_FREES} <= self.capabilities
                      and self.sequences and P > 1)
        @rule(data=st.data())
        def free_unaligned_segment(self, data):
            sequence = self.index(data)
            s = self.sequences[sequence]
            starts = [p for p in range(s.live_from, len(s.row)) if p % P]
            if starts:
                self.run("free_unaligned_segment", sequence=sequence, position=data.draw(st.sampled_from(starts)))

    AllocatorMachine.capabilities = frozenset(capabilities)
    AllocatorMachine.observables = frozenset(observables)
    AllocatorMachine.reset_counters()
    AllocatorMachine.__name__ = AllocatorMachine.__qualname__ = f"AllocatorMachine_page{P}"
    return AllocatorMachine
