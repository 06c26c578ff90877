"""TokenSpeed's compiled scheduler behind the scheduler tier (spec chapter 10).

kvspec is the executor around it (docs/engines/tokenspeed.md, "For the adapter"): it
submits requests, asks for each plan, acknowledges every snapshot and restore the plan
asks for at once (as an executor that copies pages before the forward does), returns
each forwarded row's result (an empty result for a prefill chunk short of the prompt's
end, whose result carries no token), and ends requests itself, since TokenSpeed never
does. What it shows: the pool's counts (`available_lcm_blocks`: empty and evictable
pages, `active_lcm_blocks`: pages a request holds) and each request's tables as the
latest plan that forwarded it gave them. TokenSpeed shows no table outside a plan, no
reference counts and no cache map, so no memory-model snapshot: the checks of chapter 10
are what binds it.

Window: TokenSpeed's `sliding_window_tokens` counts the current token, so the spec's
window `W` is built as `W + 1` (as for vLLM): WINDOW_COUNTS_CURRENT_TOKEN, the adapter's
declared convention. Declared wrong, the first entry a row's window reads is released
one plan early at every page boundary, and SCHED-3 says so
(tests/test_tokenspeed_adapter.py).
"""

from collections.abc import Sequence

from kvspec.spec.block_pool import FULL, SWA
from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.pages import pages_for
from kvspec.spec.scheduler import STATE, PagePool, Plan, Preempted, Preemption, Row, SchedulerConfig, SchedulerView
from kvspec.spec.state import advance_state, state_digest

from . import runtime as ts

PADDING = -1
"""What pads a table shorter than the longest of its batch."""
WINDOW_COUNTS_CURRENT_TOKEN = True
"""TokenSpeed's `sliding_window_tokens` includes the token being computed (measured:
docs/engines/tokenspeed.md, section 4)."""


def group_ids(groups: Sequence[str]) -> list[str]:
    """TokenSpeed's id of each group: its kind, numbered when a kind repeats."""
    return [kind if list(groups).count(kind) == 1 else f"{kind}{index}" for index, kind in enumerate(groups)]


def build_config(config: SchedulerConfig, retract: bool, force_retraction_every: int = 0,
                 window_counts_current_token: bool = WINDOW_COUNTS_CURRENT_TOKEN):
    """TokenSpeed's configuration for the spec's. With `retract`, a snapshot pool as large
    as the device lets it retract a request (SnapshotOp) instead of aborting it.
    `force_retraction_every` N > 0 sets its debugging knob `debug_force_retraction_interval`:
    a retraction every N plans, needed or not (SCHED-7 catches that)."""
    kinds = {FULL: ts.AttnKind.Full, SWA: ts.AttnKind.SlidingWindow, STATE: ts.AttnKind.State}
    device_pages = config.pages + 1  # and the null page
    groups = []
    for gid, kind in zip(group_ids(config.groups), config.groups):
        window = (config.window + window_counts_current_token,) if kind == SWA else ()
        tokens_per_page = 0 if kind == STATE else config.page_size  # "a State group has no token span"
        groups.append(ts.CacheGroupConfig(gid, tokens_per_page, device_pages, kinds[kind], *window))
    built = ts.SchedulerConfig()
    built.cache_groups = groups
    built.num_device_pages = device_pages
    built.max_scheduled_tokens = config.max_scheduled_tokens
    built.max_batch_size = config.max_batch_size
    built.prefix_granularity = config.page_size
    if retract:
        built.num_snapshot_pages = device_pages
        built.max_retracted_requests = 8
        built.debug_force_retraction_interval = force_retraction_every
    else:
        built.num_snapshot_pages = 1  # the null page alone: the engine aborts instead of retracting
    return built


def event(*events):
    bundle = ts.ExecutionEvent()
    for one in events:
        bundle.add_event(one)
    return bundle


def request_event(kind, rid: str, tokens: Sequence[int] | None = None):
    one = kind()
    one.request_id = rid
    if tokens is not None:
        one.tokens = list(tokens)
    return one


class PageStates:
    """The executor's model of what each state page holds: a `state_digest` (chapter 09's
    stand-in for a recurrent layer, STATE-4). A page the plan asks to zero holds the
    empty state; a copy, a snapshot and a restore carry a page's state along; a row
    writes the state it read advanced by its tokens. A page never written holds UNKNOWN."""

    UNKNOWN = -1

    def __init__(self):
        self.device: dict[int, int] = {}
        self.snapshots: dict[int, int] = {}

    def apply(self, plan, group: str, index: int) -> None:
        """`group`: the state group's id; `index`: its position, as cache ops name groups."""
        for page in plan.pages_to_zero.get(group, ()):
            self.device[page] = state_digest(())
        for source, target in plan.pages_to_copy.get(group, ()):
            self.device[target] = self.device.get(source, self.UNKNOWN)
        for operation in plan.cache:
            kind = type(operation).__name__
            if kind not in ("SnapshotOp", "RestoreOp"):
                continue
            for sources, targets, owners in zip(operation.src_pages, operation.dst_pages, operation.group_ids):
                for source, target in ((s, t) for s, t, owner in zip(sources, targets, owners) if owner == index):
                    if kind == "SnapshotOp":  # device page -> snapshot pool
                        self.snapshots[target] = self.device.get(source, self.UNKNOWN)
                    else:  # snapshot pool -> device page
                        self.device[target] = self.snapshots.get(source, self.UNKNOWN)

    def read(self, table: tuple[int, ...]) -> int:
        """The state a row reads: its first page's, or, where that is the null page, the
        state it advances in place (its second page's)."""
        page = table[0] if table and table[0] != 0 else (table[1] if len(table) > 1 else 0)
        return self.device.get(page, self.UNKNOWN)

    def write(self, page: int, read: int, tokens: list[int]) -> None:
        digest = read
        for token in tokens:
            digest = advance_state(digest, token) if digest != self.UNKNOWN else self.UNKNOWN
        self.device[page] = digest


class TokenSpeedScheduler:
    def __init__(self, config: SchedulerConfig, retract: bool = True, force_retraction_every: int = 0,
                 window_counts_current_token: bool = WINDOW_COUNTS_CURRENT_TOKEN):
        self.config = config
        self.groups = group_ids(config.groups)
        self.scheduler = ts.Scheduler(build_config(config, retract, force_retraction_every,
                                                   window_counts_current_token))
        self.state_group = self.groups[config.groups.index(STATE)] if STATE in config.groups else None
        self.tokens: dict[str, list[int]] = {}
        """Each request's known tokens (the model's input)."""
        self.states = PageStates()
        self.forwards: dict[str, tuple[int, int, int, int]] = {}
        """Per forwarded row: (state read, page written, start, tokens), until its result."""
        self.tables: dict[str, tuple[tuple[int, ...], ...]] = {}

    def submit(self, rid: str, prompt: Sequence[int], max_new_tokens: int) -> OutOfMemory | None:
        spec = ts.RequestSpec()
        spec.request_id = rid
        spec.tokens = list(prompt)
        spec.max_new_tokens = max_new_tokens
        try:
            self.scheduler.submit_requests([spec])
            self.tokens[rid] = list(prompt)
        except ValueError as error:  # "request token limit N exceeds cache capacity M": its capacity model says no
            if "exceeds cache capacity" not in str(error):
                raise
            return OutOfMemory("pool", pages_for(len(prompt) + max_new_tokens, self.config.page_size),
                               self.config.pages)
        return None

    def plan(self) -> Plan:
        plan = self.scheduler.next_execution_plan()
        if self.state_group is not None:  # what the executor does before the forward: zero, copy, snapshot, restore
            self.states.apply(plan, self.state_group, self.groups.index(self.state_group))
        rows = []
        for batch in plan.forward:
            prefixes, inputs = list(batch.extend_prefix_lens), list(batch.input_lengths)
            for index, rid in enumerate(batch.request_ids):
                # a prefill row says where it starts; a decode row computes the last known token
                start = prefixes[index] if index < batch.num_extends() else self.scheduler.request_token_size(rid) - 1
                tables = tuple(tuple(page for page in batch.block_tables[gid][index] if page != PADDING)
                               for gid in self.groups)
                self.tables[rid] = tables
                read = None
                if self.state_group is not None:
                    state_table = tables[self.groups.index(self.state_group)]
                    read = self.states.read(state_table)
                    self.forwards[rid] = (read, state_table[1] if len(state_table) > 1 else 0, start, inputs[index])
                rows.append(Row(rid, start, inputs[index], tables, read))
        preempted = [Preemption(abort.request_id, Preempted.ABORT) for abort in plan.aborts]
        resumed, acknowledged = [], []
        for operation in plan.cache:
            kind = type(operation).__name__
            if kind == "SnapshotOp":
                preempted += [Preemption(rid, Preempted.RETRACT) for rid in dict.fromkeys(operation.request_ids)]
                acknowledged += [self.done(ts.Cache.SnapshotDoneEvent, op_id) for op_id in operation.op_ids]
            elif kind == "RestoreOp":
                resumed += list(dict.fromkeys(operation.request_ids))
                acknowledged += [self.done(ts.Cache.RestoreDoneEvent, op_id) for op_id in operation.op_ids]
        for preemption in preempted:  # its device pages are gone (copied aside, or freed)
            self.tables.pop(preemption.rid, None)
        if acknowledged:
            self.scheduler.advance(event(*acknowledged))
        return Plan(tuple(rows), tuple(preempted), tuple(resumed))

    @staticmethod
    def done(kind, op_id: int):
        acknowledgement = kind()
        acknowledgement.op_id = op_id
        return acknowledgement

    def result(self, rid: str, token: int | None) -> None:
        if rid in self.forwards:  # the model wrote the state the row computed (STATE-4's stand-in)
            read, written, start, count = self.forwards.pop(rid)
            self.states.write(written, read, self.tokens[rid][start:start + count])
        if token is not None:
            self.tokens[rid].append(token)
        self.scheduler.advance(event(request_event(ts.ForwardEvent.ExtendResult, rid, [] if token is None else [token])))

    def finish(self, rid: str) -> None:
        self.scheduler.advance(event(request_event(ts.ForwardEvent.Finish, rid)))
        self.tables.pop(rid, None)

    def abort(self, rid: str) -> None:
        self.scheduler.advance(event(request_event(ts.ForwardEvent.Abort, rid)))
        self.tables.pop(rid, None)

    def snapshot(self) -> SchedulerView:
        pool = PagePool(self.config.pages, self.scheduler.available_lcm_blocks(), self.scheduler.active_lcm_blocks())
        return SchedulerView(pool, tuple(sorted(self.tables.items())))
