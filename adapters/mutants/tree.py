"""Prefix tree bugs (TREE-2 .. TREE-5, WIN-7): what a match accepts and what eviction may
take, decided wrong in the tree's SWA component."""

from kvspec.conformance.harness.declarations import Run
from kvspec.reference.components import SWAComponent

from .seeding import Mutant, engine_with_swa_component


class ShortWindowMatchSWAComponent(SWAComponent):
    def match_validator(self):
        live_run = [None]

        def accept(node) -> bool:
            if node.swa is None:
                return False  # BUG: the live run is not reset to 0 at a tombstone
            if live_run[0] is None:
                return True
            live_run[0] += len(node)
            return live_run[0] >= self.tree.window

        return accept


class MATCH_SHORT_WINDOW(Mutant, slug="match-short-window", engine=engine_with_swa_component(ShortWindowMatchSWAComponent)):
    """The SWA match validator (WIN-7, TREE-2) rejects a tombstone but forgets that the
    live SWA run starts again after it: it stays "no tombstone met", so any live node
    below a tombstone is accepted, with fewer than `W` live SWA tokens after it. A request
    that matches such a prefix starts with a window reaching into the tombstone: I8 on
    admission. The engine machine draws that rarely (a prompt that follows a cached path
    through a tombstone and leaves it fewer than W tokens later). Before its prompts
    followed stems through their tombstones it found this in the 218th example at seed 0
    (ci profile) and missed it on other runs; since, `kvspec zoo` finds it in about 5 s.
    Since the machine also draws flushes and waiting matches, the seed-0 search at interval
    128 first meets the same bug through a PD admission whose match reaches past the
    tombstone, checkpointing a leaf a correct match would not reach (I10, after 3 s); at
    interval 1 it meets I8 as above, though in a process that ran other searches before
    (pytest's workers) the same seed has met the PD form first there too: I10 is `also`."""

    clause, invariant_class = "I8", "window-liveness"
    also = ("I10",)
    exposed_by = Run(page_size=4, window=8, interval=1)


class LockIgnoringSWAComponent(SWAComponent):
    def evict(self, num_tokens: int) -> int:
        freed = 0
        candidates = sorted((n for n in self.tree.nodes() if n.swa is not None and n.parent is not None),
                            key=lambda n: n.swa_access)
        for node in candidates:
            if freed >= num_tokens:
                break
            if node.swa is None:  # BUG: `or node.swa_lock_ref > 0` left out: locked SWA is evicted too
                continue
            if self.tree.is_evictable_leaf(node):
                freed += self.tree.delete_leaf(node)
            else:
                freed += self.tombstone(node)
        return freed

    def tombstone(self, node) -> int:
        # the same implementation never consults SWA locks, here either (the reference asserts none)
        self.tree.allocator.free_swa_segment(node.full, node.start)
        node.swa = None
        self.evictable -= len(node)
        return len(node)


class SWA_EVICT_IGNORES_LOCKS(Mutant, slug="swa-evict-ignores-locks",
                              engine=engine_with_swa_component(LockIgnoringSWAComponent)):
    """SWA eviction (TREE-5) does not skip SWA-locked nodes: the SWA KV of a running
    request's locked window is freed (a locked node is never an evictable leaf, so it is
    tombstoned). The reference's own guard in `tombstone` (assert `swa_lock_ref == 0`) is
    absent too, as in an implementation that never consults the lock there: with it, the
    step would crash inside evict instead. I14 sees the locked SWA taken; the ledgers (I12)
    and the request's window (I8) break alongside."""

    clause, invariant_class = "I14", "locks"
    exposed_by = Run(page_size=4, window=7, interval=1)
    reverts = "TREE-5 / docs/engines/sglang.md §3.8: SWA eviction skips nodes with swa_lock_ref > 0"
