"""The allocator-tier driver: applies portable steps to any hybrid allocator and checks
every allocator invariant after each.

The driver plays the allocator's caller. It holds sequences (rows of full slots, as
requests and tree nodes do) and names them by index, so a step reads "extend sequence 1
by 3 tokens", never "free slots 17, 18": the same steps run on any implementation.
It grows sequences, forks them at a page-aligned prefix (a prefix-cache hit, by a plain
extend or by the PD-decode SWA-tail pre-allocation), releases SWA KV from their front
as window eviction does, frees them, and tries what a buggy caller would (double
frees, the padding page, unaligned segments, full frees with live SWA peers), which the
spec requires to be refused with no change. `drain` frees everything and requires
every page free.
"""

from collections.abc import Sequence as SequenceType
from dataclasses import dataclass
from typing import Any

from kvspec.spec.accounting import HeldSequence
from kvspec.spec.allocator import ALLOCATIONS, new_pages_available, swa_tail_split
from kvspec.spec.invariants.allocator import AllocatorView
from kvspec.spec.outcomes import KvSpecError, Outcome, OutOfMemory
from kvspec.spec.pages import floor_page, new_pages_for_decode, new_pages_for_extend

from .declarations import Capability
from .checks import (
    Checks,
    ImplementationCrash,
    InvariantViolation,
    StepNotApplicable,
    Tally,
    leak_clauses,
    raised_by_the_implementation,
)
from .snapshot_shape import plain, shape_problem
from .trace import TraceStep

REFUSALS = ("free_padding_page", "free_a_free_page", "free_slot_twice", "free_full_with_live_peer",
            "free_swa_of_released", "free_unaligned_segment")


@dataclass
class Sequence:
    """One run of positions the caller holds (see spec.accounting.HeldSequence)."""

    row: list[int]
    first: int = 0
    swa_live_from: int = 0

    def held(self) -> HeldSequence:
        return HeldSequence(tuple(self.row[self.first:]), self.first, self.swa_live_from)

    @property
    def live_from(self) -> int:
        return max(self.first, self.swa_live_from)


class AllocatorDriver:
    def __init__(self, allocator, page_size: int, observables: frozenset[str], log=lambda line: None,
                 capabilities: frozenset[str] = frozenset(Capability)):
        self.allocator = allocator
        self.P = page_size
        self.observables = observables
        self.log = log  # where each call is written as it is made (Hypothesis' note())
        self.sequences: list[Sequence] = []
        self.atomic_decode = Capability.ATOMIC_ALLOC_DECODE in capabilities
        """False: a failed alloc_decode may keep what it took (no capability atomic_alloc_decode)."""
        self.full_frees = Capability.FULL_FREES in capabilities
        """False: a released range is freed with `free` (an allocator without free_full)."""
        self.segment_frees = Capability.SEGMENT_FREES in capabilities
        """False: every free is set-shaped (an allocator without the segment frees)."""
        self.kept: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        """Full and SWA pages failed non-atomic decodes kept: charged to them (AllocatorView.kept)."""
        self.group_open = False
        self.tally = Tally()
        self.checks = Checks(AllocatorView, observables)
        self.outcome = Outcome.OK

    # -- applying a step ------------------------------------------------------------------

    def apply(self, step: TraceStep) -> dict[str, Any]:
        """Apply one step, check every invariant, return the observables the spec fixes.
        Raises StepFailure (InvariantViolation, ImplementationCrash, StepNotApplicable)."""
        self.outcome = Outcome.OK
        getattr(self, step.op)(**step.args)
        full, swa = self.check()
        # ints, whatever integers the adapter showed (snapshot_shape.plain)
        return plain({"outcome": self.outcome, "free_full_pages": full, "free_swa_pages": swa})

    def call(self, operation: str, *args, refusal: bool = False, quiet: bool = False):
        if not quiet:
            self.log(f"{operation}{args}")
        try:
            result = getattr(self.allocator, operation)(*args)
        except KvSpecError:
            if refusal:
                raise
            raise ImplementationCrash(f"{operation}{args} raised although the call is valid", ["ALLOC-5"])
        except BaseException as error:  # noqa: BLE001 - what the implementation raised
            if not raised_by_the_implementation(error):
                raise
            raise ImplementationCrash(f"{operation}{args} raised {type(error).__name__}: {error}") from error
        if operation in ALLOCATIONS and not isinstance(result, OutOfMemory):
            # named like a snapshot's field: a tensor or an iterator would otherwise be
            # read as slots, and blamed on a clause it did not break (or crash the check)
            if problem := shape_problem(result, SequenceType[int], f"the result of {operation}"):
                raise ImplementationCrash(f"{problem}: an allocation returns the new tokens' full slots as a list "
                                          f"of ints, or OutOfMemory", ["ALLOC-1"])
        return result

    def free_page_counts(self) -> tuple[int, int]:
        full, swa = self.call("available_sizes", quiet=True)
        return full // self.P, swa // self.P

    def state(self):
        return self.call("state", quiet=True)

    def before(self):
        """What an allocation must leave unchanged if it fails: counts, and the state."""
        return self.free_page_counts(), self.state()

    def sequence(self, index: int) -> Sequence:
        if not 0 <= index < len(self.sequences):
            raise StepNotApplicable(f"the step names sequence {index}, but the caller holds {len(self.sequences)}")
        return self.sequences[index]

    def check(self) -> tuple[int, int]:
        """Every allocator invariant; returns the free page counts it read."""
        state = self.state()
        held = tuple(s.held() for s in self.sequences)
        violations = self.checks.violations(self.tally, AllocatorView(state, held, self.kept))
        if violations:
            raise InvariantViolation.of(violations)
        full, swa = self.free_page_counts()
        if "free_sets" in self.observables and (full, swa) != (len(state.full.free_pages), len(state.swa.free_pages)):
            raise InvariantViolation(f"available sizes say {full} full / {swa} SWA pages free, the free lists "
                                     f"{len(state.full.free_pages)} / {len(state.swa.free_pages)}", ["ALLOC-1"])
        return full, swa

    def expect_allocation(self, result, full_pages: int, swa_pages: int, before, new_tokens: int) -> list[int] | None:
        """[ALLOC-2, ALLOC-4] Fails exactly when a pool is short, and then changes nothing
        (counted as the atomicity class)."""
        self.tally.checked["atomicity"] += 1
        self.tally.clauses |= {"ALLOC-2", "ALLOC-4"}
        try:
            return self.allocation_outcome(result, full_pages, swa_pages, before, new_tokens)
        except InvariantViolation:
            self.tally.violated["atomicity"] += 1
            raise

    def allocation_outcome(self, result, full_pages: int, swa_pages: int, before, new_tokens: int) -> list[int] | None:
        counts, _ = before
        fits = new_pages_available(full_pages, swa_pages, *counts)
        if isinstance(result, OutOfMemory):
            self.outcome = Outcome.OUT_OF_MEMORY
            self.log(f"  -> {result}")
            if fits:
                raise InvariantViolation(f"OutOfMemory although both pools had room: {result}", ["ALLOC-2"])
            if self.before() != before:
                # I15 at the allocator tier is ALLOC-4 (spec/07-invariants.md, I15)
                raise InvariantViolation("a failed allocation changed the allocator", ["ALLOC-4", "I15"])
            return None
        if not fits:
            raise InvariantViolation(f"allocation of {full_pages} full / {swa_pages} SWA pages succeeded without room",
                                     ["ALLOC-2"])
        if len(result) != new_tokens:
            raise InvariantViolation(f"asked for {new_tokens} slots, got {len(result)}", ["ALLOC-1"])
        return list(result)

    def expect_refusal(self, operation: str, *args):
        """[ALLOC-5, ALLOC-6] An invalid call raises a spec error and changes nothing."""
        self.tally.clauses.add("ALLOC-6")
        before = self.before()
        try:
            self.call(operation, *args, refusal=True)
        except KvSpecError as error:
            self.log(f"  refused: {error}")
        else:
            raise InvariantViolation(f"{operation}{args} was accepted, but it frees what is not held", ["ALLOC-6"])
        self.outcome = Outcome.REFUSED
        if self.before() != before:
            raise InvariantViolation(f"refused {operation} changed the allocator", ["ALLOC-6"])

    # -- allocation -------------------------------------------------------------------------

    def new_sequence(self, length: int):
        before = self.before()
        pages = new_pages_for_extend(0, length, self.P)
        row = self.expect_allocation(self.call("alloc_extend", [0], [length], [-1]), pages, pages, before, length)
        if row is not None:
            self.sequences.append(Sequence(row))

    def alloc_tokens(self, length: int):
        if self.P != 1:
            raise StepNotApplicable(f"alloc_tokens is the token allocator's (page size 1), not page size {self.P}'s")
        before = self.before()
        row = self.expect_allocation(self.call("alloc", length), length, length, before, length)
        if row is not None:
            self.sequences.append(Sequence(row))

    def extend(self, sequences: list[int], grow: list[int]):
        if len(sequences) != len(grow):
            raise StepNotApplicable(f"extend names {len(sequences)} sequences but {len(grow)} lengths")
        chosen = [self.sequence(i) for i in sequences]
        prefix = [len(s.row) for s in chosen]
        seq_lens = [p + g for p, g in zip(prefix, grow)]
        before = self.before()
        result = self.call("alloc_extend", prefix, seq_lens, [s.row[-1] for s in chosen])
        pages = sum(new_pages_for_extend(p, n, self.P) for p, n in zip(prefix, seq_lens))
        slots = self.expect_allocation(result, pages, pages, before, sum(grow))
        if slots is not None:
            for s, g in zip(chosen, grow):
                s.row.extend(slots[:g])
                slots = slots[g:]

    def decode_fits(self, sequence: int) -> bool:
        """Whether both pools have the pages a decode of the sequence needs."""
        pages = new_pages_for_decode(len(self.sequence(sequence).row) + 1, self.P)
        return new_pages_available(pages, pages, *self.free_page_counts())

    def decode(self, sequence: int):
        s = self.sequence(sequence)
        seq_len = len(s.row) + 1
        before = self.before()
        pages = new_pages_for_decode(seq_len, self.P)
        result = self.call("alloc_decode", [seq_len], [s.row[-1]])
        if not self.atomic_decode and not new_pages_available(pages, pages, *before[0]):
            return self.failed_without_room(result, pages, before)
        slots = self.expect_allocation(result, pages, pages, before, 1)
        if slots is not None:
            s.row.extend(slots)

    def failed_without_room(self, result, pages: int, before) -> None:
        """[ALLOC-2] A decode without room, on an allocator whose failed alloc_decode may
        keep what it took (SGLang's keeps the full page: its known divergence from ALLOC-4).
        It must still fail; it may keep at most the pages it asked for, in each pool; what it
        kept is charged to the failed call (AllocatorView.kept), so that every other
        invariant keeps checking the rest (a kept full slot must still map to 0, I5)."""
        if not isinstance(result, OutOfMemory):
            raise InvariantViolation(f"alloc_decode of {pages} page(s) per pool succeeded without room", ["ALLOC-2"])
        self.outcome = Outcome.OUT_OF_MEMORY
        self.log(f"  -> {result}")
        self.tally.skip("atomicity", "adapter lacks capability atomic_alloc_decode")
        self.tally.clauses |= {"ALLOC-2", "ALLOC-4"}  # what must still hold of the failed call
        if "free_sets" not in self.observables:
            return
        then, now = before[1], self.state()
        kept_full = sorted(set(then.full.free_pages) - set(now.full.free_pages))
        kept_swa = sorted(set(then.swa.free_pages) - set(now.swa.free_pages))
        if len(kept_full) > pages or len(kept_swa) > pages:
            raise InvariantViolation(f"a failed alloc_decode of {pages} page(s) per pool kept {len(kept_full)} full "
                                     f"and {len(kept_swa)} SWA pages", ["ALLOC-4"])
        if kept_full or kept_swa:
            self.log(f"  kept by the failed call: full pages {kept_full}, SWA pages {kept_swa}")
            self.kept = (self.kept[0] + tuple(kept_full), self.kept[1] + tuple(kept_swa))

    def fork(self, parent: int, prefix_pages: int, length: int, tail: int | None):
        """A new sequence on a page-aligned prefix of another (a prefix-cache hit), grown by a
        plain extend or, with `tail`, by the PD-decode SWA-tail pre-allocation."""
        source = self.sequence(parent)
        prefix = min(prefix_pages * self.P, floor_page(len(source.row), self.P))
        seq_len = prefix + length
        last = source.row[prefix - 1] if prefix else -1
        before = self.before()
        if tail is not None:
            if tail > length or (seq_len - tail) % self.P:
                raise StepNotApplicable(f"SWA tail of {tail} tokens must start on a page boundary within the {length} new tokens")
            split = swa_tail_split(prefix, seq_len, tail, self.P)
            result = self.call("alloc_extend_swa_tail", prefix, seq_len, last, tail)
            row = self.expect_allocation(result, split.full_pages, split.swa_pages, before, length)
            swa_live_from = seq_len - tail
        else:
            pages = new_pages_for_extend(prefix, seq_len, self.P)
            row = self.expect_allocation(self.call("alloc_extend", [prefix], [seq_len], [last]), pages, pages, before, length)
            swa_live_from = prefix
        if row is not None:
            self.sequences.append(Sequence(source.row[:prefix] + row, first=prefix, swa_live_from=swa_live_from))

    # -- freeing ----------------------------------------------------------------------------

    def release_swa(self, sequence: int, pages: int, set_shaped: bool):
        """Window eviction: release SWA KV from the front, never the last token's page."""
        s = self.sequence(sequence)
        lo, hi = s.live_from, floor_page(len(s.row) - 1, self.P)
        end = min(lo + pages * self.P, hi)
        if end <= lo:
            return
        if (set_shaped and self.P > 1) or not self.segment_frees:
            self.call("free_swa", s.row[lo:end])
        else:
            self.call("free_swa_segment", s.row[lo:end], lo)
        s.swa_live_from = end

    def free_range(self, s: Sequence, lo: int, hi: int, set_shaped: bool):
        """Free positions [lo, hi) of s: full-only below its SWA-live boundary."""
        dead_end = min(hi, max(lo, s.swa_live_from))
        if dead_end > lo:
            if not self.full_frees:  # its `free` skips the slots mapped to no SWA peer
                self.call("free", s.row[lo:dead_end])
            elif set_shaped or not self.segment_frees:
                self.call("free_full", s.row[lo:dead_end])
            else:
                self.call("free_full_segment", s.row[lo:dead_end], lo)
        if hi > dead_end:
            if (set_shaped and self.P > 1) or not self.segment_frees:
                self.call("free", s.row[dead_end:hi])
            else:
                self.call("free_segment", s.row[dead_end:hi], dead_end)

    def free_sequence(self, sequence: int, set_shaped: bool):
        s = self.sequence(sequence)
        self.free_range(s, s.first, len(s.row), set_shaped)
        del self.sequences[sequence]  # by position: an earlier sequence may be equal to it (two empty ones)

    def free_front(self, sequence: int, pages: int):
        """Free whole pages from the front, as prefix-cache eviction does."""
        s = self.sequence(sequence)
        end = min(s.first + pages * self.P, floor_page(len(s.row), self.P))
        if end <= s.first:
            return
        self.free_range(s, s.first, end, set_shaped=False)
        s.first = end
        s.swa_live_from = max(s.swa_live_from, end)

    def free_group_begin(self):
        self.call("free_group_begin")
        self.group_open = True

    def free_group_end(self):
        self.call("free_group_end")
        self.group_open = False

    def drain(self):
        """Free everything: every page must then be free and unmapped (leak check)."""
        if self.group_open:
            self.free_group_end()
        for s in list(self.sequences):
            self.free_range(s, s.first, len(s.row), set_shaped=False)
        self.sequences.clear()
        self.check()  # the frees themselves conform (a duplicate is I1, not a leak)
        state = self.state()
        kept = tuple(map(len, self.kept))  # charged to failed calls (failed_without_room)
        leaked = (state.full.num_pages - len(state.full.free_pages) - kept[0],
                  state.swa.num_pages - len(state.swa.free_pages) - kept[1])
        full, swa = self.free_page_counts()
        leaked_counts = (state.full.num_pages - full - kept[0], state.swa.num_pages - swa - kept[1])
        if leaked != (0, 0) or leaked_counts != (0, 0):
            leaked = tuple(map(max, leaked, leaked_counts))
            raise InvariantViolation(f"after freeing everything, {leaked[0]} full and "
                                     f"{leaked[1]} SWA pages are not free (leak)", leak_clauses(*leaked))

    # -- what a buggy caller does: refused, nothing changes -------------------------------------

    def free_padding_page(self):
        self.expect_refusal("free", [0])

    def free_a_free_page(self, index: int):
        state = self.state()
        free = sorted(state.full.free_pages) + sorted(state.full.pending_pages)
        if not free:
            raise StepNotApplicable("no free full page to free again")
        self.expect_refusal("free", [free[index % len(free)] * self.P])

    def free_slot_twice(self, sequence: int, position: int):
        s = self.sequence(sequence)
        if not s.first <= position < len(s.row):
            raise StepNotApplicable(f"sequence {sequence} holds positions [{s.first}, {len(s.row)}), not {position}")
        self.expect_refusal("free", [s.row[position], s.row[position]])

    def free_full_with_live_peer(self, sequence: int, position: int):
        s = self.sequence(sequence)
        if not s.live_from <= position < len(s.row):
            raise StepNotApplicable(f"sequence {sequence} has live SWA KV at [{s.live_from}, {len(s.row)}), not {position}")
        self.expect_refusal("free_full", [s.row[position]])

    def free_swa_of_released(self, sequence: int):
        s = self.sequence(sequence)
        if s.live_from <= s.first:
            raise StepNotApplicable(f"sequence {sequence} has released no SWA KV")
        self.expect_refusal("free_swa_segment", s.row[s.first:s.live_from], s.first)

    def free_unaligned_segment(self, sequence: int, position: int):
        s = self.sequence(sequence)
        if self.P == 1 or position % self.P == 0 or not s.live_from <= position < len(s.row):
            raise StepNotApplicable(f"position {position} is not an unaligned live position of sequence {sequence}")
        self.expect_refusal("free_segment", s.row[position:], position)
