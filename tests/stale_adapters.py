"""Adapters whose own code reads their engine the way an older release of it allowed, for
tests/test_release_day.py. Their engine is kvspec's reference, a real installed package
(distribution `kvspec`, at its installed release): each adapter reads an attribute it does
not have, calls it with an argument it does not take, or imports a name it lacks. The
engine is right every time; the adapter is stale. Loaded by `module:attribute`."""

from importlib.metadata import version

from kvspec.adapters.reference import ADAPTER as REFERENCE
from kvspec.adapters.reference import ReferenceEngineAdapter
from kvspec.conformance.harness.built_for import BuiltFor

BUILT_FOR = BuiltFor("kvspec", (version("kvspec"),), "the reference")


class ReadsAGoneAttribute(ReferenceEngineAdapter):
    def snapshot(self):
        self.engine.block_hashes  # noqa: B018 - what an earlier release had
        return super().snapshot()


class CallsAnOldSignature(ReferenceEngineAdapter):
    def admit(self, rid, prompt):
        return self.engine.admit(rid, prompt, num_lookahead_tokens=0)


class ImportsAMovedName(ReferenceEngineAdapter):
    def snapshot(self):
        from kvspec.reference.engine import KVCacheBlock  # noqa: F401 - where an earlier release had it

        return super().snapshot()


class BrokenEngine(ReferenceEngineAdapter):
    """The adapter is right; the engine's own code fails (an engine's crash, not the adapter's)."""

    def admit(self, rid, prompt):
        self.engine.allocator = None  # the engine's state, broken as a bug of its own would: it raises inside
        return self.engine.admit(rid, prompt)


def adapter(label, make_engine, built_for=BUILT_FOR):
    return type("Adapter", (), {"name": label, "policy_version": REFERENCE.policy_version,
                                "capabilities": REFERENCE.capabilities, "make_engine": make_engine,
                                "built_for": built_for})


READS_A_GONE_ATTRIBUTE = adapter("reads-a-gone-attribute", ReadsAGoneAttribute)
CALLS_AN_OLD_SIGNATURE = adapter("calls-an-old-signature", CallsAnOldSignature)
IMPORTS_A_MOVED_NAME = adapter("imports-a-moved-name", ImportsAMovedName)
UNPINNED_READS_A_GONE_ATTRIBUTE = adapter("unpinned", ReadsAGoneAttribute, built_for=None)
BROKEN_ENGINE = adapter("broken-engine", BrokenEngine)
