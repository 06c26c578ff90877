"""The bugs seeded into TokenSpeed's scheduler 0.1.42 (patches/seeded-bugs.diff), one
switch each in its C++ sources, all in one build (builds.py). Each is a small change of
one line of 0.1.42 and a real class of KV-memory-management bug; each names the clause
of chapter 10 (spec/scheduler.py, SCHED-n) a scheduler-level check that sees only what
the adapter sees (the plan's rows and tables, the pool's counts, aborts and cache ops)
must catch it by, and what tests/test_tokenspeed_builds.py observed of it against the
pinned wheel in the same scenario.

How a process switches one on: the patched build must be the `tokenspeed_scheduler` it
imports (builds.activate(), before the import), and KVSPEC_TOKENSPEED_BUG must name the
bug in the process environment when a `Scheduler` is constructed (select(); the C++ reads
it in every Scheduler constructor and throws ValueError on a name the build does not
know). Unset, every switch is off and the build behaves as 0.1.42.

The upstream repository's stored history (lightseekorg/tokenspeed) shows none of these
six lines changed by a fix: no bug here reverts a known TokenSpeed fix. Each is seeded by
analogy with a named bug of another engine, or a kvspec mutant that models one.
"""

import os
from dataclasses import dataclass

VARIABLE = "KVSPEC_TOKENSPEED_BUG"
"""The environment variable a patched Scheduler's constructor reads (seeded_bugs.h)."""


@dataclass(frozen=True)
class SeededBug:
    slug: str
    """Its name: the value of KVSPEC_TOKENSPEED_BUG that switches it on."""
    clause: str
    """The clause of chapter 10 whose check must catch it."""
    invariant_class: str
    site: str
    """The line of 0.1.42's sources the switch changes (file:line of the sdist)."""
    change: str
    """That line's change, in words."""
    breaks: str
    """What the bug does to memory, and when."""
    observed: str
    """What tests/test_tokenspeed_builds.py sees of it, against the pinned wheel."""
    analogy: str
    """The real bug (or kvspec mutant modelling one) it is seeded after."""


BUGS = (
    SeededBug(
        slug="window-release-one-token-early",
        clause="SCHED-3", invariant_class="window-liveness",
        site="csrc/cache/coordinator/group_geometry.h:125 (GroupGeometry::ExpiredBlocksAt)",
        change="`skipped = p - sliding_window_tokens + 1` becomes `+ 2`",
        breaks="The sliding window is one token short: a page expires once `p - W + 1` tokens lie before it "
               "instead of `p - W`, so whenever `p - W + 1` is a multiple of the page size the page holding "
               "position `p - W`, which the next query still reads, is released (W = sliding_window_tokens - 1). "
               "It also releases one entry more than due (SCHED-4).",
        observed="40-token prompt, W = 7, P = 4: the decode rows at p = 42, 46, 50, ... have a null entry where "
                 "their window reads (entry 8 at p = 42); the pinned wheel never does.",
        analogy="the window-convention off-by-one (a window that counts the current token, and one that does "
                "not): kvspec's vLLM mutant window-one-token-early and SGLang's decode frontier one token late "
                "(adapters/mutants/window.py).",
    ),
    SeededBug(
        slug="decode-skips-window-release",
        clause="SCHED-4", invariant_class="window-bound",
        site="csrc/scheduler/operations/forward.cpp:151 (canConsumeReservedTokensInPlace)",
        change="the decode fast path stops asking whether a page has left the window",
        breaks="A decode step that needs no new page takes the fast path, which consumes reserved tokens in "
               "place and skips the admission that releases expired pages; the page that left the window is "
               "released only at the next step that needs a page. Sliding tables hold one page more than due for "
               "up to a page's worth of decode steps. (0.1.42 takes the fast path past an expired page only when "
               "another request shares it, which SCHED-4 allows; the bug takes it for a page the request alone "
               "holds.)",
        observed="40-token prompt, W = 7, P = 4: the decode rows at p = 43, 47, 51, ... have one leading null "
                 "entry fewer than floor((p - W) / P); no null entry is read (coverage holds).",
        analogy="the missing out-of-window release on one path: kvspec's vLLM mutant no-window-release and "
                "SGLang's decode eviction that never fires (decode-eviction-never).",
    ),
    SeededBug(
        slug="hit-window-one-block-short",
        clause="SCHED-3", invariant_class="window-liveness",
        site="csrc/cache/coordinator/cache_coordinator.cpp:478 (CacheCoordinator::groupAcceptsBoundary)",
        change="the sliding group's acceptance of a prefix boundary starts one block after the window's first",
        breaks="A prefix hit at boundary T is accepted when the sliding group has cached every block of the "
               "window before T but its first: the hitting request's table gets a null entry where its first "
               "query reads (tokens [T - W, T)).",
        observed="A (40 tokens, one chunk) finishes; B shares its first 36 tokens: the pinned wheel gives B no "
                 "hit, the seeded build a hit of 36 with entry 7 (tokens 28..31) null in B's sliding table.",
        analogy="a prefix match that accepts a sliding-window prefix whose window is partly evicted: kvspec's "
                "SGLang mutant match-short-window (the SWA match validator losing count after a tombstone).",
    ),
    SeededBug(
        slug="empty-result-not-landed",
        clause="SCHED-6", invariant_class="leak",
        site="csrc/scheduler/outside_event_handler.cpp:149 (Scheduler::handleEvent(ExtendResult))",
        change="an ExtendResult without tokens no longer counts as a landed forward",
        breaks="The result of an intermediate prefill chunk carries no token; not counting it leaves the "
               "request's forwards-in-flight counter above zero for good. Nothing stops the request, but when "
               "it finishes it stays in Finishing (its pages are released only once every forward landed), so "
               "every page it held stays held: a leak for every request that was prefilled in chunks.",
        observed="40-token prompt in 16-token chunks, finished: the pinned wheel holds 0 pages after the next "
                 "plan (available 63 of 63); the seeded build holds 14 with no request left (no request "
                 "waiting, prefilling or decoding), and clear_cache() is refused.",
        analogy="a release that one path of a request's end never reaches, the leak SGLang's idle check "
                "reports as 'memory leak detected' (e.g. sgl-project/sglang#20182, state kept by requests "
                "aborted while waiting); here through an in-flight counter, the engine-side twin of section 8's "
                "skipped intermediate result.",
    ),
    SeededBug(
        slug="available-counts-pinned-cache",
        clause="SCHED-5", invariant_class="ownership",
        site="csrc/cache/prefix/prefix_index.h:313 (PrefixCacheIndex::ParentIsFullyEvictable)",
        change="a cached page counts as evictable even while a running request still holds it",
        breaks="`available_lcm_blocks()` counts empty pages and cached pages nobody holds; without the "
               "ownership test it also counts cached pages a running request pins (its published prefix), so "
               "they are counted both available and active: the gauge that admission control or an operator "
               "reads overstates free memory. Scheduling itself is unchanged.",
        observed="40-token prompt in 16-token chunks: available + active is 63 at every plan on the pinned "
                 "wheel, and up to 76 on the seeded build while the request holds published pages.",
        analogy="a free-memory gauge that counts locked cache as evictable: the evictable/protected ledgers "
                "of SGLang's radix caches, which kvspec's SGLang mutant ledger-stuck-protected makes drift the "
                "other way.",
    ),
    SeededBug(
        slug="admission-refuses-exact-fit",
        clause="SCHED-7", invariant_class="scheduling",
        site="csrc/cache/coordinator/cache_admission.cpp:613 (AdmissionPlanner::fits)",
        change="`parents_needed <= empty` becomes `parents_needed + 1 <= empty`",
        breaks="An off-by-one in the admission's capacity test: an admission is granted only if it leaves a "
               "page empty, so the last empty page is never handed out. A decode that needs exactly the "
               "pages left stalls while the pool could serve it, and under pressure the scheduler aborts (or "
               "retracts) a victim while a page is still free. Within max_new_tokens TokenSpeed preempts only "
               "in a round that runs nothing, so there the bug mostly delays an admission, which chapter 10's "
               "checks see rarely (SCHED-7, at the ci profile).",
        observed="Two 20-token requests decoding past max_new_tokens on 24 pages, no snapshot pool: the pinned "
                 "wheel leaves a decode out only when no page is empty and aborts at 0 empty pages; the seeded "
                 "build leaves one out with a page empty and aborts a request with 1 page empty.",
        analogy="the capacity check off by one (`<` for `<=`): a watermark nobody accounts for, which starves "
                "the request that needs the last page and preempts another to make room that already was.",
    ),
)
BY_SLUG = {bug.slug: bug for bug in BUGS}


def select(slug: str | None) -> None:
    """Switch `slug` on (None: every bug off) for the Schedulers this process constructs
    from now on. The C++ reads the variable in each Scheduler constructor; a Scheduler
    already built keeps the switch it was built with only until another is constructed
    (the switch is process-wide: one bug per process at a time)."""
    if slug is None:
        os.environ.pop(VARIABLE, None)
        return
    if slug not in BY_SLUG:
        raise ValueError(f"{slug!r} is not a seeded bug of TokenSpeed's patched build; "
                         f"known: {', '.join(BY_SLUG)}")
    os.environ[VARIABLE] = slug
