"""Window eviction [WIN-1 .. WIN-6]: which SWA KV a request may release, and when.

A sliding-window layer at position `p` reads only positions `[p - W, p)`. SWA KV of
older positions is dead and can be freed. A request keeps a page-aligned cursor
`swa_evicted_seqlen` (written `e`): below it (and at or above `cache_protected_len`,
the start of what the request owns privately) its SWA KV is already released.

`eviction_frontier` is the one decision: given the cursor and the length the model has
already processed (`pre_len`), where the cursor moves and what is freed. Policy versions
differ only in how much they retain below `pre_len` (WIN-2); they are data (`Policy`),
not forks of the code.
"""

from dataclasses import dataclass

from .notation import Position
from .outcomes import Name
from .pages import ceil_page, floor_page


class PolicyVersion(Name):
    """[WIN-1] A policy version: what window eviction retains and how a prefix cache keeps
    it. Each version is of one memory model (kvspec.spec.models), the chapter whose
    engines implement it; it prints as its name ("sglang-0.5.23")."""

    SGLANG_0_5_23 = ("sglang-0.5.23", "two-pool")
    """SGLang 0.5.23: retention `ceil_page(max(W, P))`."""
    DESIGN_MARGIN = ("design-margin", "two-pool")
    """Retention `W + P` (SGLang 0.5.14)."""
    DROP_MARGIN = ("drop-margin", "two-pool")
    """Retention `W`, no margin."""
    NO_PREFIX_SHARING = ("no-prefix-sharing", "two-pool")
    """Retention `W`, and the prefix cache shares no prefix between requests."""
    MAX_WINDOW_PAGE = ("max-window-page", "two-pool")
    """SGLang 0.5.15 - 0.5.22: retention `max(W, P)`, not rounded up to a page."""
    VLLM_0_33 = ("vllm-0.33", "block-pool")
    """One shared block pool (chapter 08): retention W, released at every allocation; the
    sliding-window group caches only the blocks a hit at a prompt's end can use (vLLM's
    engine default, prefix-cache retention 0)."""
    VLLM_0_33_DENSE = ("vllm-0.33-dense", "block-pool")
    """The same, with every whole sliding-window block cached (prefix-cache retention None)."""

    def __new__(cls, value: str, model: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.model_name = model
        return member

    @property
    def model(self):
        """Its memory model (kvspec.spec.models.MODELS), without recurrent state."""
        from .models import MODELS  # models.py reads the versions of each model from here

        return MODELS[self.model_name]


SGLANG_0_5_23 = PolicyVersion.SGLANG_0_5_23
DESIGN_MARGIN = PolicyVersion.DESIGN_MARGIN
DROP_MARGIN = PolicyVersion.DROP_MARGIN
NO_PREFIX_SHARING = PolicyVersion.NO_PREFIX_SHARING
MAX_WINDOW_PAGE = PolicyVersion.MAX_WINDOW_PAGE
VLLM_0_33 = PolicyVersion.VLLM_0_33
VLLM_0_33_DENSE = PolicyVersion.VLLM_0_33_DENSE
POLICY_VERSIONS = tuple(PolicyVersion)
TWO_POOL_VERSIONS = tuple(version for version in PolicyVersion if version.model_name == "two-pool")
"""The versions of the two-pool model (chapters 01-07), the reference's."""
BLOCK_POOL_VERSIONS = tuple(version for version in PolicyVersion if version.model_name == "block-pool")
"""The versions of the shared block pool (chapter 08)."""


FULL, SWA = "full", "swa"
"""The kinds of attention layer group of a shared block pool (chapter 08)."""
EVERY_GROUP = (FULL, SWA)
"""Every group kind: `Policy.uncached_first`'s default, and the layout of every engine of
the two-pool model (`EngineConfig.layout`)."""


@dataclass(frozen=True)
class Policy:
    """[WIN-1] A policy version: how much window eviction retains, whether the prefix
    cache shares prefixes between requests, and the decode eviction cadence."""

    version: PolicyVersion = SGLANG_0_5_23
    decode_eviction_interval: int = 128
    """I: decode evicts once the frontier has moved this many tokens past the cursor."""
    chunk_release: bool = True
    """[WIN-4] Whether a chunked prefill releases the SWA KV that slid out of its window
    (at each checkpoint, or before each chunk without prefix sharing). Off, a long
    prompt keeps the SWA of every chunk until decode eviction or the tree frees it:
    SGLang's legacy tree, and its unified tree with
    SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS off (the default up to 0.5.17)."""
    null_block_counted: bool = True
    """[BLOCK-3] Whether a shared block pool keeps its null block's reference count at 0.
    Off, the count is not maintained: vLLM before 0.33 decrements it at every free of a
    table that holds the null block and raises it at every hit that adopts one (its
    `block_pool.py` says so where it makes the null block), and nothing reads it."""
    uncached_first: tuple[str, ...] = EVERY_GROUP
    """[BLOCK-10] The groups (by kind) whose releases put the blocks they free without a key
    at the free queue's head, to be reused first; a group's not named queue every block
    they free at the tail, in release order, cached or not. Every group in vLLM from 0.24,
    the sliding-window group only in 0.23, none before."""

    def __post_init__(self):
        # a trace names its version by string: hold the member, so that it knows its model
        # (an unknown name stays as it is, for validate_window_config to say what is wrong)
        if self.version in POLICY_VERSIONS:
            object.__setattr__(self, "version", PolicyVersion(self.version))
        if isinstance(self.uncached_first, list):  # as a trace writes it
            object.__setattr__(self, "uncached_first", tuple(self.uncached_first))

    @property
    def supports_prefix_sharing(self) -> bool:
        return self.version != NO_PREFIX_SHARING


def validate_window_config(window: int, page_size: int, policy: Policy) -> list[str]:
    """[MODEL-4] What is wrong with a window configuration, as sentences that say how to
    fix it; empty when it is valid."""
    problems = []
    if window < 1:
        problems.append(f"sliding window must be >= 1 token (got {window})")
    if page_size < 1:
        problems.append(f"page_size must be >= 1 (got {page_size})")
    if policy.version not in POLICY_VERSIONS:
        problems.append(f"unknown policy version {policy.version!r}; choose one of {', '.join(POLICY_VERSIONS)}")
    if policy.decode_eviction_interval < 1:
        problems.append(f"decode_eviction_interval must be >= 1 (got {policy.decode_eviction_interval})")
    if not isinstance(policy.chunk_release, bool):
        problems.append(f"chunk_release must be true or false (got {policy.chunk_release!r})")
    if not isinstance(policy.null_block_counted, bool):
        problems.append(f"null_block_counted must be true or false (got {policy.null_block_counted!r})")
    if not (isinstance(policy.uncached_first, tuple) and set(policy.uncached_first) <= set(EVERY_GROUP)):
        problems.append(f"uncached_first must list group kinds, of full and swa (got {policy.uncached_first!r})")
    return problems


def retention(version: str, window: int, page_size: int) -> int:
    """[WIN-2] Tokens the frontier stays below `pre_len`:
    sglang-0.5.23 `ceil_page(max(W, P))` (the window rounded up to a page);
    design-margin `W + P`; max-window-page `max(W, P)`; drop-margin and no-prefix-sharing `W`.

    pre: window >= 1 and page_size >= 1
    pre: version in TWO_POOL_VERSIONS
    post: __return__ >= window
    """
    if version == SGLANG_0_5_23:
        return ceil_page(max(window, page_size), page_size)
    if version == DESIGN_MARGIN:
        return window + page_size
    if version == MAX_WINDOW_PAGE:
        return max(window, page_size)
    return window


@dataclass(frozen=True)
class WindowEviction:
    """[WIN-3] The outcome of one eviction attempt: the cursor after the raise to
    `cache_protected_len` (`raised_cursor`) and after the free (`new_cursor`); the
    request frees the SWA KV of positions `[raised_cursor, new_cursor)`."""

    raised_cursor: Position
    new_cursor: Position
    clamped: bool = False
    """The threshold was lowered by `retain_floor`, or the raise to the protected length
    decided the cursor: the window-bound clause WIN-5 does not apply to this step."""


def eviction_frontier(pre_len: Position, cursor: Position, cache_protected_len: Position,
                      window: int, page_size: int, version: str, eviction_interval: int = 1,
                      retain_floor: Position | None = None) -> WindowEviction | None:
    """[WIN-3] Window eviction of one request that has processed `pre_len` tokens.

    None (nothing changes, not even the cursor) while the window has not moved
    `eviction_interval` tokens past the cursor. Otherwise the cursor is first raised to
    `cache_protected_len` (below it the prefix cache owns the KV), then moved to the
    threshold `pre_len - retention`, lowered to `retain_floor` if one is given (prefix
    sharing only), never backwards, and floored to a page.

    pre: page_size >= 1 and window >= 1 and eviction_interval >= 1
    pre: version in TWO_POOL_VERSIONS
    pre: cursor >= 0 and cursor % page_size == 0
    pre: cache_protected_len >= 0 and cache_protected_len % page_size == 0
    pre: pre_len >= 0
    post: __return__ is None or __return__.raised_cursor <= __return__.new_cursor
    post: __return__ is None or __return__.new_cursor % page_size == 0
    post: __return__ is None or __return__.raised_cursor == max(cursor, cache_protected_len)
    post: __return__ is None or __return__.new_cursor == __return__.raised_cursor or __return__.new_cursor <= pre_len - window
    """
    if pre_len - window < cursor + eviction_interval:
        return None
    raised = max(cursor, cache_protected_len)
    threshold = pre_len - retention(version, window, page_size)
    clamped = False
    if retain_floor is not None and version != NO_PREFIX_SHARING and retain_floor < threshold:
        threshold, clamped = retain_floor, True
    new_cursor = floor_page(max(raised, threshold), page_size)
    clamped = clamped or threshold <= raised
    return WindowEviction(raised, new_cursor, clamped)


def decode_eviction_due(seq_len: Position, cursor: Position, window: int, interval: int) -> bool:
    """[WIN-4, LIFE-8] A decoding request evicts (with `pre_len = seq_len - 1` and interval 1)
    once the window has moved `interval` tokens past its cursor. The first decode step
    of a request never evicts (the previous extend may still be reading)."""
    return seq_len - 1 - window >= cursor + interval


def eviction_span_bound(retained: int, page_size: int) -> int:
    """[WIN-5] The most SWA slots a request holds right after an unclamped eviction with
    retention `retained`, measured as `ceil_page(L) - cursor` for `L <= pre_len + 1`:
    exactly `retained + P` when `retained` is a page multiple, else `retained + 2P - 1`.

    pre: retained >= 1 and page_size >= 1
    post: __return__ >= retained + page_size
    """
    if retained % page_size == 0:
        return retained + page_size
    return retained + 2 * page_size - 1


def decode_window_bound(version: str, window: int, page_size: int, interval: int) -> int:
    """[WIN-5] The most private SWA slots a decoding request holds after each step's
    allocation, once its third decode step has run: the span right after an eviction,
    or the window plus what accumulates between two evictions.

    pre: window >= 1 and page_size >= 1 and interval >= 1
    pre: version in TWO_POOL_VERSIONS
    """
    return max(eviction_span_bound(retention(version, window, page_size), page_size),
               window + interval + page_size - 1)


def swa_tail_len(fill_len: Position, window: int, page_size: int, prefix_sharing: bool) -> int:
    """[WIN-6, LIFE-6] The SWA tail of a PD-decode pre-allocation of `fill_len` tokens: it starts
    on the page at or below `fill_len - W` (with a decode-side prefix cache: below
    `fill_len - 1 - max(W, P)`, so the prefix match stays clear of the tail).

    pre: fill_len >= 0 and window >= 1 and page_size >= 1
    post: 0 <= __return__ <= fill_len
    post: (fill_len - __return__) % page_size == 0
    post: __return__ >= min(window, fill_len)
    """
    if prefix_sharing:
        head = max(0, fill_len - 1 - max(window, page_size))
    else:
        head = max(0, fill_len - window)
    return fill_len - floor_page(head, page_size)


def swa_match_length(path: list[tuple[int, bool]], window: int) -> int:
    """[WIN-7, TREE-2] How far a prefix match may go along a root-to-leaf path of
    `(key_length, has_live_swa)` nodes: to the deepest node at which the live SWA run
    is unbroken from the root, or at least `window` tokens long after the last
    tombstone. (A match ending there still sees its whole window.)

    pre: window >= 1
    pre: all(length > 0 for length, _ in path)
    post: 0 <= __return__ <= sum(length for length, _ in path)
    """
    matched = depth = 0
    live_run = None  # None: no tombstone met yet, every node is acceptable
    for length, has_live_swa in path:
        depth += length
        if not has_live_swa:
            live_run = 0
            continue
        if live_run is not None:
            live_run += length
        if live_run is None or live_run >= window:
            matched = depth
    return matched


def insert_keeps_window(insert_end: Position, cursor: Position, window: int) -> bool:
    """[I10, TREE-3] After a checkpoint inserts `[0, insert_end)`, the live SWA of the new leaf,
    `[cursor, insert_end)`, is at least `min(W, insert_end)` long: the leaf stays
    matchable and is never all-tombstone.

    pre: window >= 1 and 0 <= cursor
    """
    return insert_end - cursor >= min(window, insert_end)


def promises_insert_window(version: str) -> bool:
    """[I10] The policy versions whose retention keeps every inserted leaf matchable:
    those that round the window up to a page or add one (WIN-2)."""
    return version in (SGLANG_0_5_23, DESIGN_MARGIN)


def insert_window_at_risk(version: str, window: int, page_size: int) -> bool:
    """[WIN-2, I10] Whether a checkpoint's inserted leaf can keep fewer than W live tokens
    under `version`: drop-margin when `1 <= W % P <= P - 2`, max-window-page there once
    `W > P` (below a page its retention is the page); never under a version that promises
    the insert window, nor without prefix sharing (no leaf is inserted).

    pre: window >= 1 and page_size >= 1
    post: not __return__ or not promises_insert_window(version)
    """
    if version not in (DROP_MARGIN, MAX_WINDOW_PAGE):
        return False
    return 1 <= window % page_size <= page_size - 2 and (version == DROP_MARGIN or window > page_size)


def pd_checkpoint_at_risk(window: int, page_size: int) -> bool:
    """[WIN-6, I10] Whether an implementation that checkpoints a PD-decode admission's prompt,
    `[0, floor_page(fill_len))`, over the decode-side tail of `swa_tail_len` can leave that
    leaf fewer than `min(W, E)` live tokens (SGLang checkpoints there: SGL-9, SGL-11). The
    tail keeps `max(W, P)` tokens before `fill_len - 1`, unrounded: max-window-page's
    retention, so it is at risk exactly where that version is, `W > P` and
    `1 <= W % P <= P - 2` (tests/test_lifecycle_random.py checks it fill by fill).

    pre: window >= 1 and page_size >= 1
    """
    return insert_window_at_risk(MAX_WINDOW_PAGE, window, page_size)


def checkpoint_eviction(up_to: Position, cursor: Position, cache_protected_len: Position,
                        window: int, page_size: int, version: str) -> tuple[Position, Position]:
    """[I10, WIN-4] The insert end and the cursor of a checkpoint of an unfinished
    request: the window eviction first (pre_len = up_to - 1, interval 1), then the
    insert of `[0, floor_page(up_to))`. Where the cursor moved past the protected
    length, the versions that promise it leave the new leaf at least min(W, E) live
    tokens. (During a chunked prefill the cursor is never above the protected length: each
    checkpoint's insert end lies above the cursor it leaves. CrossHair finds the
    counterexample without that precondition.)

    pre: page_size >= 1 and window >= 1
    pre: version in TWO_POOL_VERSIONS
    pre: cursor >= 0 and cursor % page_size == 0
    pre: cache_protected_len % page_size == 0 and 0 <= cache_protected_len < up_to
    pre: cursor <= cache_protected_len
    post: not promises_insert_window(version) or __return__[1] <= cache_protected_len or insert_keeps_window(__return__[0], __return__[1], window)
    """
    decision = eviction_frontier(up_to - 1, cursor, cache_protected_len, window, page_size, version, 1)
    new_cursor = cursor if decision is None else decision.new_cursor
    return floor_page(up_to, page_size), new_cursor


def checkpoint_leaves_short_leaf(up_to: Position, cursor: Position, cache_protected_len: Position,
                                 window: int, page_size: int, version: str) -> bool:
    """[I10] Whether the checkpoint of a prefill that reaches `up_to` moves the cursor past the
    protected length and leaves its new leaf fewer than min(W, E) live tokens. Only a version
    at risk at this window allows it (insert_window_at_risk); an implementation
    that matches the key again after such an insert and trusts the match must still hand the
    request exactly what lies past the insert (`I4`). SGLang 0.5.15 - 0.5.22 do not; the
    engine machine keeps a run's prefills clear of such ends for an adapter that says so (it
    lacks the capability `short_leaf_checkpoints`).

    pre: page_size >= 1 and window >= 1
    pre: version in TWO_POOL_VERSIONS
    pre: cursor >= 0 and cursor % page_size == 0
    pre: cache_protected_len % page_size == 0 and 0 <= cache_protected_len < up_to
    pre: cursor <= cache_protected_len
    post: not __return__ or not promises_insert_window(version)
    """
    if not insert_window_at_risk(version, window, page_size):  # nothing inserted, or every leaf keeps a window
        return False
    end, new_cursor = checkpoint_eviction(up_to, cursor, cache_protected_len, window, page_size, version)
    return new_cursor > cache_protected_len and not insert_keeps_window(end, new_cursor, window)
