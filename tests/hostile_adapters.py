"""Adapters of a hostile but fair implementation, for tests/test_hostile_round2_harness.py:
each does one thing real engines do (start a helper thread or process, keep the prompt
list it is given, change folder) or one thing an adapter gets wrong (a declaration of the
wrong type, a preload module that raises or hangs). Loaded by `module:attribute`."""

import os
import subprocess
import threading
import time

from kvspec.adapters.reference import ADAPTER as REFERENCE
from kvspec.adapters.reference import ReferenceEngineAdapter


def engine(label, make_engine, **extra):
    return type("Adapter", (), {"name": label, "policy_version": REFERENCE.policy_version,
                                "capabilities": REFERENCE.capabilities, "make_engine": staticmethod(make_engine),
                                **extra})


def thread_outlives(config):
    """A helper thread (a watchdog, a poller) that is no daemon and is never joined."""
    threading.Thread(target=time.sleep, args=(3600,), name="engine-watchdog").start()
    return ReferenceEngineAdapter(config)


def spawns_child(config):
    """A helper process (a tokenizer, a detokenizer) never reaped; it writes its pid where the test reads it."""
    child = subprocess.Popen(["sleep", "3600"])
    with open(os.environ["KVSPEC_TEST_CHILDREN"], "a") as children:
        children.write(f"{child.pid}\n")
    return ReferenceEngineAdapter(config)


class KeepsPrompt(ReferenceEngineAdapter):
    """Keeps the prompt list it is given as the request's tokens and appends its outputs to it
    (no copy); never releases a request that decoded (a leak, so that a trace is saved)."""

    def __init__(self, config):
        super().__init__(config)
        self.tokens, self.decoded = {}, set()

    def admit(self, rid, prompt):
        result = self.engine.admit(rid, prompt)
        if prompt is not None:
            self.tokens[rid] = prompt
        return result

    def decode(self, rid, token):
        result = self.engine.decode(rid, token)
        self.decoded.add(rid)
        self.tokens.get(rid, []).append(999999)
        return result

    def finish(self, rid, trim):
        return None if rid in self.decoded else self.engine.finish(rid, trim)


class ChdirThenLeak(ReferenceEngineAdapter):
    """Changes its process's folder when built (as some engines do); never releases a finished request."""

    def __init__(self, config):
        os.makedirs(os.environ["KVSPEC_TEST_ELSEWHERE"], exist_ok=True)
        os.chdir(os.environ["KVSPEC_TEST_ELSEWHERE"])
        super().__init__(config)

    def finish(self, rid, trim):
        return None


class GeneratorExitInDecode(ReferenceEngineAdapter):
    def decode(self, rid, token):
        raise GeneratorExit("not an Exception")


class KeyboardInterruptInDecode(ReferenceEngineAdapter):
    def decode(self, rid, token):
        raise KeyboardInterrupt("raised by the implementation")


def fails_at_page_16(config):
    if config.page_size == 16:
        raise NotImplementedError("page size 16 is not supported")
    return ReferenceEngineAdapter(config)


def hangs_in_decode(config):
    class Hangs(ReferenceEngineAdapter):
        def decode(self, rid, token):
            time.sleep(3600)

    return Hangs(config)


THREAD_OUTLIVES = engine("thread-outlives", thread_outlives)
SPAWNS_CHILD = engine("spawns-child", spawns_child)
KEEPS_PROMPT = engine("keeps-prompt", KeepsPrompt)
CHDIR_THEN_LEAK = engine("chdir-then-leak", ChdirThenLeak)
GENERATOR_EXIT = engine("generator-exit", GeneratorExitInDecode)
KEYBOARD_INTERRUPT = engine("keyboard-interrupt", KeyboardInterruptInDecode)
FAILS_AT_PAGE_16 = engine("fails-at-page-16", fails_at_page_16)
HANGS_IN_DECODE = engine("hangs-in-decode", hangs_in_decode)
PRELOAD_RAISES = engine("preload-raises", ReferenceEngineAdapter, preload=("hostile_preload_raises",))
PRELOAD_EXITS = engine("preload-exits", ReferenceEngineAdapter, preload=("hostile_preload_exits",))
PRELOAD_HANGS = engine("preload-hangs", ReferenceEngineAdapter, preload=("hostile_preload_hangs",))


class RaisingProperty:
    name = "raising-property"
    policy_version = REFERENCE.policy_version
    make_engine = staticmethod(ReferenceEngineAdapter)

    @property
    def capabilities(self):
        raise RuntimeError("computed from a config file that is missing")


RAISING_PROPERTY = RaisingProperty()
WRONG_TYPES = {  # attribute -> a value of the wrong type (hostile-round-2 D14)
    "capabilities": None, "policy_versions": None, "observables": 5, "version_capabilities": "x",
    "preload": 5, "memory_model": ["two-pool"], "policy_version": ["x"]}
for _attribute, _value in WRONG_TYPES.items():
    globals()[f"WRONG_{_attribute.upper()}"] = engine("wrong", ReferenceEngineAdapter, **{_attribute: _value})
WRONG_NAME = engine(None, ReferenceEngineAdapter)
WRONG_VERSION_CAPABILITIES_LIST = engine("wrong", ReferenceEngineAdapter, version_capabilities=[1, 2])
WRONG_NAME_INT = engine(42, ReferenceEngineAdapter)

