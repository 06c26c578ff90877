"""One paged KV pool [ALLOC-1]: free pages, page-granular frees, free groups.

`PoolAllocator(size, page_size=1)` is SGLang's token allocator; with page_size > 1 it is
the paged allocator. Page 0 is the padding page (MODEL-2): never handed out, never
freed. The free list is a tensor of page ids; which free page an allocation gets is
not part of the spec (MODEL-5), this model simply takes them from the front.

Every operation validates its arguments before it changes anything, so an error or an
`OutOfMemory` leaves the pool exactly as it was (ALLOC-4, ALLOC-6).
"""

from collections import Counter
from typing import Sequence

import torch

from kvspec.spec.accounting import PoolState
from kvspec.spec.notation import PADDING_PAGE
from kvspec.spec.outcomes import InvalidAllocation, InvalidConfig, InvalidFree, OutOfMemory
from kvspec.spec.pages import ExtendPlacement, extend_placement

Slots = torch.Tensor  # 1-D int64 tensor of slot ids


class PoolAllocator:
    def __init__(self, size: int, page_size: int = 1, *, name: str = "full", device: str | torch.device = "cpu"):
        if page_size < 1 or size < page_size or size % page_size != 0:
            raise InvalidConfig(f"{name} pool: size {size} must be a positive multiple of page_size {page_size} "
                                f"(page_size >= 1)")
        self.name = name
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.device = torch.device(device)
        self.clear()

    # -- state ------------------------------------------------------------------------

    def clear(self) -> None:
        """Every page free, no open free group."""
        # The free list as a stack: free_stack[:free_top] holds the free pages, the next
        # one to take on top. A free pushes, an allocation pops: neither copies the pool.
        self.free_stack = torch.arange(self.num_pages, 0, -1, dtype=torch.int64, device=self.device)
        self.free_top = self.num_pages
        self.page_is_free = torch.ones(self.num_pages + 1, dtype=torch.bool, device=self.device)
        self.page_is_free[PADDING_PAGE] = False
        self.page_is_pending = torch.zeros_like(self.page_is_free)
        self.pending: list[torch.Tensor] | None = None

    @property
    def free_pages(self) -> torch.Tensor:
        """The free pages, the next one to take first."""
        return self.free_stack[:self.free_top].flip(0)

    def available_pages(self) -> int:
        return self.free_top

    def available_size(self) -> int:
        return self.available_pages() * self.page_size

    def state(self, partial: bool = False) -> PoolState:
        """What the pool shows; `partial` [OBS-4]: the free count, not the free list."""
        pending = torch.cat(self.pending).tolist() if self.pending else []
        free = None if partial else tuple(self.free_pages.tolist())
        return PoolState(self.name, self.page_size, self.num_pages, free, tuple(pending), self.free_top)

    def page_slots(self, pages: torch.Tensor) -> Slots:
        """All slots of the given pages, page by page."""
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages.reshape(-1, 1) * self.page_size + offsets).reshape(-1)

    # -- allocation -------------------------------------------------------------------

    def take_pages(self, count: int) -> torch.Tensor | OutOfMemory:
        """Pop `count` free pages."""
        if count > self.available_pages():
            return OutOfMemory(self.name, count, self.available_pages())
        self.free_top -= count
        pages = self.free_stack[self.free_top:self.free_top + count].flip(0)
        self.page_is_free[pages] = False
        return pages

    def alloc(self, num_tokens: int) -> Slots | OutOfMemory:
        """[ALLOC-1] `num_tokens` slots on whole new pages (a multiple of page_size)."""
        if num_tokens < 0 or num_tokens % self.page_size != 0:
            raise InvalidAllocation(f"{self.name} pool: alloc({num_tokens}) must ask for whole pages "
                                    f"(a multiple of page_size {self.page_size}); use alloc_extend for a sequence")
        pages = self.take_pages(num_tokens // self.page_size)
        return pages if isinstance(pages, OutOfMemory) else self.page_slots(pages)

    def plan_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int],
                    last_loc: Sequence[int]) -> list[ExtendPlacement]:
        """[PAGE-3, ALLOC-5] Validate a batched extend and split each request into phases."""
        if not len(prefix_lens) == len(seq_lens) == len(last_loc):
            raise InvalidAllocation(f"{self.name} pool: prefix_lens, seq_lens and last_loc must have one entry per request "
                                    f"(got {len(prefix_lens)}, {len(seq_lens)}, {len(last_loc)})")
        plans = []
        for i, (prefix, seq, last) in enumerate(zip(prefix_lens, seq_lens, last_loc)):
            if not 0 <= prefix <= seq:
                raise InvalidAllocation(f"{self.name} pool: request {i}: need 0 <= prefix_len <= seq_len (got {prefix}, {seq})")
            plan = extend_placement(prefix, seq, self.page_size)
            if plan.in_partial_page:
                self.check_continues_page(last, prefix, f"request {i}")
            plans.append(plan)
        return plans

    def check_continues_page(self, last_loc: int, length: int, who: str) -> None:
        """[PAGE-4] A sequence of `length` tokens whose last slot is `last_loc` may grow in
        place only if that slot is on a held page at the matching in-page offset."""
        if last_loc < 0 or last_loc >= self.size + self.page_size:
            raise InvalidAllocation(f"{self.name} pool: {who}: last_loc {last_loc} is not a slot of the pool, "
                                    f"but a prefix of {length} tokens ends inside a page")
        page = last_loc // self.page_size
        if page == PADDING_PAGE or bool(self.page_is_free[page]) or bool(self.page_is_pending[page]):
            raise InvalidAllocation(f"{self.name} pool: {who}: last_loc {last_loc} lies on page {page}, "
                                    f"which is not held; pass the slot of the sequence's last token")
        if (last_loc + 1) % self.page_size != length % self.page_size:
            raise InvalidAllocation(f"{self.name} pool: {who}: last_loc {last_loc} is at in-page offset "
                                    f"{last_loc % self.page_size}, but position {length - 1} needs offset "
                                    f"{(length - 1) % self.page_size}")

    def place_extend(self, plans: Sequence[ExtendPlacement], last_loc: Sequence[int],
                     pages: torch.Tensor) -> Slots:
        """[PAGE-3] Lay each request's new tokens: fill its partial page after `last_loc`,
        then whole new pages, then the start of one more page. `pages` are the new pages,
        consumed in request order."""
        pieces = []
        next_page = 0
        for plan, last in zip(plans, last_loc):
            if plan.in_partial_page:
                pieces.append(torch.arange(last + 1, last + 1 + plan.in_partial_page,
                                           dtype=torch.int64, device=self.device))
            mine = pages[next_page:next_page + plan.new_pages]
            next_page += plan.new_pages
            pieces.append(self.page_slots(mine)[:plan.on_whole_pages + plan.on_last_page])
        return torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64, device=self.device)

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int],
                     last_loc: Sequence[int]) -> Slots | OutOfMemory:
        """[ALLOC-1] Grow each request from prefix_len to seq_len tokens."""
        return self.allocate(self.plan_extend(prefix_lens, seq_lens, last_loc), last_loc)

    def allocate(self, plans: Sequence[ExtendPlacement], last_loc: Sequence[int]) -> Slots | OutOfMemory:
        """Take the pages the plans need and lay the tokens on them."""
        pages = self.take_pages(sum(plan.new_pages for plan in plans))
        return pages if isinstance(pages, OutOfMemory) else self.place_extend(plans, last_loc, pages)

    def plan_decode(self, seq_lens: Sequence[int], last_loc: Sequence[int]) -> list[ExtendPlacement]:
        """A decode step is an extend by one token."""
        return self.plan_extend([seq - 1 for seq in seq_lens], seq_lens, last_loc)

    def alloc_decode(self, seq_lens: Sequence[int], last_loc: Sequence[int]) -> Slots | OutOfMemory:
        """[ALLOC-1] One slot per request for its token at position seq_len - 1."""
        for seq in seq_lens:
            if seq < 1:
                raise InvalidAllocation(f"{self.name} pool: a decode step grows a request to seq_len >= 1 (got {seq})")
        # an extend by one token takes new_pages_for_decode pages (PAGE-2's contract)
        return self.allocate(self.plan_decode(seq_lens, last_loc), last_loc)

    # -- freeing ----------------------------------------------------------------------

    def held_pages_of(self, slots: Slots, operation: str) -> torch.Tensor:
        """[ALLOC-6] The distinct pages of `slots`, after checking the caller holds them:
        no padding page, no slot named twice, no page that is free or pending."""
        slots = torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)
        # the checks on the ids themselves run on a list: a free names a few slots, and
        # one torch call per check would cost more than the loop
        values = slots.tolist()
        if not values:
            return slots
        bad = [slot for slot in values if not 0 <= slot < self.size + self.page_size]
        if bad:
            raise InvalidFree(f"{self.name} pool: {operation}: slots {bad} are not slots of the pool", bad)
        padding = [slot for slot in values if slot // self.page_size == PADDING_PAGE]
        if padding:
            raise InvalidFree(f"{self.name} pool: {operation}: slots {padding} are on the padding page 0, "
                              f"which is never allocated", padding)
        if len(set(values)) < len(values):
            twice = sorted(slot for slot, count in Counter(values).items() if count > 1)
            raise InvalidFree(f"{self.name} pool: {operation}: slots {twice} are named more than once (double free)", twice)
        pages = slots // self.page_size
        unheld = slots[self.page_is_free[pages] | self.page_is_pending[pages]]
        if unheld.numel():
            raise InvalidFree(f"{self.name} pool: {operation}: slots {unheld.tolist()} lie on pages that are already "
                              f"free or freed in the open free group (double free)", unheld.tolist())
        return torch.unique(pages)

    def release_pages(self, pages: torch.Tensor) -> None:
        """Return held pages (already validated), or queue them in the open free group."""
        if pages.numel() == 0:
            return
        if self.pending is not None:
            self.page_is_pending[pages] = True
            self.pending.append(pages)
            return
        self.page_is_free[pages] = True
        # freed pages are reused first, as in SGLang: pages[0] ends on top
        end = self.free_top + pages.numel()
        if end > self.free_stack.numel():  # more free pages than the pool has: only a seeded bug
            grown = torch.zeros(end - self.free_stack.numel(), dtype=torch.int64, device=self.device)
            self.free_stack = torch.cat((self.free_stack, grown))
        self.free_stack[self.free_top:end] = pages.flip(0)
        self.free_top = end

    def free(self, slots: Slots) -> None:
        """[ALLOC-6] Page-granular: any slot frees its whole page."""
        self.release_pages(self.held_pages_of(slots, "free"))

    def free_segment(self, slots: Slots, start_pos: int) -> None:
        """[ALLOC-6] Free a row segment that starts at position `start_pos` (page aligned);
        its pages are released whole, the last one too."""
        self.check_segment(slots, start_pos, "free_segment")
        self.free(slots)

    def check_segment(self, slots: Slots, start_pos: int, operation: str) -> None:
        """[I6] A freed segment starts on a page boundary and its slots sit at their
        positions' in-page offsets, so no page is split between two frees."""
        if start_pos % self.page_size != 0:
            raise InvalidFree(f"{self.name} pool: {operation}: start_pos {start_pos} is not a multiple of page_size "
                              f"{self.page_size}; a segment split inside a page would free the page twice")
        slots = torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)
        positions = torch.arange(start_pos, start_pos + slots.numel(), device=self.device)
        misplaced = slots[slots % self.page_size != positions % self.page_size]
        if misplaced.numel():
            raise InvalidFree(f"{self.name} pool: {operation}: slots {misplaced.tolist()} are not at their positions' "
                              f"in-page offsets; pass the row segment as allocated", misplaced.tolist())

    # -- free groups ------------------------------------------------------------------

    def free_group_begin(self) -> None:
        """[I16] Start collecting frees; nothing returns to the free list until the end."""
        if self.pending is not None:
            raise InvalidFree(f"{self.name} pool: free groups do not nest; call free_group_end first")
        self.pending = []

    def free_group_end(self) -> None:
        """[I16] Release exactly what the group collected."""
        if self.pending is None:
            raise InvalidFree(f"{self.name} pool: free_group_end without free_group_begin")
        pending, self.pending = self.pending, None
        if pending:
            pages = torch.cat(pending)
            self.page_is_pending[pages] = False
            self.release_pages(pages)
