"""The scheduler tier [SCHED-1 .. SCHED-9]: an engine whose scheduler decides, checked plan by plan.

At the engine tier kvspec plays the scheduler: it calls an engine's memory operations in
an order it chooses. Many engines cannot be driven that way: their scheduler is the
implementation, and it decides what to admit, how to chunk a prompt, what to release,
when to preempt. At this tier kvspec chooses only what a serving front end and a model
would: which requests arrive (prompts, output limits) and what each forward returns
(the tokens; when a request ends). The scheduler makes every plan, and each plan, each
result and each end is checked.

Three parties, three kinds of fact:

  * the harness's ledger (`ScheduledRequest`: the prompt, the outputs returned so far, the
    tokens whose KV the forwards have computed) is the truth a plan must continue from;
  * the plan (`Plan`): the rows the scheduler forwards, each with the block tables it
    gives the row, and the requests it preempted;
  * what the scheduler shows of its memory (`SchedulerView`): the pages of its one pool
    (free or held), the tables of each request that holds pages, and, where the engine
    can show one, its memory model's snapshot (chapter 08's `BlockPoolSnapshot`, say),
    which is then checked by that model's invariants too.

Tables follow chapter 08's shape (one positional table per request and group, entry `i`
covering tokens `[i * P, (i + 1) * P)`, NULL_BLOCK for a released sliding-window entry),
and the window rules of a plan's rows are chapter 08's arithmetic (`released_swa_blocks`),
stated per row, so that they bind engines which size their tables otherwise (TokenSpeed
sizes a full table at admission, and reserves sliding-window pages ahead).
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from .block_pool import FULL, NULL_BLOCK, SWA, released_swa_blocks
from .notation import Violation
from .outcomes import Name, OutOfMemory
from .pages import pages_for
from .registry import invariant
from .snapshot import EngineSnapshot
from .state import state_digest

STATE = "state"
"""[SCHED-9] A recurrent-state group's kind (chapter 09): its table in a row is two pages,
the state the row reads (the null page when it advances the state it writes, in place)
and the state it writes."""

# -- the tier ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerConfig:
    """[SCHED-1] What a scheduler is built with: its one page pool, its layer groups
    (FULL or SWA, by group id, as in chapter 08), the spec's window `W` (a token reads
    the `W` before it), and the budget of one plan."""

    page_size: int
    window: int
    pages: int
    """Real pages of the pool, shared by every group (the null page is not counted)."""
    groups: tuple[str, ...] = (FULL, SWA)
    """The kind of each layer group, by group id: FULL, SWA or STATE."""
    max_batch_size: int = 8
    """Most rows in one plan."""
    max_scheduled_tokens: int = 64
    """Most tokens one plan computes, over its rows: a longer prompt is prefilled in chunks."""

    @property
    def attention_groups(self) -> tuple[str, ...]:
        """Its groups but the recurrent-state one: its engine's layout (BLOCK-11)."""
        return tuple(group for group in self.groups if group != STATE)


def validate_scheduler_config(config: SchedulerConfig) -> list[str]:
    """[SCHED-1] What is wrong with a configuration, in words (empty when nothing is)."""
    problems = []
    for name in ("page_size", "window", "pages", "max_batch_size", "max_scheduled_tokens"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{name} must be a whole number of at least 1 (got {value!r})")
    if not config.groups or any(group not in (FULL, SWA, STATE) for group in config.groups):
        problems.append(f"groups must name at least one layer group, each {FULL!r}, {SWA!r} or {STATE!r} "
                        f"(got {config.groups!r})")
    elif FULL not in config.groups:
        problems.append("groups must include a full-attention group: a request's prompt is cached there")
    return problems


class Status(Name):
    """[SCHED-1] Where a request stands, as the plans have shown it."""

    WAITING = "waiting"
    """Submitted, not yet forwarded; or preempted to be computed again from a prefix hit."""
    RUNNING = "running"
    """Forwarded at least once since it was submitted or resumed."""
    RETRACTED = "retracted"
    """Preempted with its KV set aside (a snapshot): it resumes where it stopped."""


class SchedulerOperation(Name):
    """[SCHED-1] The steps of the scheduler tier a check judges, as a snapshot's Step names them."""

    BUILD = "build"
    """The scheduler was made: its first view."""
    SUBMIT = "submit"
    PLAN = "plan"
    RESULT = "result"
    """A planned row's forward came back."""
    FINISH = "finish"
    ABORT = "abort"


class Preempted(Name):
    """[SCHED-7] How a plan took a running request's pages away."""

    RETRACT = "retract"
    """Its KV is set aside; it resumes at its computed tokens."""
    RECOMPUTE = "recompute"
    """Its KV is dropped; it waits, and is computed again from a prefix hit."""
    ABORT = "abort"
    """It is ended by the scheduler (it does not fit)."""


@dataclass(frozen=True)
class Row:
    """[SCHED-2] One row of a plan: the request's tokens `[start, start + tokens)` are
    computed; the row reaching the last known token samples the next output."""

    rid: str
    start: int
    tokens: int
    tables: tuple[tuple[int, ...], ...]
    """Per group, the table the row runs with (NULL_BLOCK where released)."""
    state_read: int | None = None
    """[SCHED-9] With a state group: the `state_digest` the state the row reads holds, as
    the adapter's model of the state pages (chapter 09's stand-in, STATE-4) computes it."""


@dataclass(frozen=True)
class Preemption:
    """[SCHED-7] A request a plan preempted, and how."""

    rid: str
    how: Preempted


@dataclass(frozen=True)
class Plan:
    """[SCHED-1] What the scheduler decided: the rows it forwards, whom it preempted, and
    the retracted requests it gave pages back to (a restore), forwarded or not."""

    rows: tuple[Row, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    resumed: tuple[str, ...] = ()


@dataclass(frozen=True)
class PagePool:
    """[SCHED-5] The one page pool, as counts: every real page is free (empty, or cached
    and evictable: an allocation may take it) or held by a request."""

    pages: int
    free: int
    held: int


@dataclass(frozen=True)
class SchedulerView:
    """[OBS-1, SCHED-1] What a scheduler shows of its memory between two calls."""

    pool: PagePool
    tables: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]
    """(rid, its table per group) of every request that holds pages: as the latest plan
    that forwarded it showed them, for an engine that shows tables only in plans."""
    memory: EngineSnapshot | None = None
    """Its memory model's snapshot, for an engine that can show one (checked too)."""


@dataclass(frozen=True)
class ScheduledRequest:
    """[SCHED-1] The harness's ledger of one request it submitted and that has not ended."""

    rid: str
    prompt_len: int
    max_new_tokens: int
    outputs: int
    """Output tokens the forwards have returned so far."""
    computed: int
    """Tokens whose KV its forwards computed (0 again after a preemption that drops it)."""
    status: Status = Status.WAITING
    tokens: tuple[int, ...] = ()
    """The tokens known, where the harness gives them: the prompt and the outputs returned."""

    @property
    def known(self) -> int:
        """Tokens known: the prompt and the outputs returned."""
        return self.prompt_len + self.outputs


@dataclass(frozen=True)
class SchedulerSnapshot:
    """[OBS-1, SCHED-1] What the checks of this tier read after every call: the ledger of every
    request submitted and not ended, what the scheduler shows, and the plan the call
    made (None after a result, a finish, an abort or a submission)."""

    config: SchedulerConfig
    requests: tuple[ScheduledRequest, ...]
    view: SchedulerView
    plan: Plan | None = None


class SchedulerOperations(Protocol):
    """[SCHED-1] What the harness calls. A scheduler raises nothing for a call the tier
    allows; what it cannot serve it leaves out of its plans, or preempts."""

    def submit(self, rid: str, prompt: Sequence[int], max_new_tokens: int) -> OutOfMemory | None:
        """A request arrives; it ends by `max_new_tokens` outputs past its prompt. A request
        the scheduler can never serve is refused: OutOfMemory, and it has ended (SCHED-8)."""

    def plan(self) -> Plan:
        """The next plan: the rows to forward and the requests preempted for them."""

    def result(self, rid: str, token: int | None) -> None:
        """A forwarded row's result: the sampled token, None for a row short of the last known token."""

    def finish(self, rid: str) -> None:
        """The request ends after its last output (a stop, or its output limit)."""

    def abort(self, rid: str) -> None:
        """The client gives up on the request, wherever it stands."""

    def snapshot(self) -> SchedulerView:
        """[OBS-1] What it shows of its memory now."""


# -- the ledger: what a row, a result and a preemption do to a request --------------------

def samples(request: ScheduledRequest, row: Row) -> bool:
    """[SCHED-2] Whether the row reaches the last known token, so its result is an output.

    pre: row.tokens >= 1
    """
    return row.start + row.tokens == request.known


def after_plan(requests: Sequence[ScheduledRequest], plan: Plan) -> tuple[ScheduledRequest, ...]:
    """[SCHED-1] The ledger once a plan is made: a forwarded or resumed request runs, a
    preempted one waits or is retracted (after_preemption), one the scheduler aborted
    has ended and is gone."""
    running = {row.rid for row in plan.rows} | set(plan.resumed)
    how = {preemption.rid: preemption.how for preemption in plan.preempted}
    ledger = []
    for request in requests:
        if how.get(request.rid) is Preempted.ABORT:
            continue
        if request.rid in how:
            request = after_preemption(request, how[request.rid])
        elif request.rid in running:
            request = replace(request, status=Status.RUNNING)
        ledger.append(request)
    return tuple(ledger)


def after_result(request: ScheduledRequest, row: Row, token: int | None = None) -> ScheduledRequest:
    """[SCHED-2] The ledger once the row's result came back: its tokens are computed, and
    an output (`token`) was returned if it sampled."""
    sampled = samples(request, row)
    return replace(request, computed=row.start + row.tokens, outputs=request.outputs + sampled,
                   tokens=request.tokens + ((token,) if sampled and token is not None else ()))


def after_preemption(request: ScheduledRequest, how: Preempted) -> ScheduledRequest:
    """[SCHED-7] The ledger of a request preempted without ending: a retracted one keeps
    its computed tokens; a recomputed one waits to compute them again."""
    if how is Preempted.RETRACT:
        return replace(request, status=Status.RETRACTED)
    return replace(request, status=Status.WAITING, computed=0)


def drain_bound(requests: Sequence[ScheduledRequest], outputs: Sequence[int], max_scheduled_tokens: int) -> int:
    """[SCHED-8] The most plans a scheduler may take to end every request with no new
    arrival: four times the work left (each plan must advance some request by a token,
    and a preemption may make a request's computed tokens count again), plus 16.
    `outputs[i]` is how many outputs request i is still to return.

    pre: len(outputs) == len(requests) and max_scheduled_tokens >= 1
    pre: all(count >= 0 for count in outputs)
    pre: all(0 <= request.computed <= request.known for request in requests)
    post: __return__ >= 16
    """
    work = sum(request.known - request.computed + left for request, left in zip(requests, outputs))
    return 4 * work + 16


def pages_alone(config: SchedulerConfig, prompt_len: int, max_new_tokens: int) -> int:
    """[SCHED-8] The most pages a request needs with the pool to itself: every token it may
    have, in a full-attention group; in a sliding-window group no more than that, nor
    more than one plan's chunk and the window before it, rounded out to pages on both
    sides (`1 + cdiv(W + max_scheduled_tokens, P)`); in a state group two (SCHED-9).

    pre: not validate_scheduler_config(config)
    pre: prompt_len >= 1 and max_new_tokens >= 1
    post: __return__ >= len(config.groups)
    """
    tokens = pages_for(prompt_len + max_new_tokens, config.page_size)
    window = 1 + pages_for(config.window + config.max_scheduled_tokens, config.page_size)
    need = {FULL: tokens, SWA: min(tokens, window), STATE: 2}  # a state group: the state read and the one written
    return sum(need[kind] for kind in config.groups)


def refusal_violation(config: SchedulerConfig, rid: str, prompt_len: int, max_new_tokens: int) -> Violation | None:
    """[SCHED-8] A scheduler may refuse at submission a request it can never serve, and
    must not refuse one that needs at most half the pool alone (`pages_alone`): an engine
    may keep margins, but not refuse work its pool holds twice over."""
    needed = pages_alone(config, prompt_len, max_new_tokens)
    if 2 * needed <= config.pages:
        return Violation("SCHED-8", f"request {rid} ({prompt_len} tokens, up to {max_new_tokens} outputs) was refused "
                                    f"at submission, though it needs at most {needed} of the pool's {config.pages} pages")
    return None


# -- the checks ------------------------------------------------------------------------------

def rows_of(now: SchedulerSnapshot) -> tuple[Row, ...]:
    return now.plan.rows if now.plan is not None else ()


@invariant("SCHED-2", "scheduling")
def plan_violations(previous: SchedulerSnapshot, step, now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-2] A plan forwards only work that is due, within its budget: each row names a
    request that was submitted and has not ended or been preempted in this plan, at most
    once per plan; it computes at least one token, no token not yet known, and
    continues where the ledger says the request's KV ends (a retracted request too). A
    waiting request (new, or preempted to be computed again) may start at a prefix hit,
    short of its last known token. Rows and tokens stay within `max_batch_size` and
    `max_scheduled_tokens`."""
    if now.plan is None:
        return []
    found = []
    ledger = {request.rid: request for request in previous.requests}
    preempted = {preemption.rid for preemption in now.plan.preempted}
    config = now.config
    counted = Counter(row.rid for row in now.plan.rows)
    for rid, times in sorted(counted.items()):
        if times > 1:
            found.append(Violation("SCHED-2", f"request {rid} is forwarded {times} times in one plan"))
    for row in now.plan.rows:
        request = ledger.get(row.rid)
        if request is None:
            found.append(Violation("SCHED-2", f"the plan forwards request {row.rid}, which is not submitted or has "
                                              f"ended"))
            continue
        if row.rid in preempted:
            found.append(Violation("SCHED-2", f"the plan forwards request {row.rid} and preempts it"))
        if row.tokens < 1 or row.start < 0 or row.start + row.tokens > request.known:
            found.append(Violation("SCHED-2", f"request {row.rid}: the row computes tokens [{row.start}, "
                                              f"{row.start + row.tokens}), but {request.known} are known"))
        elif request.status is Status.WAITING:
            if row.start >= request.known:
                found.append(Violation("SCHED-2", f"request {row.rid}: its first row starts at {row.start}, past "
                                                  f"the last of its {request.known} known tokens"))
        elif row.start != request.computed:
            found.append(Violation("SCHED-2", f"request {row.rid}: the row starts at {row.start}, but its KV is "
                                              f"computed up to {request.computed}"))
    if len(now.plan.rows) > config.max_batch_size:
        found.append(Violation("SCHED-2", f"the plan has {len(now.plan.rows)} rows, more than max_batch_size "
                                          f"{config.max_batch_size}"))
    tokens = sum(row.tokens for row in now.plan.rows)
    if tokens > config.max_scheduled_tokens:
        found.append(Violation("SCHED-2", f"the plan computes {tokens} tokens, more than max_scheduled_tokens "
                                          f"{config.max_scheduled_tokens}"))
    return found


def covered_blocks(row: Row, kind: str, window: int, page_size: int) -> range:
    """[SCHED-3] The table entries a row reads or writes: every block up to its last token
    in a full-attention group; from the first block its window reads in a sliding one;
    in a state group, the state it writes (SCHED-9).

    pre: row.start >= 0 and row.tokens >= 1 and window >= 1 and page_size >= 1
    post: len(__return__) >= 1
    """
    if kind == STATE:
        return range(1, 2)
    first = 0 if kind == FULL else released_swa_blocks(row.start, window, page_size)
    return range(first, pages_for(row.start + row.tokens, page_size))


@invariant("SCHED-3", "window-liveness")
def row_coverage_violations(now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-3] Every token a row computes, and every token its window reads, has a real
    page in the row's table of each group: `covered_blocks` are all real."""
    found = []
    config = now.config
    for row in rows_of(now):
        if len(row.tables) != len(config.groups):
            found.append(Violation("SCHED-3", f"request {row.rid}: the row has {len(row.tables)} tables for "
                                              f"{len(config.groups)} groups"))
            continue
        for group, (kind, table) in enumerate(zip(config.groups, row.tables)):
            needed = covered_blocks(row, kind, config.window, config.page_size)
            missing = [index for index in needed if index >= len(table) or table[index] == NULL_BLOCK]
            if missing:
                found.append(Violation("SCHED-3", f"request {row.rid}: tokens [{row.start}, {row.start + row.tokens})"
                                                  f" read entries {needed.start}..{needed.stop - 1} of its group "
                                                  f"{group} ({kind}) table, but entries {missing} are not real "
                                                  f"pages: {list(table)}"))
    return found


def shared_pages(snapshots: Sequence[SchedulerSnapshot], rid: str, group: int) -> set[int]:
    """[SCHED-4] The real pages another request's table of the group holds in any of the snapshots."""
    return {page for snapshot in snapshots for other, tables in snapshot.view.tables
            if other != rid and group < len(tables) for page in tables[group] if page != NULL_BLOCK}


@invariant("SCHED-4", "window-bound")
def row_release_violations(previous: SchedulerSnapshot, step, now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-4] A plan releases, for each row, what its window no longer reads: each of
    the first `released_swa_blocks(start)` entries of the row's sliding-window table is
    the null block, or a page another request's table of the group held too when the
    plan began or holds after it (releasing it would free nothing then: an engine may
    defer that, deciding row by row from what it saw). Ahead, a table may hold pages
    reserved for tokens to come, but none past the request's token limit: at most
    `cdiv(prompt_len + max_new_tokens, P)` entries in any attention group."""
    found = []
    config = now.config
    ledger = {request.rid: request for request in (*previous.requests, *now.requests)}
    for row in rows_of(now):
        request = ledger.get(row.rid)
        limit = pages_for(request.prompt_len + request.max_new_tokens, config.page_size) if request else None
        for group, (kind, table) in enumerate(zip(config.groups, row.tables)):
            if limit is not None and kind != STATE and len(table) > limit:
                found.append(Violation("SCHED-4", f"request {row.rid}: its group {group} ({kind}) table has "
                                                  f"{len(table)} entries, past its token limit of "
                                                  f"{request.prompt_len + request.max_new_tokens} ({limit} pages): "
                                                  f"{list(table)}"))
            if kind != SWA:
                continue
            due = released_swa_blocks(row.start, config.window, config.page_size)
            kept = [page for page in table[:due] if page != NULL_BLOCK]
            if kept:
                shared = shared_pages((previous, now), row.rid, group)
                kept = [page for page in kept if page not in shared]
            if kept:
                found.append(Violation("SCHED-4", f"request {row.rid}: after {row.start} tokens computed the window "
                                                  f"(W={config.window}) reads from entry {due} of its group {group} "
                                                  f"(swa) table, but pages {kept} before it are neither released nor "
                                                  f"shared: {list(table)}"))
    return found


@invariant("SCHED-5", "ownership")
def page_accounting_violations(now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-5] Every real page of the one pool is free or held: free + held = pages. A
    page stands in tables of one group only, at most once in a table, and every page
    a table shows is held: the pages of all shown tables are no more than `held`."""
    found = []
    pool = now.view.pool
    if pool.free + pool.held != pool.pages or pool.free < 0 or pool.held < 0:
        found.append(Violation("SCHED-5", f"{pool.free} free + {pool.held} held pages, but the pool has "
                                          f"{pool.pages}"))
    groups_of: dict[int, set[int]] = {}
    for rid, tables in now.view.tables:
        for group, table in enumerate(tables):
            real = [page for page in table if page != NULL_BLOCK]
            if repeated := sorted(page for page, times in Counter(real).items() if times > 1):
                found.append(Violation("SCHED-5", f"request {rid}: its group {group} table holds pages {repeated} "
                                                  f"more than once: {list(table)}"))
            if outside := sorted({page for page in real if not 0 < page <= pool.pages}):
                found.append(Violation("SCHED-5", f"request {rid}: its group {group} table names pages {outside}, "
                                                  f"not real pages of the pool (1..{pool.pages})"))
            for page in real:
                groups_of.setdefault(page, set()).add(group)
    for page, groups in sorted(groups_of.items()):
        if len(groups) > 1:
            found.append(Violation("SCHED-5", f"page {page} is held by tables of groups {sorted(groups)}"))
    if len(groups_of) > pool.held:
        found.append(Violation("SCHED-5", f"the tables hold {len(groups_of)} pages, but the pool counts {pool.held} "
                                          f"held"))
    return found


@invariant("SCHED-6", "leak")
def ended_request_violations(now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-6] Only a request that runs holds pages: one that ended (finished, aborted
    by the client or by the scheduler) or was preempted has no table, and with no
    request running the pool holds nothing (a page held then is leaked)."""
    found = []
    running = {request.rid for request in now.requests if request.status is Status.RUNNING}
    for rid, tables in now.view.tables:
        if rid not in running and any(page != NULL_BLOCK for table in tables for page in table):
            found.append(Violation("SCHED-6", f"request {rid} does not run (ended, waiting or preempted) but holds "
                                              f"pages: {[list(table) for table in tables]}"))
    if not running and now.view.pool.held:
        found.append(Violation("SCHED-6", f"no request runs, but {now.view.pool.held} pages are held (leak)"))
    return found


def freed_by(victim: str, victims: set[str], before: dict[str, tuple[tuple[int, ...], ...]],
             after: dict[str, tuple[tuple[int, ...], ...]]) -> int:
    """[SCHED-7] The pages preempting `victim` gave back, among those of `victims`: what
    keeping it would have kept held. Of the pages it held before the plan, those that no
    request but the victims holds on through the plan (one that held it before, and
    after): a page shared with a request that released it in the same plan (its window
    moved on) is given back by the preemption too.

    pre: victim in victims
    """
    kept = {page for rid, held in before.items() if rid not in victims
            for table in held for page in table if any(page in other for other in after.get(rid, ()))}
    return len({page for table in before.get(victim, ()) for page in table if page != NULL_BLOCK} - kept)


@invariant("SCHED-7", "scheduling")
def preemption_violations(previous: SchedulerSnapshot, step, now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-7] Preemption is the last resort: a plan that forwards rows preempts a running
    request only when they need the pages that request gives back, so after the plan
    fewer pages are free than it freed. A plan that preempts a request and still leaves
    as many free could have forwarded the same rows and kept that request. A plan that
    forwards nothing is a stall, which a preemption may break for the plans after it."""
    if now.plan is None or not now.plan.preempted or not now.plan.rows:
        return []
    victims = {preemption.rid for preemption in now.plan.preempted}
    before, after = dict(previous.view.tables), dict(now.view.tables)
    found = []
    for victim in sorted(victims):
        freed = freed_by(victim, victims, before, after)
        if freed and now.view.pool.free >= freed:
            found.append(Violation("SCHED-7", f"the plan preempts {victim}, which gives back {freed} pages, yet "
                                              f"{now.view.pool.free} pages are free after it: its rows did not need "
                                              f"them"))
    return found


@invariant("SCHED-9", "state")
def row_state_violations(previous: SchedulerSnapshot, step, now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-9] A row of a model with recurrent layers reads the state of exactly the
    tokens before it (`state_digest` of them: from the empty state, a checkpoint a prefix
    hit copies, or its own state of the last row), and writes a state no other request's
    table holds: a state is written by its request alone (a hit copies, never shares)."""
    if now.plan is None or STATE not in now.config.groups:
        return []
    found = []
    state = now.config.groups.index(STATE)
    ledger = {request.rid: request for request in previous.requests}
    for row in now.plan.rows:
        request = ledger.get(row.rid)
        if request is not None and request.tokens and row.state_read is not None:
            expected = state_digest(request.tokens[:row.start])
            if row.state_read != expected:
                found.append(Violation("SCHED-9", f"request {row.rid}: the row starts at {row.start}, but the state it "
                                                  f"reads holds {row.state_read}, not the state of its first "
                                                  f"{row.start} tokens ({expected})"))
        if len(row.tables) <= state or len(row.tables[state]) < 2:
            continue
        written = row.tables[state][1]
        holders = sorted(rid for rid, tables in now.view.tables if rid != row.rid
                         for table in tables if written in table)
        if written != NULL_BLOCK and holders:
            found.append(Violation("SCHED-9", f"request {row.rid}: the row writes its state to page {written}, which "
                                              f"{holders} hold too"))
    return found


def progress_violation(stalled_plans: int, bound: int) -> Violation:
    """[SCHED-8] The drain took more plans than its bound: a request starves."""
    return Violation("SCHED-8", f"with no new request, the scheduler made {stalled_plans} plans without ending every "
                                f"request (at most {bound} are needed: drain_bound); a request starves")


@invariant("SCHED-8", "scheduling")
def empty_plan_violations(now: SchedulerSnapshot) -> list[Violation]:
    """[SCHED-8] Progress: a plan forwards something whenever a request waits and the pool
    holds nothing for anyone (every page is free), since then nothing can stand in the
    way of the first waiting request; and (`drain_bound`) with no new arrival every
    request ends within a bounded number of plans."""
    if now.plan is None or now.plan.rows:
        return []
    waiting = [request.rid for request in now.requests if request.status is not Status.RUNNING]
    if waiting and now.view.pool.held == 0 and now.view.pool.free == now.view.pool.pages:
        return [Violation("SCHED-8", f"the plan forwards nothing while {waiting} wait and every page of the pool "
                                     f"is free")]
    return []
