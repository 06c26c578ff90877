"""vLLM 0.33.0's own v1 `Scheduler` behind kvspec's scheduler tier (spec chapter 10).

kvspec is the front end and the model runner around it (docs/engines/vllm.md, "vLLM's
own scheduler at the scheduler tier"); vLLM's scheduler makes every plan:

| kvspec call      | vLLM                                                                        |
|------------------|-----------------------------------------------------------------------------|
| submit           | `add_request(Request(...))`, `max_tokens = max_new_tokens`, no stop tokens   |
| plan             | `schedule()`: a Row per scheduled request, its preemptions (by recompute)    |
| result           | buffered; the plan's last one makes the step's `ModelRunnerOutput`, and `update_from_output` takes it |
| finish           | nothing where vLLM has ended it (its output limit); else `finish_requests(rid, FINISHED_STOPPED)` |
| abort            | `finish_requests(rid, FINISHED_ABORTED)`                                    |
| snapshot         | the block pool's counts, the tables of every request that holds blocks, and the manager read as the engine adapter reads its own (BLOCK-1..8) |

Why results are buffered: vLLM's model runner answers a whole step at once, and
`update_from_output` takes every row of it together (it appends the sampled tokens,
stops requests, frees the finished, publishes the step's KV events). Calling it once per
row would split one step into several vLLM never sees. Between a plan and its last
result nothing in vLLM moves, as in a real engine while the forward runs: it counted
the step's tokens as computed when it scheduled them (`_update_after_schedule`).

Why finish maps so: the harness ends a request after its last output, at most
`max_new_tokens`. With `max_tokens = max_new_tokens`, a request that reaches its limit
is ended by vLLM itself, in `update_from_output` (FINISHED_LENGTH_CAPPED, its blocks
freed there), and the harness's finish finds it gone. One that ends sooner ended on a
stop the model produced, which vLLM would see in `check_stop` during the same
`update_from_output` (FINISHED_STOPPED, `_free_request`); the adapter cannot tell vLLM
which token stops (the harness says so only after the step), so it ends it right after
the step with `finish_requests(rid, FINISHED_STOPPED)`, which frees it through the same
`_free_request`. That is also vLLM's own path for a stop its front end detects (a stop
string: `EngineCore.abort_requests` right after the step). Nothing is left half-ended:
a request vLLM ends that the harness has not finished by the next plan (it cannot
happen here: `max_model_len` holds any request the pool can) is reported in that plan
as ended by the scheduler (Preempted.ABORT).
"""

from collections.abc import Sequence

from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.pages import pages_for
from kvspec.spec.scheduler import PagePool, Plan, Preempted, Preemption, Row, SchedulerConfig, SchedulerView
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import VLLM_0_33, Policy

from .runtime import vllm
from .scheduler_probe import build_scheduler, make_request, runner_output
from .view import KVCacheManagerView


class PublishedEvents:
    """vLLM's KV event publisher for this scheduler: it keeps what `update_from_output`
    publishes (one batch per step), for the memory view to replay."""

    def __init__(self):
        self.events: list = []

    def publish(self, batch) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        pass


class SchedulerMemory(KVCacheManagerView):
    """The scheduler's own KV cache manager, shown as chapter 08's `BlockPoolSnapshot` by
    the engine adapter's view (view.py: `watch`, `snapshot`). The adapter keeps the
    per-request facts the rows need (`requests`, `allocation`, `decode_steps`,
    `finished_prefill`)."""

    def __init__(self, config: SchedulerConfig, manager, published: PublishedEvents):
        self.v = vllm()
        self.config = EngineConfig(config.page_size, config.window, config.pages * config.page_size, 0,
                                   config.max_batch_size, Policy(VLLM_0_33),
                                   layout=config.attention_groups)
        """One pool of `pages` blocks: the engine tier's pools are sized apart, here it is all one."""
        self.bs = self.state_bs = config.page_size
        self.num_blocks = config.pages + 1
        self.published, self.read = published, 0
        self.pending_read: dict[int, object] = {}
        """id -> event of each event read while still queued in the pool, not yet published."""
        self.watch(manager)
        self.requests: dict[str, object] = {}
        self.allocation: dict[str, tuple[int, int]] = {}
        self.decode_steps: dict[str, int] = {}
        self.finished_prefill: set[str] = set()

    def new_events(self) -> list:
        """The KV events vLLM emitted since the last call, read without taking them: those
        its publisher got since (less those read before, while queued), then those still
        queued in the pool for the step in progress (vLLM publishes them when the step's
        outputs come back). The engine adapter takes them instead: it has no publisher."""
        fresh = []
        for event in self.published.events[self.read:]:
            if self.pending_read.pop(id(event), None) is None:
                fresh.append(event)
        self.read = len(self.published.events)
        for event in self.pool.kv_event_queue:
            if id(event) not in self.pending_read:
                self.pending_read[id(event)] = event  # kept alive, so its id is not reused
                fresh.append(event)
        return fresh

    def tables(self) -> dict[str, list[tuple[int, ...]]]:
        """The engine adapter's tables, less the empty ones: a window release that runs
        for a waiting request whose admission then fails leaves an empty list behind in
        the sliding-window manager's `req_to_blocks` (a defaultdict). It holds nothing."""
        return {rid: tables for rid, tables in super().tables().items() if any(tables)}


class VllmScheduler:
    """vLLM's `Scheduler` over a full-attention and a sliding-window group (as the spec's
    configuration names them) sharing one pool of `pages` blocks and the null block."""

    def __init__(self, config: SchedulerConfig, retention: int | None | str = "engine"):
        self.config = config
        self.max_model_len = config.pages * config.page_size
        """The longest request: one that fills the whole pool's full-attention table."""
        # vLLM refuses a batch of more rows than tokens; no plan can have more anyway.
        max_num_seqs = min(config.max_batch_size, config.max_scheduled_tokens)
        self.scheduler = build_scheduler(config.page_size, config.window, config.pages + 1,
                                         config.max_scheduled_tokens, max_num_seqs,
                                         max_model_len=self.max_model_len, groups=config.groups,
                                         retention=retention, kv_events=True)
        self.published = self.scheduler.kv_event_publisher = PublishedEvents()
        self.memory = SchedulerMemory(config, self.scheduler.kv_cache_manager, self.published)
        self.step = None
        """The plan in progress: vLLM's SchedulerOutput, until its last row is answered."""
        self.answers: dict[str, list[int]] = {}
        self.ended: dict[str, str] = {}
        """Requests vLLM ended by itself (why) that the harness has not finished yet."""

    # -- the tier ---------------------------------------------------------------------------

    def submit(self, rid: str, prompt: Sequence[int], max_new_tokens: int) -> OutOfMemory | None:
        if len(prompt) + max_new_tokens > self.max_model_len:  # vLLM's front end refuses it (max_model_len)
            return OutOfMemory("blocks", pages_for(len(prompt) + max_new_tokens, self.config.page_size),
                               self.config.pages)
        self.scheduler.add_request(make_request(self.scheduler, rid, prompt, max_tokens=max_new_tokens))
        return None

    def plan(self) -> Plan:
        if self.step is not None:
            raise RuntimeError(f"plan() before every row of the last plan was answered (waiting for "
                               f"{sorted(set(self.step.num_scheduled_tokens) - set(self.answers))}): vLLM takes "
                               f"a step's outputs before it schedules the next")
        ended = [Preemption(rid, Preempted.ABORT) for rid in self.ended]
        self.ended.clear()
        output = self.scheduler.schedule()
        preempted = sorted(output.preempted_req_ids)
        for rid in preempted:  # by recompute: its blocks are freed, it waits with nothing computed
            self.forget(rid)
        rows = tuple(self.row(rid, tokens) for rid, tokens in output.num_scheduled_tokens.items())
        self.step, self.answers = output, {}
        if not rows:  # EngineCore.step takes the model's (empty) output of an empty step too
            self.update(output)
        return Plan(rows, (*ended, *(Preemption(rid, Preempted.RECOMPUTE) for rid in preempted)))

    def row(self, rid: str, tokens: int) -> Row:
        """A scheduled request's row: schedule() has already counted its tokens as computed."""
        request = self.scheduler.requests[rid]
        start = request.num_computed_tokens - tokens
        memory = self.memory
        if rid in memory.finished_prefill:
            memory.decode_steps[rid] += 1
        else:
            memory.decode_steps[rid] = 0
        if start + tokens == request.num_tokens:
            memory.finished_prefill.add(rid)
        memory.allocation[rid] = (start, start + tokens)  # the allocate_slots that ran for it
        tables = tuple(map(tuple, self.scheduler.kv_cache_manager.get_block_ids(rid)))
        return Row(rid, start, tokens, tables)

    def result(self, rid: str, token: int | None) -> None:
        step = self.step
        if step is None or rid not in step.num_scheduled_tokens or rid in self.answers:
            raise RuntimeError(f"result({rid!r}): not a row of the plan in progress, or answered already")
        request = self.scheduler.requests.get(rid)
        if request is not None:  # (an abort since the plan: vLLM drops its output)
            samples = request.num_computed_tokens >= request.num_tokens
            if samples != (token is not None):
                raise ValueError(f"result({rid!r}, {token!r}): vLLM's row {'samples' if samples else 'does not sample'}"
                                 f" (it computes up to {request.num_computed_tokens} of {request.num_tokens} tokens)")
        self.answers[rid] = [] if token is None else [token]
        if len(self.answers) == len(step.num_scheduled_tokens):
            self.update(step)

    def update(self, step) -> None:
        """The step's outputs, every row at once, as the model runner returns them."""
        rids = list(step.num_scheduled_tokens)
        runner = runner_output(rids, [self.answers[rid] for rid in rids])
        self.step, self.answers = None, {}
        for outputs in self.scheduler.update_from_output(step, runner).values():
            for output in outputs.outputs:
                if output.finish_reason is not None:
                    self.ended[output.request_id] = output.finish_reason.name
                    self.forget(output.request_id)

    def finish(self, rid: str) -> None:
        self.require_step_done("finish", rid)
        if self.ended.pop(rid, None) is None:  # else vLLM ended it already, at its output limit
            self.end(rid, "FINISHED_STOPPED")

    def abort(self, rid: str) -> None:
        if self.ended.pop(rid, None) is None:  # else vLLM ended it already: nothing is left to free
            self.end(rid, "FINISHED_ABORTED")

    def snapshot(self) -> SchedulerView:
        free = self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        pool = PagePool(self.config.pages, free, self.config.pages - free)
        self.memory.requests = {request.request_id: request for request in self.scheduler.running}
        memory = self.memory.snapshot()
        # every table the manager holds (not only the running requests'): one held elsewhere is a leak to show
        return SchedulerView(pool, tuple((blocks.rid, blocks.tables) for blocks in memory.block_pool.requests), memory)

    # -- helpers -------------------------------------------------------------------------------

    def end(self, rid: str, status: str) -> None:
        if rid not in self.scheduler.requests:
            raise KeyError(f"request {rid!r} is not in vLLM's scheduler (never submitted, or ended before)")
        self.scheduler.finish_requests(rid, getattr(vllm().RequestStatus, status))
        self.forget(rid)

    def forget(self, rid: str) -> None:
        """What the rows knew of a request that holds no blocks any more."""
        memory = self.memory
        memory.allocation.pop(rid, None)
        memory.decode_steps.pop(rid, None)
        memory.finished_prefill.discard(rid)

    def require_step_done(self, call: str, rid: str) -> None:
        if self.step is not None:
            raise RuntimeError(f"{call}({rid!r}) before every row of the plan was answered: vLLM ends a request "
                               f"once the step's outputs are in")
