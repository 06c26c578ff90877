"""What the history table found in SGLang's releases, each explained from the release's
code (docs/engines/sglang-findings.md has the lines, the fix, and the regression vector).

A finding matches a violated run of the table when the run's release is in the finding's
range, its tree is one the finding names, and one of the run's violated clauses is the
finding's. It explains the violation when, besides, the run's trace bisects to the
finding's range (`disagreement`: history.py). The table marks any violation no finding
explains UNEXPLAINED.
"""

import re
from dataclasses import dataclass

from kvspec.conformance.harness.declarations import Run
from kvspec.conformance.runs.bisect import PASSES, RAN, REPRODUCES, Outcome, ranges

from .catalog import key


@dataclass(frozen=True)
class Finding:
    id: str
    kind: str
    """"bug" (of the releases named, fixed in `fixed_in`), or "divergence" (behaviour the
    spec does not allow, kept by those releases on purpose or by default)."""
    first: str
    last: str
    fixed_in: str | None
    trees: tuple[str, ...]
    clauses: tuple[str, ...]
    by_default: tuple[str, str] | tuple[()] | None = None
    """The releases whose default knobs reach it (None: all of first..last; (): none); the
    others between first and last reach it with `knobs` turned."""
    knobs: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    """Knobs that take it away: a member with any of them turned does not reach it (say the
    margin a bug needs, dropped)."""
    says: str = ""
    """A regular expression the violation's message must match (to tell two findings of
    one clause apart), or "" for any."""
    runs: tuple[Run, ...] = ()
    """The runs it shows in (the check's runs at the member's own version), or () for any: a
    table's run is read by its configuration (the report's `run`), never by its label."""
    vector: str | None = None
    """Its regression vector, relative to the repository: a trace under
    vectors/regressions/sglang/, or the trace of the known divergence a bug is also
    recorded as (vectors/divergences/sglang/); its header's `violates` is `clauses`. Every
    bug has one; a divergence may, to pin which members keep it."""
    fix_calls_differ: str = ""
    """Where the fixing release calls what the adapter plays differently (an attribute
    renamed), so that the reproduction recorded on an affected release cannot run there: how
    they differ. Its trace written for the fixing release passes there instead."""

    def reaches(self, release: str, knobs: tuple[str, ...] | list[str]) -> bool:
        """Whether a member of `release` with `knobs` turned has it (any tree it names)."""
        k = key(release)
        if not key(self.first) <= k <= key(self.last) or set(self.unless) & set(knobs):
            return False
        if self.by_default is None or self.by_default and key(self.by_default[0]) <= k <= key(self.by_default[1]):
            return True
        return bool(self.knobs) and set(self.knobs) <= set(knobs)

    def matches(self, cell: dict, run: dict) -> bool:
        clauses = set(run["clauses"]) or {run["verdict"]}  # a crash names no clause: "crashed"
        return (cell["tree"] in self.trees and self.reaches(cell["release"], cell["knobs"])
                and bool(clauses & set(self.clauses))
                and re.search(self.says, run.get("message") or "") is not None
                and (not self.runs or any(shows_in(run.get("run"), each) for each in self.runs)))


FINDINGS = (
    # before checkpoint-short-rematch, which 0.5.18 has too and which names these clauses: a
    # prefill batch (LIFE-9) whose group end freed SWA under a live node, which then maps to nothing
    Finding("grouped-swa-free-remap", "bug", "0.5.18", "0.5.18", "0.5.19", ("python",), ("I3", "I5", "I13", "I4"),
            unless=("no-chunk-release",), says=r"operation='prefill_batch'(.|\n)*(has live SWA KV but maps to 0|but mapping\[\d+\] is 0)",
            vector="vectors/regressions/sglang/grouped-swa-free-remap.jsonl"),
    # (a bug of the chunk release: a member that turns it off keeps every chunk's SWA, and the
    # checkpoint is never short: its vectors pass on every `+no-chunk-release` line, `ranges`)
    Finding("checkpoint-short-rematch", "bug", "0.5.15", "0.5.22", "0.5.23", ("python", "rust"),
            ("I4", "I2", "I3", "I1", "I5", "I10"), by_default=("0.5.18", "0.5.22"), knobs=("chunk-release",),
            unless=("no-chunk-release",),
            vector="vectors/regressions/sglang/checkpoint-short-rematch.jsonl"),
    # the same, where the insert finds part of the key in the tree already: SGLang's own
    # assertion on the short match fires first (both trees)
    Finding("checkpoint-short-rematch", "bug", "0.5.15", "0.5.22", "0.5.23", ("python", "rust"), ("crashed",),
            by_default=("0.5.18", "0.5.22"), knobs=("chunk-release",), unless=("no-chunk-release",),
            says=r"^prefill_(chunk|batch) raised AssertionError: new_prefix_len=",  # a batch checkpoints the same way
            vector="vectors/regressions/sglang/checkpoint-short-rematch-assert.jsonl"),
    # the same, on the Rust core, whose tree cannot be walked: the tree's free of pages the
    # request already freed trips the allocator's assertion when an eviction or a later
    # prefill's allocation meets them (each such trace shows I4 on the Python core of its
    # release, and passes on 0.5.23)
    Finding("checkpoint-short-rematch", "bug", "0.5.19", "0.5.22", "0.5.23", ("rust",), ("crashed",),
            unless=("no-chunk-release",), says="^(evict|prefill_chunk) raised AssertionError", runs=(Run(4, 6, 4),)),
    # the same on 0.5.22's Rust core without the chunk release: its finish path matches again
    # after the insert (below) and the allocator's assertion meets the pages freed twice
    Finding("checkpoint-short-rematch", "bug", "0.5.22", "0.5.22", "0.5.23", ("rust",), ("crashed",),
            by_default=(), knobs=("no-chunk-release",), says="^(evict|prefill_chunk) raised AssertionError",
            runs=(Run(4, 6, 4),)),
    # the same, on 0.5.22's finish path, which also matches again after its insert (a finish at a
    # stop below the cursor's window): double ownership, or SGLang's own assertions on the match
    # (`cache_protected_len <= len(new_indices) + page_size - 1`, then `new_prefix_len <= ...`,
    # 0.5.22 mem_cache/unified_radix_cache.py:1207-1212); on the Rust core, whose tree cannot be
    # walked, the pages freed twice show later: the SWA allocator's assertion at an eviction
    # (allocator/swa.py:546, more free than the pool) or I1 at the drain (a page twice in the free
    # list, the padding page 0 freed). Each such trace of the matrix bisects to 0.5.22 alone.
    Finding("checkpoint-short-rematch", "bug", "0.5.22", "0.5.22", "0.5.23", ("python", "rust"),
            ("I4", "I2", "I3", "I1", "crashed"),
            says=r"\[I\d+\]|new_prefix_len|cache_protected_len=|^evict raised AssertionError",
            vector="vectors/regressions/sglang/checkpoint-short-rematch-finish.jsonl"),
    # the same, where a PD-decode admission's checkpoint leaves the short leaf (pd-tail-not-rounded's
    # tail, 0.5.19 on): at any knobs, as the admission's insert is not the chunk release's
    Finding("checkpoint-short-rematch", "bug", "0.5.19", "0.5.22", "0.5.23", ("python", "rust"),
            ("I4", "I2", "I3", "I1", "crashed"), says=r"pd_admit",
            vector="vectors/regressions/sglang/checkpoint-short-rematch-pd.jsonl"),
    # the same on 0.5.14's unified tree with the release flag on and its page margin dropped
    # (retention W, short of a window after the insert as max(W, P) is later); found by the knob
    # combinations: a batch's trace crashes on every 0.5.14 member with both knobs, passes on
    # those with one (kvspec bisect, docs/engines/sglang-findings.md)
    Finding("checkpoint-short-rematch", "bug", "0.5.14", "0.5.14", None, ("python",),
            ("I4", "I2", "I3", "I1", "I5", "I10", "crashed"), by_default=(), knobs=("chunk-release", "drop-margin"),
            says=r"\[I\d+\]|^prefill_(chunk|batch) raised AssertionError: new_prefix_len="),
    # the same PD form on the Rust core without the chunk release, whose tree cannot be walked:
    # the pages the admission left with two owners are freed twice at a later eviction or
    # chunk (the allocator's assertion, or I1 at the drain); each such trace of the matrix
    # breaks I2/I3 at its admission on the Python tree of its release
    Finding("checkpoint-short-rematch", "bug", "0.5.19", "0.5.22", "0.5.23", ("rust",), ("I1", "crashed"),
            by_default=(), knobs=("no-chunk-release",),
            says=r"^(evict|prefill_chunk) raised AssertionError|^finish raised AssertionError: new_prefix_len=|\[I1\]",
            runs=(Run(4, 6, 4),)),
    # PD-decode admissions are driven from 0.5.19 (catalog.pd_capabilities). The tail is the same
    # since 0.5.19, but only 0.5.23 shows the short leaf itself: before, the match after the insert
    # meets it first (checkpoint-short-rematch's PD form, above), and the bisection leaves those
    # releases out. The Rust core's tree cannot be walked.
    Finding("pd-tail-not-rounded", "bug", "0.5.23", "0.5.23", None, ("python",), ("I10",),
            says="new leaf with live SWA", vector="vectors/divergences/sglang/SGL-11.jsonl"),
    # a PD admission's checkpoint releases the SWA lock its match gave back already (found by the matrix)
    # (with `+early-swa-unlock` as well: that knob's own I11 needs W decode batches, and a trace
    # that breaks I11 on 0.5.19 alone along such a line is this bug's, bisected)
    Finding("pd-swa-lock-released-twice", "bug", "0.5.19", "0.5.19", "0.5.20", ("python",), ("I11",),
            says="SWA lock segment",
            vector="vectors/regressions/sglang/pd-swa-lock-released-twice.jsonl",
            fix_calls_differ="a request's SWA lock is `req.lock_receipt` there, `req.swa_uuid_for_lock` in 0.5.19"),
    # the same on the Rust core, whose tree cannot be walked: the lock counts go wrong unseen
    # until a later checkpoint's match returns less than its request protects, and SGLang's
    # own assertion fires (0.5.19 mem_cache/unified_radix_cache.py:1000); found by the matrix
    # at every knob combination of the Rust tree
    Finding("pd-swa-lock-released-twice", "bug", "0.5.19", "0.5.19", "0.5.20", ("rust",), ("crashed",),
            says=r"^prefill_(chunk|batch) raised AssertionError: req\.kv\.cache_protected_len=",
            vector="vectors/regressions/sglang/pd-swa-lock-released-twice-rust.jsonl",
            fix_calls_differ="a request's SWA lock is `req.lock_receipt` there, `req.swa_uuid_for_lock` in 0.5.19"),
    # before revive-frees-locked-full, which breaks I11 and I14 too (0.5.14) with other messages
    Finding("early-swa-unlock", "divergence", "0.5.14", "0.5.23", None, ("legacy", "python"), ("I11", "I14"),
            by_default=(), knobs=("early-swa-unlock",), says="SWA lock segment|SWA-locked node",
            vector="vectors/regressions/sglang/early-swa-unlock.jsonl"),
    Finding("revive-frees-locked-full", "bug", "0.5.14", "0.5.14", "0.5.15", ("legacy", "python"),
            ("I11", "I14", "I1", "I4"), vector="vectors/regressions/sglang/revive-frees-locked-full.jsonl"),
    Finding("decode-eviction-phase", "bug", "0.5.14", "0.5.17", "0.5.18", ("legacy", "python"), ("I9",),
            says="decode steps, more than", vector="vectors/regressions/sglang/decode-eviction-phase.jsonl"),
    # the same phase gate, where a request decodes in every batch: 0.5.14's page margin keeps W + P
    # at each eviction, so the request holds W + P + I between two, one page past WIN-5; from
    # 0.5.15 (retention max(W, P)), or with the margin dropped, this shape stays within the bound
    Finding("decode-eviction-phase", "bug", "0.5.14", "0.5.14", "0.5.15", ("legacy", "python"), ("I9",),
            unless=("drop-margin",), says="decode steps, more than",
            vector="vectors/regressions/sglang/decode-eviction-phase-margin.jsonl"),
    # the same phase gate, in shapes that need the retention max(W, P) of 0.5.15 - 0.5.17: the
    # matrix's I9 traces at P=4 W=6 reproduce on 0.5.14 only with its page margin dropped (its
    # retention W + P keeps them within the bound; W = max(W, P) there), those at P=16 W=5 on no
    # 0.5.14 member (W + P = 21, or W = 5 with the margin dropped; measured on all four members of
    # both trees): bisected, they reproduce on exactly 0.5.15 - 0.5.17
    Finding("decode-eviction-phase", "bug", "0.5.15", "0.5.17", "0.5.18", ("legacy", "python"), ("I9",),
            says="decode steps, more than"),
    # the same phase gate on the chunk cache (--disable-radix-cache): maybe_evict_swa gates every
    # decode batch's eviction, whatever the cache (0.5.14 managers/schedule_batch.py:2862-2870)
    Finding("decode-eviction-phase", "bug", "0.5.14", "0.5.17", "0.5.18", ("chunk",), ("I9",),
            says="decode steps, more than", vector="vectors/regressions/sglang/decode-eviction-phase-chunk.jsonl"),
    Finding("no-chunk-release", "divergence", "0.5.14", "0.5.15.post1", None, ("legacy",), ("I9",),
            says="the chunk left"),
    Finding("no-chunk-release", "divergence", "0.5.14", "0.5.23", None, ("python", "rust"), ("I9",),
            by_default=("0.5.14", "0.5.17"), knobs=("no-chunk-release",), says="the chunk left"),
)


def shows_in(described: dict | None, run: Run) -> bool:
    """Whether a report's run (its `run`: plan.PlannedRun.description) is `run`."""
    return described is not None and all(described[field] == value for field, value in (
        ("tier", str(run.tier)), ("page_size", run.page_size), ("window", run.window), ("interval", run.interval),
        ("state_grid", run.state_grid), ("state", run.recurrent)))


def explain(cell: dict, run: dict) -> str | None:
    return next((finding.id for finding in FINDINGS if finding.matches(cell, run)), None)


def as_run(outcome: Outcome) -> dict:
    """A bisection's outcome as a table's run reads (`matches`)."""
    return {"clauses": list(outcome.clauses), "verdict": outcome.kind, "message": outcome.message,
            "run": outcome.run}


def disagreement(finding: Finding, tree: str, knobs: tuple[str, ...] | list[str],
                 outcomes: list[tuple[str, Outcome]]) -> str | None:
    """Why a trace's bisection along one line (its members of `tree` with `knobs`, oldest
    release first, and what each did) disagrees with the finding, or None where the releases
    it affects are exactly those the finding reaches, among those that ran it. A release is
    affected where the trace reproduces or fails in a way this finding explains; where
    another finding explains its failure, the trace stopped at another bug first and says
    nothing of this one: it is left out, and said."""
    affected, reached, compared, left_out = [], [], [], []
    for release, outcome in outcomes:
        if outcome.verdict not in RAN:
            continue
        other = None if outcome.verdict == PASSES else \
            explain({"release": release, "tree": tree, "knobs": knobs}, as_run(outcome))
        if other not in (None, finding.id):
            left_out.append(f"{release} ({other})")
            continue
        compared.append(release)
        if outcome.verdict == REPRODUCES or other == finding.id:
            affected.append(release)
        if tree in finding.trees and finding.reaches(release, knobs):
            reached.append(release)
    if affected == reached:
        return None
    return (f"reproduces on {ranges(affected, compared).replace('-', 'none', affected == [])}, finding says "
            f"{ranges(reached, compared).replace('-', 'none', reached == [])}"
            + (f" (stopped first by another finding on {', '.join(left_out)})" if left_out else ""))
