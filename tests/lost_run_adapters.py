"""The reference behind adapters whose implementation hangs or dies at its first operation,
at every tier and in both memory models: a run of every label shape can be lost
(tests/test_planned_runs.py). Loaded by `module:attribute`, as a third party's adapter is."""

import os
import signal
import time

from kvspec.adapters.reference import ADAPTER as REFERENCE
from kvspec.adapters.reference import ReferenceAllocatorAdapter, ReferenceEngineAdapter, make_scheduler

LOOKS = {"state", "available_sizes", "snapshot", "partial_snapshot"}
"""What a driver reads to see the implementation: these work, every operation meets its fate."""


def hang():
    time.sleep(3600)


def die():
    os.kill(os.getpid(), signal.SIGKILL)


class Fated:
    """`inner`, whose every operation (not what shows it) hangs or dies."""

    def __init__(self, inner, fate):
        self.inner, self.fate = inner, fate

    def __getattr__(self, name):
        attribute = getattr(self.inner, name)
        if name in LOOKS or not callable(attribute):
            return attribute
        return lambda *args, **kwargs: self.fate()


def adapter(name, fate):
    return type(name, (), {
        "name": name, "policy_version": REFERENCE.policy_version, "policy_versions": REFERENCE.policy_versions,
        "capabilities": REFERENCE.capabilities, "version_capabilities": REFERENCE.version_capabilities,
        "make_allocator": staticmethod(lambda *args: Fated(ReferenceAllocatorAdapter(*args), fate)),
        "make_engine": staticmethod(lambda config: Fated(ReferenceEngineAdapter(config), fate)),
        "make_scheduler": staticmethod(lambda config: Fated(make_scheduler(config), fate))})


HANGS = adapter("hangs", hang)
DIES = adapter("dies", die)
