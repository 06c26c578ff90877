"""SGLang's real `SWATokenToKVPoolAllocator` behind kvspec's allocator tier.

Each spec operation calls the allocator method SGLang's scheduler calls for it, with
SGLang's tensor arguments; results come back as lists of ints. Page size 1 has no
`alloc_extend`/`alloc_decode` in SGLang: its scheduler takes `alloc(n)` slots for an
extend or a decode batch (`alloc_token_slots`), and so does this adapter.

Failures are mapped, never hidden: `None` from an allocation becomes `OutOfMemory`
(naming the pool SGLang's own capacity check found short); an AssertionError that
SGLang raises on its contract checks becomes `InvalidFree`/`InvalidAllocation`, and the
harness then checks that the refused call changed nothing.
"""

import inspect
from collections.abc import Sequence

from kvspec.spec.accounting import AllocatorState
from kvspec.spec.outcomes import InvalidAllocation, InvalidFree, OutOfMemory
from kvspec.spec.pages import new_pages_for_decode, new_pages_for_extend, pages_for

from .runtime import sglang
from .view import allocator_state


def build_allocator(size_full: int, size_swa: int, page_size: int, need_sort: bool = False):
    """SGLang's hybrid allocator over a real SWAKVPool with the smallest buffers. With
    `need_sort` (SGLang's choice on its PD servers) freed pages wait in a release list that
    is merged, sorted, into the free list when an allocation runs short."""
    s = sglang()
    # 0.5.14's SWAKVPool also requires enable_kvcache_transpose (it asserts it is off)
    extra = {"enable_kvcache_transpose": False} if "enable_kvcache_transpose" in inspect.signature(
        s.SWAKVPool).parameters else {}
    kvcache = s.SWAKVPool(size=size_full, size_swa=size_swa, page_size=page_size, dtype=s.torch.bfloat16,
                          head_num=1, head_dim=1, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                          device="cpu", **extra)
    return s.SWATokenToKVPoolAllocator(size=size_full, size_swa=size_swa, page_size=page_size,
                                       dtype=s.torch.bfloat16, device="cpu", kvcache=kvcache, need_sort=need_sort)


class SglangAllocatorAdapter:
    def __init__(self, size_full: int, size_swa: int, page_size: int):
        self.allocator = build_allocator(size_full, size_swa, page_size)
        self.P = page_size
        self.torch = sglang().torch

    def tensor(self, values: Sequence[int]):
        return self.torch.tensor(list(values), dtype=self.torch.int64)

    # -- observation ----------------------------------------------------------------------

    def state(self) -> AllocatorState:
        return allocator_state(self.allocator)

    def available_sizes(self) -> tuple[int, int]:
        return self.allocator.full_available_size(), self.allocator.swa_available_size()

    def translate(self, full_slots: Sequence[int]) -> list[int]:
        return self.allocator.full_to_swa_index_mapping[self.tensor(full_slots)].tolist()

    # -- allocation -----------------------------------------------------------------------

    def out_of_memory(self, full_pages: int, swa_pages: int) -> OutOfMemory:
        full, swa = (size // self.P for size in self.available_sizes())
        return OutOfMemory("full", full_pages, full) if full_pages > full else OutOfMemory("swa", swa_pages, swa)

    def allocated(self, result, full_pages: int, swa_pages: int) -> list[int] | OutOfMemory:
        return self.out_of_memory(full_pages, swa_pages) if result is None else result.tolist()

    def allocate(self, method, *args, **kwargs):
        try:
            return method(*args, **kwargs)
        except AssertionError as error:
            raise InvalidAllocation(f"SGLang refused {method.__name__}: {error or 'assertion failed'}") from error

    def alloc(self, num_tokens: int) -> list[int] | OutOfMemory:
        return self.allocated(self.allocate(self.allocator.alloc, num_tokens), num_tokens, num_tokens)

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_loc: Sequence[int]):
        tokens = sum(seq_lens) - sum(prefix_lens)
        if self.P == 1:  # SGLang's alloc_token_slots
            return self.alloc(tokens)
        prefix, seq = self.tensor(prefix_lens), self.tensor(seq_lens)
        result = self.allocate(self.allocator.alloc_extend, prefix, prefix.clone(), seq, seq.clone(),
                               self.tensor(last_loc), tokens)
        pages = sum(new_pages_for_extend(p, n, self.P) for p, n in zip(prefix_lens, seq_lens))
        return self.allocated(result, pages, pages)

    def alloc_decode(self, seq_lens: Sequence[int], last_loc: Sequence[int]):
        if self.P == 1:  # SGLang's alloc_token_slots
            return self.alloc(len(seq_lens))
        seq = self.tensor(seq_lens)
        result = self.allocate(self.allocator.alloc_decode, seq, seq.clone(), self.tensor(last_loc))
        pages = sum(new_pages_for_decode(n, self.P) for n in seq_lens)
        return self.allocated(result, pages, pages)

    def alloc_extend_swa_tail(self, prefix_len: int, seq_len: int, last_loc: int, swa_tail_len: int):
        prefix, seq = self.tensor([prefix_len]), self.tensor([seq_len])
        result = self.allocate(self.allocator.alloc_extend_swa_tail, prefix, prefix.clone(), seq, seq.clone(),
                               self.tensor([last_loc]), seq_len - prefix_len, swa_tail_len)
        return self.allocated(result, new_pages_for_extend(prefix_len, seq_len, self.P),
                              pages_for(swa_tail_len, self.P))

    # -- frees ----------------------------------------------------------------------------

    def release(self, method, slots: Sequence[int], **kwargs) -> None:
        try:
            method(self.tensor(slots), **kwargs)
        except AssertionError as error:
            raise InvalidFree(f"SGLang refused {method.__name__}: {error or 'assertion failed'}", slots) from error

    def free(self, slots):
        self.release(self.allocator.free, slots)

    def free_swa(self, slots):
        self.release(self.allocator.free_swa, slots)

    def free_full(self, slots):
        self.release(self.allocator.free_full, slots)

    def free_segment(self, slots, start_pos: int):
        self.release(self.allocator.free_segment, slots, start_pos=start_pos)

    def free_swa_segment(self, slots, start_pos: int):
        self.release(self.allocator.free_swa_segment, slots, start_pos=start_pos)

    def free_full_segment(self, slots, start_pos: int):
        self.release(self.allocator.free_full_segment, slots, start_pos=start_pos)

    def free_group_begin(self):
        self.allocator.free_group_begin()

    def free_group_end(self):
        self.allocator.free_group_end()

    def clear(self):
        self.allocator.clear()
