"""Hostile input, round 2 (issue 36): the replay's verdicts and the harness's own checks.
A step the lifecycle forbids is the trace's fault even after an expectation the trace
got wrong; a result of the wrong type is named as the implementation's failure of the
clause that defines it; the harness's memory stays bounded on a long replay; option
and environment values the harness cannot use are refused before the run. What a
trace says wrong by itself is in test_hostile_round2_traces.py.

Each test names the defect of the probe report it keeps (D6, D8, ...)."""

import itertools

import pytest
import torch

from kvspec.adapters.reference import ADAPTER as REFERENCE
from kvspec.adapters.reference import ReferenceAllocatorAdapter, ReferenceEngineAdapter
from kvspec.conformance.cli import main
from kvspec.conformance.harness.checks import Checks, ImplementationCrash, InvariantViolation, StepNotApplicable
from kvspec.conformance.harness.engine_driver import EngineDriver
from kvspec.conformance.harness.incremental import Memo
from kvspec.conformance.harness.protocol import load_adapter, validate
from kvspec.conformance.harness.replay import replay, with_expectations
from kvspec.conformance.harness.trace import Trace, TraceError, TraceStep, parse
from kvspec.conformance.runs.vectors import walkthroughs
from kvspec.spec.invariants.allocator import AllocatorView
from kvspec.spec.models import model_for
from kvspec.spec.outcomes import InvalidRequest
from kvspec.spec.snapshot import EngineConfig

DECODE_AND_FINISH = "walkthrough-4.4-decode-and-finish"
PROMPT = list(range(100, 140))


def vector_text() -> str:
    return with_expectations(walkthroughs()[DECODE_AND_FINISH], load_adapter("reference")).dumps()


def driver(engine_class=ReferenceEngineAdapter, config=EngineConfig(4, 8, 128, 64, 8)) -> EngineDriver:
    reference = load_adapter("reference")
    return EngineDriver(engine_class(config), model_for(reference.model, config), reference.observables)


def step(op: str, **args) -> TraceStep:
    return TraceStep(op, args)


# -- D8: a forbidden step after an expectation the trace got wrong -------------------------------------

@pytest.mark.parametrize("chunk", [40, 2**63 - 1])
def test_a_forbidden_step_after_a_wrong_expectation_is_the_traces_fault(chunk):
    """[LIFE-1] The whole prompt in the first chunk, under the vector's expectations of a
    16-token chunk: the next prefill chunk is forbidden. Because the trace's own `expect`
    had differed a step earlier, the trace was never judged, and the reference was
    reported refusing it "although the lifecycle allows it" (exit 1)."""
    trace = parse(vector_text().replace('"chunk":16,', f'"chunk":{chunk},', 1))
    with pytest.raises(TraceError) as raised:
        replay(trace, load_adapter("reference"), judge_trace=True)
    message = str(raised.value)
    assert message.startswith("step 2 (line 4: prefill_chunk(") and "the trace is at fault" in message, message
    assert "request 'r' has finished its prefill" in message and "allows it" not in message.split(";")[0]
    assert "its expect after step 1 is not what the reference shows either (free_full_pages: expected 28" in message


def test_the_command_exits_2_for_it(tmp_path, capsys):
    path = tmp_path / "chunk-40.jsonl"
    path.write_text(vector_text().replace('"chunk":16,', '"chunk":40,', 1))
    status = main(["replay", str(path)])
    out, err = capsys.readouterr()
    assert status == 2 and "chunk-40.jsonl: step 2 (line 4" in err and "LIFE-1" not in out + err, out + err


def test_an_engine_that_refuses_a_forbidden_step_is_not_told_the_lifecycle_allows_it():
    """The engine driver called every InvalidRequest on an unmarked step "refused although
    the lifecycle allows it", without asking the lifecycle (kvspec.spec.lifecycle.refusal)."""
    engine = driver()
    engine.apply(step("admit", rid="r", prompt=PROMPT))
    engine.apply(step("prefill_chunk", rid="r", chunk=40, token=7))
    with pytest.raises(StepNotApplicable) as raised:
        engine.apply(step("prefill_chunk", rid="r", chunk=16, token=7))
    assert str(raised.value) == ("prefill_chunk was refused, and the lifecycle forbids it in the state the engine "
                                 "showed before it: request 'r' has finished its prefill; run decode steps")


class RefusesReadmission(ReferenceEngineAdapter):
    """Refuses to admit a retracted request again: the implementation's fault."""

    def admit(self, rid, prompt):
        if prompt is None:
            raise InvalidRequest(f"no second chance for {rid!r}")
        return self.engine.admit(rid, prompt)


def test_an_engine_that_refuses_a_step_the_lifecycle_allows_still_breaks_life_1():
    """[LIFE-1] The driver remembers what it retracted: admitting it again without a
    prompt is allowed, so refusing it is the engine's violation."""
    engine = driver(RefusesReadmission)
    for operation in (step("admit", rid="r", prompt=PROMPT), step("prefill_chunk", rid="r", chunk=8, token=7),
                      step("retract", rid="r")):
        engine.apply(operation)
    with pytest.raises(InvariantViolation) as raised:
        engine.apply(step("admit", rid="r", prompt=None))
    assert raised.value.clauses == ("LIFE-1",) and "although the lifecycle allows it: no second chance" in str(
        raised.value)


# -- D27: results of the wrong type ---------------------------------------------------------------

class TensorSlots(ReferenceAllocatorAdapter):
    """Returns the reference allocator's torch tensor, not a list of ints (the mistake
    docs/writing-an-adapter.md warns about)."""

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        return torch.tensor(super().alloc_extend(prefix_lens, seq_lens, last_loc))


class CountSlots(ReferenceAllocatorAdapter):
    """Returns an endless iterator."""

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        super().alloc_extend(prefix_lens, seq_lens, last_loc)
        return itertools.count()


def allocator_adapter(name: str, allocator) -> object:
    return validate(type(name, (), {"name": name, "policy_version": REFERENCE.policy_version,
                                    "capabilities": REFERENCE.capabilities, "make_allocator": staticmethod(allocator)}),
                    name)


@pytest.mark.parametrize("allocator, shown", [(TensorSlots, "is a Tensor (tensor([4, 5, 6, 7, 8])), not Sequence[int]"),
                                              (CountSlots, "is a count (count(0)), not Sequence[int]")])
def test_an_allocation_of_the_wrong_type_is_named_as_the_implementations_failure_of_alloc_1(allocator, shown):
    """A tensor was reported as a broken conservation of the full pool ("a page counted
    twice": its elements, 0-d tensors, are distinct objects), an iterator as a bare
    TypeError from len() ending in "not deterministic?". Named as a snapshot's field is
    (OBS-1), by the clause that says what an allocation returns."""
    trace = Trace("allocator", {"page_size": 4, "size_full": 32, "size_swa": 32}, "reference",
                  (step("new_sequence", length=5), step("drain")))
    result = replay(trace, allocator_adapter(allocator.__name__, allocator))
    assert isinstance(result.failure, ImplementationCrash) and result.stopped_at == 0
    assert result.failure.clauses == ("ALLOC-1",)
    assert f"the result of alloc_extend {shown}: an allocation returns the new tokens' full slots" in str(
        result.failure)


# -- D6: the harness's memory on a long replay -------------------------------------------------------

def slots_held(memo: Memo) -> int:
    """Every slot the memo's keys hold, counted here, not by the memo: the ints of each
    tuple a key holds (a holder's slots, their peers), at any depth."""
    def count(part) -> int:
        return sum(map(count, part)) if isinstance(part, tuple) else 1
    return sum(count(part) for key in memo.entries for part in key if isinstance(part, tuple))


def test_a_long_decode_keeps_the_incremental_checks_memory_bounded(monkeypatch):
    """The memo of the incremental checks kept up to 16,384 entries, each a copy of a
    decoding request's row as it grew: a conformant 100,000-step replay grew the harness
    past 8 GiB, reported as the reference leaking. Bounded by the slots it holds, it stays
    within its limit plus the one holder read last, at every step."""
    monkeypatch.delenv("KVSPEC_CHECKS", raising=False)
    engine = driver(config=EngineConfig(16, 64, 1 << 13, 1 << 10, 2))
    memo = engine.invariants.certificates.memo
    memo.limit = 4096
    engine.apply(step("admit", rid="r", prompt=list(range(64))))
    engine.apply(step("prefill_chunk", rid="r", chunk=64, token=7))
    for decoded in range(1, 1201):
        engine.apply(step("decode", rid="r", token=9))
        row = 64 + decoded
        if decoded % 100 == 0:
            held = slots_held(memo)
            assert held == memo.slots - len(memo.entries)  # its own accounting: one more per entry
            assert held <= memo.limit + 2 * row, (decoded, held)  # the last holder's slots and their peers
    assert memo.entries  # still remembering: the unchanged holders are hits


# -- D24, D34: values the harness cannot use -----------------------------------------------------------

def test_a_memory_limit_past_what_bytes_can_count_is_a_usage_error(tmp_path, capsys):
    """1e300 GiB in bytes overflowed to infinity: an OverflowError traceback before the run."""
    path = tmp_path / "v.jsonl"
    path.write_text(vector_text())
    with pytest.raises(SystemExit) as exit:
        main(["replay", str(path), "--memory-limit", "1e300"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "argument --memory-limit: 1e300 GiB: give at most 1048576 GiB" in err, err


@pytest.mark.parametrize("value", ["garbage", "NAIVE", "Incremental"])
def test_an_unknown_kvspec_checks_is_refused_naming_the_values_it_takes(monkeypatch, capsys, value):
    """It silently meant incremental: a user who mistyped naive believed the naive checks ran."""
    monkeypatch.setenv("KVSPEC_CHECKS", value)
    with pytest.raises(SystemExit) as exit:
        main(["check", "--run", "allocator P=4"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and f"KVSPEC_CHECKS={value!r} is not a way of checking" in err, err
    assert "incremental or naive" in err
    with pytest.raises(ValueError, match="incremental or naive"):
        Checks(AllocatorView, ())


@pytest.mark.parametrize("value, incremental", [("naive", False), ("incremental", True), ("", True)])
def test_the_values_kvspec_checks_takes(monkeypatch, value, incremental):
    monkeypatch.setenv("KVSPEC_CHECKS", value)
    assert (Checks(AllocatorView, ()).certificates is not None) == incremental
