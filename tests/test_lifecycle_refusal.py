"""[LIFE-1] The misuse every engine refuses is one spec function, `kvspec.spec.lifecycle.refusal`.

Each rule names its misuse; every call the lifecycle allows is refused by none; and an
engine refuses with exactly the spec's words (the reference here; SGLang and vLLM in
their own adapter tests, which drive the same machine)."""

import pytest

from kvspec.reference.engine import TwoPoolEngine
from kvspec.spec.lifecycle import EngineOperation, RunningRequest, refusal
from kvspec.spec.outcomes import InvalidRequest
from kvspec.spec.snapshot import EngineConfig

PREFILLING = RunningRequest(finished_prefill=False, seq_len=10, trimmable=4, committed=4)
DECODING = RunningRequest(finished_prefill=True, seq_len=12, trimmable=4, committed=11)
RUNNING = {"p": PREFILLING, "d": DECODING}
SIZE_FULL = 64

MISUSE = [  # (operation, args, words of the refusal)
    (EngineOperation.ADMIT, {"rid": "d", "prompt": [1]}, "already running"),
    (EngineOperation.ADMIT, {"rid": "x", "prompt": None}, "was not retracted"),
    (EngineOperation.ADMIT, {"rid": "x", "prompt": []}, "has no tokens"),
    (EngineOperation.ADMIT, {"rid": "x", "prompt": [1] * SIZE_FULL}, "cannot fit the full pool"),
    (EngineOperation.PD_ADMIT, {"rid": "x", "prompt": [], "first_output": 1}, "has no prompt"),
    (EngineOperation.PD_ADMIT, {"rid": "x", "prompt": [1] * (SIZE_FULL - 1), "first_output": 1},
     "cannot fit the full pool"),
    (EngineOperation.PREFILL_CHUNK, {"rid": "x", "chunk": 4, "token": 0}, "unknown request"),
    (EngineOperation.PREFILL_CHUNK, {"rid": "d", "chunk": 4, "token": 0}, "has finished its prefill"),
    (EngineOperation.PREFILL_CHUNK, {"rid": "p", "chunk": 0, "token": 0}, "chunk_len >= 1"),
    (EngineOperation.PREFILL_BATCH, {"chunks": []}, "at least one chunk"),
    (EngineOperation.PREFILL_BATCH, {"chunks": [{"rid": "p", "chunk": 4, "token": 0}] * 2}, "names request 'p' twice"),
    (EngineOperation.PREFILL_BATCH, {"chunks": [{"rid": "p", "chunk": 4, "token": 0},
                                                {"rid": "d", "chunk": 4, "token": 0}]}, "has finished its prefill"),
    (EngineOperation.PREFILL_BATCH, {"chunks": [{"rid": "x", "chunk": 4, "token": 0}]}, "unknown request"),
    (EngineOperation.DECODE, {"rid": "p", "token": 0}, "still in prefill"),
    (EngineOperation.FINISH, {"rid": "p", "trim": 0}, "cannot finish during prefill"),
    (EngineOperation.FINISH, {"rid": "d", "trim": 5}, "trim 5 must lie within"),
    (EngineOperation.FINISH, {"rid": "d", "trim": -1}, "trim -1 must lie within"),
    (EngineOperation.ABORT, {"rid": "x"}, "unknown request"),
    (EngineOperation.RETRACT, {"rid": "x"}, "unknown request"),
    (EngineOperation.EVICT, {"full_tokens": -1, "swa_tokens": 0}, "non-negative"),
    (EngineOperation.FLUSH, {}, "flush while requests are running (d, p)"),
    (EngineOperation.MATCH, {"prompt": []}, "a match needs a prompt of at least one token"),
    (EngineOperation.PREFILL_BATCH, {"chunks": [{"rid": "p", "chunk": 5, "token": 0, "finish": True}]},
     "a chunk that finishes its request must complete its prompt (6 tokens left, the chunk has 5)"),
]
ALLOWED = [
    (EngineOperation.ADMIT, {"rid": "x", "prompt": [1, 2]}),
    (EngineOperation.ADMIT, {"rid": "w", "prompt": None}),
    (EngineOperation.PD_ADMIT, {"rid": "x", "prompt": [1, 2], "first_output": 3}),
    (EngineOperation.PREFILL_CHUNK, {"rid": "p", "chunk": 4, "token": 0}),
    (EngineOperation.PREFILL_BATCH, {"chunks": [{"rid": "p", "chunk": 4, "token": 0}]}),
    (EngineOperation.DECODE, {"rid": "d", "token": 0}),
    (EngineOperation.FINISH, {"rid": "d", "trim": 4}),
    (EngineOperation.ABORT, {"rid": "p"}),
    (EngineOperation.RETRACT, {"rid": "d"}),
    (EngineOperation.EVICT, {"full_tokens": 0, "swa_tokens": 0}),
    (EngineOperation.MATCH, {"prompt": [1]}),
    (EngineOperation.PREFILL_BATCH, {"chunks": [{"rid": "p", "chunk": 6, "token": 0, "finish": True}]}),
]


@pytest.mark.parametrize("operation, args, words", MISUSE, ids=lambda v: v if isinstance(v, str) else None)
def test_each_misuse_is_refused_in_words_that_name_it(operation, args, words):
    why = refusal(operation, args, RUNNING, {"w"}, SIZE_FULL)
    assert why is not None and words in why


@pytest.mark.parametrize("operation, args", ALLOWED, ids=lambda v: v if isinstance(v, str) else None)
def test_what_the_lifecycle_allows_is_never_refused(operation, args):
    assert refusal(operation, args, RUNNING, {"w"}, SIZE_FULL) is None


def test_a_decode_that_would_outgrow_the_pool_is_refused():
    full = {"d": RunningRequest(finished_prefill=True, seq_len=SIZE_FULL, trimmable=0, committed=SIZE_FULL - 1)}
    assert "outgrow the full pool" in refusal(EngineOperation.DECODE, {"rid": "d", "token": 0}, full, (), SIZE_FULL)


def test_the_reference_refuses_with_the_specs_words():
    """The reference engine raises InvalidRequest with the message `refusal` gives, and
    changes nothing."""
    engine = TwoPoolEngine(EngineConfig(page_size=4, window=8, size_full=64, size_swa=32))
    engine.admit("r", [1, 2, 3, 4, 5])
    before = engine.snapshot()
    with pytest.raises(InvalidRequest) as raised:
        engine.decode("r", 0)  # still in prefill
    running = {"r": RunningRequest(False, 5, 0, 0)}
    assert str(raised.value) == refusal(EngineOperation.DECODE, {"rid": "r"}, running, (), 64)
    assert engine.snapshot() == before


def test_the_reference_refuses_a_batch_whole():
    """[LIFE-9] A batch with one chunk the lifecycle forbids is refused before any chunk runs."""
    engine = TwoPoolEngine(EngineConfig(page_size=4, window=8, size_full=64, size_swa=32))
    engine.admit("a", [1, 2, 3, 4, 5])
    engine.admit("b", [1, 2, 3])
    engine.prefill_chunk("b", 8, 0)  # b has finished its prefill
    before = engine.snapshot()
    with pytest.raises(InvalidRequest, match="in the batch: request 'b' has finished its prefill"):
        engine.prefill_batch([{"rid": "a", "chunk": 4, "token": 0}, {"rid": "b", "chunk": 4, "token": 0}])
    assert engine.snapshot() == before
