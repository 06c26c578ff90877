"""The hybrid full/SWA allocator [ALLOC-1 .. ALLOC-6, MAP-1 .. MAP-3].

Two pools of one page size and the full->SWA mapping: `mapping[f]` is the SWA slot of
full slot `f`, 0 when it has none, and a trailing -1 (MAP-1). Requests' rows store full
slots only; the SWA side is reached through the mapping. Each allocation asks both pools
through the one capacity check `new_pages_available` (ALLOC-2) and is atomic, the decode
step included (ALLOC-4). Every SWA free clears the mapping of what it frees, and a full
free refuses a slot whose SWA peer is still live (MAP-2).
"""

from typing import Sequence

import torch

from kvspec.spec.accounting import AllocatorState, PartialMapping
from kvspec.spec.allocator import new_pages_available, swa_tail_split, swa_tail_starts_on_page, validate_pool_config
from kvspec.spec.notation import MAPPING_SENTINEL, NO_SWA_PEER
from kvspec.spec.outcomes import InvalidAllocation, InvalidConfig, InvalidFree, OutOfMemory

from .pool import PoolAllocator, Slots


class HybridAllocator:
    def __init__(self, size_full: int, size_swa: int, page_size: int = 1, *, device: str | torch.device = "cpu"):
        problems = validate_pool_config(size_full, size_swa, page_size)
        if problems:
            raise InvalidConfig("invalid hybrid pool configuration: " + "; ".join(problems))
        self.page_size = page_size
        self.size_full = size_full
        self.size_swa = size_swa
        self.device = torch.device(device)
        self.full = PoolAllocator(size_full, page_size, name="full", device=self.device)
        self.swa = PoolAllocator(size_swa, page_size, name="swa", device=self.device)
        self.mapping = torch.zeros(size_full + page_size + 1, dtype=torch.int64, device=self.device)
        self.clear()

    def clear(self) -> None:
        """Both pools free, mapping all 0 but the sentinel, no open free group."""
        self.full.clear()
        self.swa.clear()
        self.mapping.zero_()
        self.mapping[-1] = MAPPING_SENTINEL

    # -- observation ------------------------------------------------------------------

    def full_available_size(self) -> int:
        return self.full.available_size()

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def translate(self, full_slots: Slots) -> Slots:
        """[MAP-1] The SWA slots of full slots (0 where there is no peer, -1 for -1)."""
        return self.mapping[torch.as_tensor(full_slots, dtype=torch.int64, device=self.device)]

    def state(self) -> AllocatorState:
        return AllocatorState(self.page_size, self.size_full, self.full.state(), self.swa.state(),
                              tuple(self.mapping.tolist()))

    def partial_state(self, held_full_slots: Sequence[int]) -> AllocatorState:
        """[OBS-4] Free counts instead of free lists, the mapping at `held_full_slots` only:
        no cost that grows with the pools."""
        slots = sorted(set(held_full_slots))
        peers = self.translate(slots).tolist() if slots else []
        return AllocatorState(self.page_size, self.size_full, self.full.state(partial=True),
                              self.swa.state(partial=True),
                              PartialMapping(len(self.mapping), dict(zip(slots, peers))))

    # -- allocation -------------------------------------------------------------------

    def capacity_shortfall(self, full_pages: int, swa_pages: int) -> OutOfMemory | None:
        """[ALLOC-2] None when both pools can give their pages, else which one cannot."""
        if new_pages_available(full_pages, swa_pages, self.full.available_pages(), self.swa.available_pages()):
            return None
        if full_pages > self.full.available_pages():
            return OutOfMemory("full", full_pages, self.full.available_pages())
        return OutOfMemory("swa", swa_pages, self.swa.available_pages())

    def swa_last_loc(self, last_loc: Sequence[int]) -> list[int]:
        outside = [loc for loc in last_loc if not -1 <= loc < self.size_full + self.page_size]
        if outside:
            raise InvalidAllocation(f"last_loc {outside} are not slots of the full pool; pass the slot of each "
                                    f"request's last prefix token, or -1 for an empty prefix")
        return self.translate(list(last_loc)).tolist() if len(last_loc) else []

    def alloc(self, num_tokens: int) -> Slots | OutOfMemory:
        """[ALLOC-1] page_size 1 only: `num_tokens` slots in each pool, mapped pairwise."""
        if self.page_size != 1:
            raise InvalidAllocation(f"alloc(n) is the page_size 1 path; with page_size {self.page_size} "
                                    f"use alloc_extend or alloc_decode")
        if num_tokens < 0:
            raise InvalidAllocation(f"alloc({num_tokens}): the number of tokens must be >= 0")
        shortfall = self.capacity_shortfall(num_tokens, num_tokens)
        if shortfall:
            return shortfall
        full_slots, swa_slots = self.full.alloc(num_tokens), self.swa.alloc(num_tokens)
        self.set_mapping(full_slots, swa_slots)
        return full_slots

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int],
                     last_loc: Sequence[int]) -> Slots | OutOfMemory:
        """[ALLOC-1] Grow each request from prefix_len to seq_len tokens in both pools; the
        SWA side continues after `mapping[last_loc]`."""
        swa_last = self.swa_last_loc(last_loc)
        return self.place_in_both(self.full.plan_extend(prefix_lens, seq_lens, last_loc),
                                  self.swa.plan_extend(prefix_lens, seq_lens, swa_last), last_loc, swa_last)

    def place_in_both(self, full_plans, swa_plans, last_loc, swa_last) -> Slots | OutOfMemory:
        """[ALLOC-2] One capacity check for both pools, then each lays the same positions
        on its own new pages, and the mapping pairs them."""
        pages = sum(plan.new_pages for plan in full_plans)
        shortfall = self.capacity_shortfall(pages, pages)
        if shortfall:
            return shortfall
        full_slots = self.full.place_extend(full_plans, last_loc, self.full.take_pages(pages))
        swa_slots = self.swa.place_extend(swa_plans, swa_last, self.swa.take_pages(pages))
        self.set_mapping(full_slots, swa_slots)
        return full_slots

    def alloc_decode(self, seq_lens: Sequence[int], last_loc: Sequence[int]) -> Slots | OutOfMemory:
        """[ALLOC-1, ALLOC-4] One slot per request in each pool. Atomic: when either pool
        is short nothing is taken (SGLang 0.5.23 keeps the full page; a known divergence)."""
        for seq in seq_lens:
            if seq < 1:
                raise InvalidAllocation(f"a decode step grows a request to seq_len >= 1 (got {seq})")
        swa_last = self.swa_last_loc(last_loc)
        return self.place_in_both(self.full.plan_decode(seq_lens, last_loc),
                                  self.swa.plan_decode(seq_lens, swa_last), last_loc, swa_last)

    def alloc_extend_swa_tail(self, prefix_len: int, seq_len: int, last_loc: int,
                              swa_tail_len: int) -> Slots | OutOfMemory:
        """[ALLOC-3] PD-decode pre-allocation of one request: full KV for the whole extend
        `[prefix_len, seq_len)`, SWA KV for its last `swa_tail_len` tokens only, each pool
        asked for its own page count. The head maps to 0."""
        if not 0 <= swa_tail_len <= seq_len - prefix_len:
            raise InvalidAllocation(f"alloc_extend_swa_tail: need 0 <= swa_tail_len <= seq_len - prefix_len "
                                    f"(got tail {swa_tail_len}, prefix {prefix_len}, seq {seq_len})")
        if not swa_tail_starts_on_page(seq_len, swa_tail_len, self.page_size):
            raise InvalidAllocation(f"alloc_extend_swa_tail: the SWA tail must start on a page boundary, "
                                    f"but seq_len - swa_tail_len = {seq_len - swa_tail_len} is not a multiple of "
                                    f"page_size {self.page_size}; round the tail up to reach one")
        split = swa_tail_split(prefix_len, seq_len, swa_tail_len, self.page_size)
        full_plans = self.full.plan_extend([prefix_len], [seq_len], [last_loc])
        swa_plans = self.swa.plan_extend([0], [swa_tail_len], [-1])
        shortfall = self.capacity_shortfall(split.full_pages, split.swa_pages)
        if shortfall:
            return shortfall
        full_slots = self.full.place_extend(full_plans, [last_loc], self.full.take_pages(split.full_pages))
        swa_slots = self.swa.place_extend(swa_plans, [-1], self.swa.take_pages(split.swa_pages))
        self.mapping[full_slots[:split.head_len]] = NO_SWA_PEER
        self.set_mapping(full_slots[split.head_len:], swa_slots)
        return full_slots

    def set_mapping(self, full_slots: Slots, swa_slots: Slots) -> None:
        """[MAP-2] The single mapping writer."""
        assert full_slots.numel() == swa_slots.numel(), "each new full slot gets exactly one SWA peer"
        self.mapping[full_slots] = swa_slots

    def move_swa_peers(self, from_full: Slots, to_full: Slots) -> None:
        """[MAP-2] Hand the live SWA peers of `from_full` to `to_full` (which have none),
        position by position; `from_full` is left without peers."""
        peers = self.mapping[from_full]
        assert bool((peers > 0).all()) and bool((self.mapping[to_full] == NO_SWA_PEER).all())
        self.mapping[from_full] = NO_SWA_PEER
        self.set_mapping(to_full, peers)

    # -- freeing ----------------------------------------------------------------------

    def as_slots(self, slots: Slots) -> Slots:
        return torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)

    def free_swa(self, full_slots: Slots) -> None:
        """[MAP-2] Set-shaped SWA free of full slots' peers. With page_size 1 every slot
        must have a live peer (strict). With page_size > 1 it is page-granular and
        lenient, as SGLang's: every slot of each touched full page loses its peer, and
        slots without one are skipped."""
        full_slots = self.as_slots(full_slots)
        full_pages = self.full.held_pages_of(full_slots, "free_swa")
        if self.page_size == 1:
            self.release_swa_strict(full_slots, "free_swa")
            return
        expanded = self.full.page_slots(full_pages)
        peers = self.mapping[expanded]
        self.mapping[expanded] = NO_SWA_PEER
        self.swa.release_pages(torch.unique(peers[peers > 0] // self.page_size))

    def free_swa_segment(self, full_slots: Slots, start_pos: int) -> None:
        """[MAP-2, I6] Strict SWA free of a row segment: every slot must have a live peer.
        The mapping of the segment's whole full pages is cleared."""
        full_slots = self.as_slots(full_slots)
        self.full.check_segment(full_slots, start_pos, "free_swa_segment")
        self.full.held_pages_of(full_slots, "free_swa_segment")
        self.release_swa_strict(full_slots, "free_swa_segment")

    def release_swa_strict(self, full_slots: Slots, operation: str) -> None:
        peers = self.mapping[full_slots]
        unmapped = full_slots[peers <= 0]
        if unmapped.numel():
            raise InvalidFree(f"{operation}: full slots {unmapped.tolist()} have no live SWA peer (mapping 0); "
                              f"their SWA KV was already released, or never allocated (PD tail head)", unmapped.tolist())
        swa_pages = self.swa.held_pages_of(peers, operation)
        full_page_slots = self.full.page_slots(torch.unique(full_slots // self.page_size))
        self.mapping[full_page_slots] = NO_SWA_PEER
        self.swa.release_pages(swa_pages)

    def check_no_live_peer(self, full_slots: Slots, operation: str) -> None:
        live = full_slots[self.mapping[full_slots] != NO_SWA_PEER]
        if live.numel():
            raise InvalidFree(f"{operation}: full slots {live.tolist()} still have live SWA peers; free them with "
                              f"free / free_segment, or release the SWA side first", live.tolist())

    def free_full(self, full_slots: Slots) -> None:
        """[MAP-2] Free full slots whose SWA peers are already released."""
        full_slots = self.as_slots(full_slots)
        pages = self.full.held_pages_of(full_slots, "free_full")
        # the free is page-granular: no slot of a freed page may keep a live peer
        self.check_no_live_peer(self.full.page_slots(pages), "free_full")
        self.full.free(full_slots)

    def free_full_segment(self, full_slots: Slots, start_pos: int) -> None:
        """[MAP-2, I6] `free_full` of a row segment starting at page-aligned `start_pos`."""
        full_slots = self.as_slots(full_slots)
        self.full.check_segment(full_slots, start_pos, "free_full_segment")
        self.free_full(full_slots)

    def free(self, full_slots: Slots) -> None:
        """[ALLOC-6] Free full slots and their SWA peers where they have one (SWA first: it
        reads the mapping). Not a strict SWA path: a slot whose SWA KV is already released
        frees its full KV only, as SGLang's `free` did for a released range before free_full
        (0.5.19)."""
        full_slots = self.as_slots(full_slots)
        self.full.held_pages_of(full_slots, "free")
        if self.page_size == 1:  # free_swa is strict there
            peers = self.mapping[full_slots]
            self.mapping[full_slots] = NO_SWA_PEER
            self.swa.release_pages(peers[peers > 0])
        else:
            self.free_swa(full_slots)
        self.full.free(full_slots)

    def free_segment(self, full_slots: Slots, start_pos: int) -> None:
        """[ALLOC-6, I6] Free a row segment in both pools (strict on the SWA side)."""
        full_slots = self.as_slots(full_slots)
        self.full.check_segment(full_slots, start_pos, "free_segment")
        self.full.held_pages_of(full_slots, "free_segment")
        self.release_swa_strict(full_slots, "free_segment")
        self.full.free(full_slots)

    def free_group_begin(self) -> None:
        """[I16] Collect frees of both pools until free_group_end; the mapping is cleared
        when a free is queued."""
        if self.full.pending is not None:
            raise InvalidFree("free groups do not nest; call free_group_end first")
        self.full.free_group_begin()
        self.swa.free_group_begin()

    def free_group_end(self) -> None:
        """[I16] Release what the group collected, SWA side first."""
        if self.full.pending is None:
            raise InvalidFree("free_group_end without free_group_begin")
        self.swa.free_group_end()
        self.full.free_group_end()
