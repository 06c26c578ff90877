"""A minimal hybrid full/SWA allocator, written from scratch, as a kvspec adapter.

    kvspec check --adapter docs.examples.minimal_allocator:ADAPTER --profile quick --run "allocator P=1"

Page size 1 only: a page is one slot, so a slot id is also its page id. docs/writing-an-adapter.md
walks through this file. It imports from kvspec only the plain data types the harness reads
(kvspec.spec.accounting) and the outcomes the spec names (kvspec.spec.outcomes).

LEAKY_ADAPTER at the end is the same allocator with a seeded bug: its free leaks a page.
"""

from collections import Counter

from kvspec.spec.accounting import AllocatorState, PoolState
from kvspec.spec.outcomes import InvalidAllocation, InvalidFree, OutOfMemory


class Pool:
    """One pool of `size` slots with ids 1..size. Slot 0 is the padding slot: never handed
    out, never freed. While a free group is open, freed slots wait in `pending`."""

    def __init__(self, name: str, size: int):
        self.name, self.size = name, size
        self.free = list(range(1, size + 1))  # which free slot an allocation gets is not fixed
        self.pending: list[int] | None = None  # a list while a free group is open

    def is_held(self, slot: int) -> bool:
        """Handed out and not yet freed (a small pool: a list scan is fine here)."""
        return 1 <= slot <= self.size and slot not in self.free and slot not in (self.pending or ())

    def take(self, count: int) -> list[int]:
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def release(self, slots: list[int]) -> None:
        """Return held slots, or queue them while a free group is open."""
        (self.free if self.pending is None else self.pending).extend(slots)

    def state(self) -> PoolState:
        return PoolState(self.name, 1, self.size, tuple(self.free), tuple(self.pending or ()))


class MinimalAllocator:
    """Everything the `Allocator` protocol of kvspec.conformance.harness.protocol asks for."""

    def __init__(self, size_full: int, size_swa: int, page_size: int):
        if page_size != 1:
            raise ValueError("this example supports page size 1 only")
        self.size_full, self.size_swa = size_full, size_swa
        self.clear()

    def clear(self) -> None:
        self.full = Pool("full", self.size_full)
        self.swa = Pool("swa", self.size_swa)
        # mapping[f] is the SWA peer of full slot f, 0 for none. It has size_full + 2
        # entries (slots 0..size_full, then the sentinel -1), so mapping[-1] == -1: a
        # last_loc of -1 translates to -1, as the spec's MAP-1 asks.
        self.mapping = [0] * (self.size_full + 1) + [-1]

    # -- what the harness reads --------------------------------------------------------

    def state(self) -> AllocatorState:
        return AllocatorState(1, self.size_full, self.full.state(), self.swa.state(), tuple(self.mapping))

    def available_sizes(self) -> tuple[int, int]:
        return len(self.full.free), len(self.swa.free)  # pending slots are not available

    def translate(self, full_slots) -> list[int]:
        return [self.mapping[slot] for slot in full_slots]

    # -- allocation: check both pools first, then change anything (ALLOC-2, ALLOC-4) ---

    def shortfall(self, full_needed: int, swa_needed: int) -> OutOfMemory | None:
        if full_needed > len(self.full.free):
            return OutOfMemory("full", full_needed, len(self.full.free))
        if swa_needed > len(self.swa.free):
            return OutOfMemory("swa", swa_needed, len(self.swa.free))
        return None

    def allocate(self, full_count: int, swa_count: int) -> list[int] | OutOfMemory:
        """`full_count` new full slots; the last `swa_count` of them get an SWA peer."""
        short = self.shortfall(full_count, swa_count)
        if short:
            return short  # returned, not raised; nothing was taken
        full_slots, swa_slots = self.full.take(full_count), self.swa.take(swa_count)
        for full_slot, swa_slot in zip(full_slots[full_count - swa_count:], swa_slots):
            self.mapping[full_slot] = swa_slot
        return full_slots

    def alloc(self, num_tokens: int):
        if num_tokens < 0:
            raise InvalidAllocation(f"alloc({num_tokens}): the number of tokens must be >= 0")
        return self.allocate(num_tokens, num_tokens)

    def check_requests(self, prefix_lens, seq_lens, last_loc) -> None:
        if not len(prefix_lens) == len(seq_lens) == len(last_loc):
            raise InvalidAllocation("prefix_lens, seq_lens and last_loc need one entry per request")
        for prefix, seq, last in zip(prefix_lens, seq_lens, last_loc):
            if not 0 <= prefix <= seq:
                raise InvalidAllocation(f"need 0 <= prefix_len <= seq_len (got {prefix}, {seq})")
            if not -1 <= last <= self.size_full:
                raise InvalidAllocation(f"last_loc {last} is not a full slot (or -1 for an empty prefix)")

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        # With page size 1 no token continues a partial page, so last_loc is only checked.
        # The slots come back request by request, in position order.
        self.check_requests(prefix_lens, seq_lens, last_loc)
        count = sum(seq - prefix for prefix, seq in zip(prefix_lens, seq_lens))
        return self.allocate(count, count)

    def alloc_decode(self, seq_lens, last_loc):
        if any(seq < 1 for seq in seq_lens):
            raise InvalidAllocation("a decode step grows each request to seq_len >= 1")
        return self.alloc_extend([seq - 1 for seq in seq_lens], seq_lens, last_loc)

    def alloc_extend_swa_tail(self, prefix_len, seq_len, last_loc, swa_tail_len):
        # PD-decode: full slots for [prefix_len, seq_len), SWA peers for the tail only;
        # the head keeps mapping 0 (its entries are already 0: they were free).
        self.check_requests([prefix_len], [seq_len], [last_loc])
        if not 0 <= swa_tail_len <= seq_len - prefix_len:
            raise InvalidAllocation(f"swa_tail_len {swa_tail_len} must lie in 0..{seq_len - prefix_len}")
        return self.allocate(seq_len - prefix_len, swa_tail_len)

    # -- frees: check everything first, so that a refused free changes nothing (ALLOC-6) --

    def check_held(self, slots: list[int], operation: str) -> None:
        for slot in slots:
            if slot == 0:
                raise InvalidFree(f"{operation}: slot 0 is the padding slot, never allocated", [slot])
            if not self.full.is_held(slot):
                raise InvalidFree(f"{operation}: full slot {slot} is not held (double free?)", [slot])
        twice = [slot for slot, count in Counter(slots).items() if count > 1]
        if twice:
            raise InvalidFree(f"{operation}: slots {twice} named twice (double free)", twice)

    def live_peers(self, slots: list[int], operation: str) -> list[int]:
        """The SWA peers of `slots`; at page size 1 every SWA free is strict (MAP-2)."""
        peers = [self.mapping[slot] for slot in slots]
        if any(peer <= 0 or not self.swa.is_held(peer) for peer in peers):
            raise InvalidFree(f"{operation}: a slot of {slots} has no live SWA peer", slots)
        return peers

    def free_swa(self, slots) -> None:
        slots = list(slots)
        self.check_held(slots, "free_swa")
        peers = self.live_peers(slots, "free_swa")
        for slot in slots:
            self.mapping[slot] = 0  # the mapping is cleared when the free is made, group or not
        self.swa.release(peers)

    def free_full(self, slots) -> None:
        slots = list(slots)
        self.check_held(slots, "free_full")
        if any(self.mapping[slot] != 0 for slot in slots):
            raise InvalidFree(f"free_full: a slot of {slots} still has a live SWA peer; free it first", slots)
        self.full.release(slots)

    def free(self, slots) -> None:
        slots = list(slots)
        self.check_held(slots, "free")
        self.live_peers(slots, "free")  # refuse before changing anything
        self.free_swa(slots)  # the SWA side first: it reads the mapping
        self.full.release(slots)

    # At page size 1 every position is page aligned, so a segment free is the plain free.
    def free_segment(self, slots, start_pos) -> None:
        self.free(slots)

    def free_swa_segment(self, slots, start_pos) -> None:
        self.free_swa(slots)

    def free_full_segment(self, slots, start_pos) -> None:
        self.free_full(slots)

    # -- free groups: frees wait until the group ends (I16) --------------------------

    def free_group_begin(self) -> None:
        if self.full.pending is not None:
            raise InvalidFree("free groups do not nest; call free_group_end first")
        self.full.pending, self.swa.pending = [], []

    def free_group_end(self) -> None:
        if self.full.pending is None:
            raise InvalidFree("free_group_end without free_group_begin")
        for pool in (self.swa, self.full):
            queued, pool.pending = pool.pending, None
            pool.release(queued)


class ADAPTER:
    """The adapter: what kvspec reads to know what to run (kvspec.conformance.harness.protocol)."""

    name = "minimal"
    policy_version = "sglang-0.5.23"
    capabilities = ("page_size_1", "free_groups", "refuses_misuse", "atomic_alloc_decode", "full_frees",
                    "segment_frees")
    make_allocator = MinimalAllocator  # called as make_allocator(size_full, size_swa, page_size)


class LeakyAllocator(MinimalAllocator):
    """A seeded bug: free returns the SWA peers, but forgets the full page of the last
    slot it is given. No one holds that page and it is not free: `kvspec check` reports
    I2 (the full pool's pages are not all accounted for, a leak)."""

    def free(self, slots) -> None:
        slots = list(slots)
        self.check_held(slots, "free")
        self.live_peers(slots, "free")
        self.free_swa(slots)
        self.full.release(slots[:-1])  # BUG: should be slots


class LEAKY_ADAPTER(ADAPTER):
    name = "minimal-leaky"
    make_allocator = LeakyAllocator
