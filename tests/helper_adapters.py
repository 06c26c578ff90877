"""Adapters that expose their own versions of the spec's pure helpers, for the
`diff-helpers` tests; loaded by `module:attribute` as a third party's would be.

The helpers are written out here, as an engine would have them, not imported from the
spec: CrossHair must compare two pieces of code, not one with itself.
"""

from typing import ClassVar

from kvspec.spec.window import (
    DESIGN_MARGIN,
    MAX_WINDOW_PAGE,
    NO_PREFIX_SHARING,
    SGLANG_0_5_23,
    WindowEviction,
)


def make_allocator(size_full, size_swa, page_size):
    # Imported on use: the CrossHair subprocesses import this module for its helpers
    # alone, and should not pay for torch.
    from kvspec.adapters.reference import ReferenceAllocatorAdapter

    return ReferenceAllocatorAdapter(size_full, size_swa, page_size)


class NO_HELPERS:
    name = "no-helpers"
    policy_version = "sglang-0.5.23"
    capabilities = ("page_size_1", "page_size_gt_1", "full_frees", "segment_frees")
    make_allocator = staticmethod(make_allocator)


# --- faithful copies ---------------------------------------------------------------------

def ceil_page(x, page_size):
    # The same value by another route. (Not for a negative page_size, which the spec's
    # preconditions exclude: a comparison that ignored them would flag this.)
    return -(-x // page_size) * page_size


def new_pages_for_decode(seq_len, page_size):
    return int(seq_len % page_size == 1 % page_size)  # SGLang's form, made right at page_size 1


def frontier(pre_len, cursor, cache_protected_len, window, page_size, version, eviction_interval, retain_floor,
             floor_to_page):
    """A copy of the spec's eviction frontier, written out; `floor_to_page` False is the bug."""
    if pre_len - window < cursor + eviction_interval:
        return None
    if version == SGLANG_0_5_23:
        retention = -(-max(window, page_size) // page_size) * page_size
    elif version == DESIGN_MARGIN:
        retention = window + page_size
    elif version == MAX_WINDOW_PAGE:
        retention = max(window, page_size)
    else:
        retention = window
    raised = max(cursor, cache_protected_len)
    threshold = pre_len - retention
    clamped = False
    if retain_floor is not None and version != NO_PREFIX_SHARING and retain_floor < threshold:
        threshold, clamped = retain_floor, True
    new_cursor = max(raised, threshold)
    if floor_to_page:
        new_cursor = new_cursor // page_size * page_size
    return WindowEviction(raised, new_cursor, clamped or threshold <= raised)


def eviction_frontier(pre_len, cursor, cache_protected_len, window, page_size, version,
                      eviction_interval=1, retain_floor=None):
    return frontier(pre_len, cursor, cache_protected_len, window, page_size, version, eviction_interval,
                    retain_floor, floor_to_page=True)


class FAITHFUL(NO_HELPERS):
    name = "faithful-helpers"
    helpers: ClassVar[dict] = {"pages.ceil_page": ceil_page,
               "pages.new_pages_for_decode": "helper_adapters:new_pages_for_decode",
               "window.eviction_frontier": eviction_frontier}


# --- realistic off-by-ones ---------------------------------------------------------------

def ceil_page_plus_one(x, page_size):
    return (x // page_size + 1) * page_size  # one page too many when x is a page multiple


def eviction_frontier_unfloored(pre_len, cursor, cache_protected_len, window, page_size, version,
                                eviction_interval=1, retain_floor=None):
    # the page floor forgotten: the cursor stops inside a page
    return frontier(pre_len, cursor, cache_protected_len, window, page_size, version, eviction_interval,
                    retain_floor, floor_to_page=False)


class OFF_BY_ONE(NO_HELPERS):
    name = "off-by-one-helpers"
    helpers: ClassVar[dict] = {"pages.ceil_page": ceil_page_plus_one,
               "window.eviction_frontier": eviction_frontier_unfloored}


def ceil_page_that_hangs(x, page_size):
    while x == 5:  # an implementation that never returns on one input
        pass
    return ceil_page(x, page_size)


class HANGING(NO_HELPERS):
    name = "hanging-helper"
    helpers: ClassVar[dict] = {"pages.ceil_page": ceil_page_that_hangs}


# --- mappings kvspec refuses -----------------------------------------------------------

def floor_page_of_one(x):
    return x


class BAD_MAPPING(NO_HELPERS):
    name = "bad-mapping"
    helpers: ClassVar[dict] = {"pages.ceil": ceil_page,                    # no such spec helper
               "pages.pages_for": 42,                      # not a function
               "pages.floor_page": floor_page_of_one,      # one parameter; the spec's has two
               "window.swa_tail_len": lambda fill_len, window, page_size, prefix_sharing: 0,  # not importable
               "window.retention": "helper_adapters:no_such_function"}


class NOT_A_MAPPING(NO_HELPERS):
    helpers: ClassVar[list] = [ceil_page]
