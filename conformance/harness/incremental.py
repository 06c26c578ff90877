"""Incremental checking: the costliest invariants of a two-pool engine, checked at the pace
of what a step changed, with the spec's verdicts.

The spec's predicates (kvspec.spec.invariants) are the naive definitions: readable, and
each walks the whole snapshot after every step. Here each costly one has a *certificate*:
a function of the same snapshots that returns True only if the predicate would find
nothing. The driver runs the certificate first; when it cannot certify (False, or it
cannot read the snapshot), the spec's predicate runs and its violations are the verdict.
So the clauses and messages are always the spec's, and a certificate can cost time but
never change a verdict, as long as it never says True where the predicate finds something:
tests/test_incremental.py runs both on the same random runs of correct and seeded-bug
engines and requires the same violations at the same step.

What makes them cheap:
  * what a holder (a request's private positions, a node) implies by itself, its pages and
    whether it is aligned, is kept between snapshots, keyed by its value: after a step only
    the holders it changed are read again (`Memo`);
  * what one snapshot implies for several checks (the nodes by id, each request's path) is
    built once per snapshot (`Derived`);
  * the rest is counting and comparing in C: sets, min and max, `tuple.count`, and the
    mapping's entries read with `operator.itemgetter`, never a Python loop over the pool.

The two-pool model's certificates are here, the block pool's (chapter 08) in
incremental_block_pool.py; every other check runs as the spec writes it.
"""

from collections.abc import Callable, Sequence
from itertools import chain, repeat
from operator import eq, floordiv, itemgetter, mod

from kvspec.spec.accounting import HeldSequence, PartialMapping, alignment_violations
from kvspec.spec.invariants import accounting, tree, window
from kvspec.spec.notation import MAPPING_SENTINEL, NO_SWA_PEER, SlotId
from kvspec.spec.registry import Invariant
from kvspec.spec.snapshot import NodeView, RequestView, Step, TwoPoolSnapshot

from .incremental_block_pool import BlockPoolCertificates

CANNOT_READ = (IndexError, KeyError, TypeError, ValueError, AttributeError)
"""A certificate that meets a snapshot it cannot read leaves it to the spec's predicate,
which reports what it cannot read."""


def gather(mapping: Sequence[SlotId], slots: Sequence[SlotId]) -> tuple[SlotId, ...]:
    """mapping[slot] for every slot, read in C (as the spec reads it: Python indexing)."""
    if len(slots) > 1:
        return itemgetter(*slots)(mapping)
    return (mapping[slots[0]],) if slots else ()


MEMO_SLOTS = 1 << 20
"""Most slots a Memo keeps in its keys: about 100 MB at worst (each slot an int of the
snapshot kept alive by a key, a page of a value). A bound by entries would not bound
memory: a decoding request's row is a new key at every step, tens of thousands of slots
long in a long run, and 16,384 such keys outgrew the harness's own memory limit."""


class Memo:
    """Facts of one holder, kept between snapshots by the holder's value (a frozen view):
    a holder a step did not change is a hit. Bounded by what it holds, not by its
    entries: each entry weighs the slots its key names (`weight`), and the memo is cleared
    when their sum would pass `limit`. A fact is never larger than its key (a holder's
    pages, at most one per slot), so the memo keeps at most about twice `limit` elements,
    plus the one entry of a holder larger than `limit` alone."""

    def __init__(self, limit: int = MEMO_SLOTS):
        self.limit, self.entries, self.slots = limit, {}, 0

    def get(self, key: tuple, compute: Callable):
        try:
            return self.entries[key]
        except KeyError:
            weight = self.weight(key)
            if self.slots + weight > self.limit:
                self.entries.clear()  # all at once: what a step reads again is found again at once
                self.slots = 0
            value = self.entries[key] = compute()
            self.slots += weight
            return value

    @staticmethod
    def weight(key: tuple) -> int:
        """The slots a key names: the lengths of its tuples (a holder's slots, its peers),
        one for the entry itself."""
        return 1 + sum(len(part) for part in key if isinstance(part, tuple))


class Derived:
    """What one snapshot implies for several certificates, built once: the holders, the
    nodes by id, each request's path."""

    def __init__(self, now: TwoPoolSnapshot):
        self.snapshot = now
        self.non_root = [node for node in now.nodes if node.parent is not None]
        self.nodes: dict[int, NodeView] = {}
        for node in now.nodes:
            self.nodes.setdefault(node.node_id, node)
        # what each holder holds, as kvspec.spec.invariants.holders says, in its order
        # (requests, then nodes), as plain (slots, first position, first live-SWA position)
        self.holdings = [(r.row[r.cache_protected_len:r.kv_allocated_len], r.cache_protected_len, r.swa_live_from)
                         for r in now.requests]
        self.holdings += [(node.full_value, node.start, node.start if node.swa_value is not None else node.end)
                          for node in self.non_root]
        self.paths: dict[int | None, list[NodeView] | None] = {}
        self.held: Held | None = None

    def path(self, node_id: int | None) -> list[NodeView] | None:
        """The non-root nodes from the root's child to node_id (empty for None or the root);
        None when the parents do not lead to the root in strictly rising starts (a
        malformed tree: the spec's predicate decides)."""
        if node_id not in self.paths:
            path, current, nodes = [], self.nodes.get(node_id) if node_id is not None else None, self.nodes
            while current is not None and current.parent is not None:
                parent = nodes.get(current.parent)
                if parent is None or parent.start >= current.start and parent.parent is not None:
                    path = None
                    break
                path.append(current)
                current = parent
            if path is not None:
                path.reverse()
            if node_id is not None and node_id not in self.nodes:
                path = None
            self.paths[node_id] = path
        return self.paths[node_id]


class Held:
    """What every holder holds, for I2-I5, over all holders at once: the live-SWA slots and
    their peers, one holder after another in the spec's holder order; the distinct full and
    SWA pages held, and how many each holder holds summed (a page once per holder, as
    kvspec.spec.accounting.held_full_pages counts them). At page size 1 a page is a slot,
    read in C; above it each holder's pages are remembered by the holder's slots (`Memo`)."""

    def __init__(self, holdings: list[tuple], mapping: Sequence[SlotId], page_size: int, memo: "Memo"):
        slots = [held for held, _, _ in holdings]
        live = [held[max(0, live_from - start):] for held, start, live_from in holdings]
        self.live_slots = list(chain.from_iterable(live))
        self.peers = gather(mapping, self.live_slots)
        self.peers_positive = not self.peers or min(self.peers) > 0
        if page_size == 1:
            self.full_pages, self.full_page_count = self.distinct(slots, list(chain.from_iterable(slots)))
            self.swa_pages, self.swa_page_count = self.distinct(live, self.peers)
            self.offsets_in_step = self.one_swa_page_per_full_page = True
            return
        size = repeat(page_size)
        full = [memo.get(("pages", held, page_size), lambda: frozenset(map(floordiv, held, size))) for held in slots]
        self.full_pages, self.full_page_count = set().union(*full), sum(map(len, full))
        facts, at = [], 0
        for held in live:  # each holder's peers, its slice of self.peers
            mine, at = self.peers[at:at + len(held)], at + len(held)
            facts.append(memo.get(("peers", held, mine, page_size), lambda: (
                frozenset(map(floordiv, mine, size)),
                all(map(eq, map(mod, mine, size), map(mod, held, size))),
                frozenset(zip(map(floordiv, held, size), map(floordiv, mine, size))))))
        self.swa_pages, self.swa_page_count = set().union(*(f[0] for f in facts)), sum(len(f[0]) for f in facts)
        self.offsets_in_step = all(f[1] for f in facts)
        pairs = frozenset().union(*(f[2] for f in facts))
        self.one_swa_page_per_full_page = len(pairs) == len({full_page for full_page, _ in pairs})

    @staticmethod
    def distinct(per_holder: list[tuple], pages: Sequence[SlotId]) -> tuple[set, int]:
        """The distinct pages (page size 1: slots) and the sum over holders of each one's."""
        distinct = set(pages)
        if len(distinct) == len(pages):
            return distinct, len(pages)  # no page twice, so none twice in one holder
        holder = chain.from_iterable(map(repeat, range(len(per_holder)), map(len, per_holder)))
        return distinct, len(set(zip(holder, pages)))


class Certificates:
    """The certificates of one driver, with the memo they keep between its snapshots."""

    def __init__(self):
        self.memo = Memo()
        self.derived: Derived | None = None
        self.by_function: dict[Callable, Callable[..., bool]] = {
            accounting.full_conservation_violations: self.full_conservation,
            accounting.swa_conservation_violations: self.swa_conservation,
            accounting.engine_ownership_violations: self.ownership,
            accounting.engine_mapping_violations: self.mapping,
            accounting.engine_alignment_violations: self.alignment,
            window.window_liveness_violations: self.window_liveness,
            window.decode_read_window_violations: self.decode_read_window,
            tree.lock_violations: self.locks,
            tree.tree_structure_violations: self.tree_structure,
            tree.eviction_violations: self.eviction,
            **BlockPoolCertificates().by_function,
        }

    def certifies(self, check: Invariant, now, previous=None, step=None) -> bool:
        """Whether the certificate of `check` (if it has one) shows it finds nothing."""
        certificate = self.by_function.get(check.function)
        if certificate is None or not isinstance(now, check.snapshot_type):
            return False
        try:
            return bool(certificate(previous, step, now) if check.compares_steps else certificate(now))
        except CANNOT_READ:
            return False

    def of(self, now: TwoPoolSnapshot) -> Derived:
        if self.derived is None or self.derived.snapshot is not now:
            self.derived = Derived(now)
        return self.derived

    # -- the holders' pages and the mapping (I2-I5) -----------------------------------------

    def held(self, now: TwoPoolSnapshot) -> "Held":
        derived = self.of(now)
        if derived.held is None:
            derived.held = Held(derived.holdings, now.allocator.mapping, now.config.page_size, self.memo)
        return derived.held

    @staticmethod
    def accounted(pool, held_pages: int) -> bool:
        return pool.free_count + len(pool.pending_pages) + held_pages == pool.num_pages

    def full_conservation(self, now: TwoPoolSnapshot) -> bool:
        return self.accounted(now.allocator.full, self.held(now).full_page_count)

    def swa_conservation(self, now: TwoPoolSnapshot) -> bool:
        held = self.held(now)
        return held.peers_positive and self.accounted(now.allocator.swa, held.swa_page_count)

    def ownership(self, now: TwoPoolSnapshot) -> bool:
        held = self.held(now)
        if not held.peers_positive:
            return False
        for pool, pages, count in ((now.allocator.full, held.full_pages, held.full_page_count),
                                   (now.allocator.swa, held.swa_pages, held.swa_page_count)):
            if len(pages) != count:
                return False  # a page with two holders
            if pages and not 1 <= min(pages) <= max(pages) <= pool.num_pages:
                return False
            if not pages.isdisjoint(pool.free_pages or ()) or not pages.isdisjoint(pool.pending_pages):
                return False
        return True

    def mapping(self, now: TwoPoolSnapshot) -> bool:
        allocator, page_size = now.allocator, now.config.page_size
        mapping, swa, held = allocator.mapping, allocator.swa, self.held(now)
        if len(mapping) != allocator.size_full + page_size + 1 or mapping[-1] != MAPPING_SENTINEL:
            return False
        live, peers = held.live_slots, held.peers
        if len(set(live)) != len(live):
            return False  # a full slot held twice (I4's): the spec's walk decides I5
        if peers:
            if not held.peers_positive or len(set(peers)) != len(peers):
                return False
            if not 1 <= min(peers) // page_size <= max(peers) // page_size <= swa.num_pages:
                return False
            if not held.offsets_in_step or not held.one_swa_page_per_full_page:
                return False
            if not held.swa_pages.isdisjoint(swa.free_pages or ()) or not held.swa_pages.isdisjoint(swa.pending_pages):
                return False
        if isinstance(mapping, PartialMapping):
            return True
        return len(mapping) - 1 - mapping[:-1].count(NO_SWA_PEER) == len(peers)

    # -- alignment (I6) --------------------------------------------------------------------

    def alignment(self, now: TwoPoolSnapshot) -> bool:
        page_size, derived = now.config.page_size, self.of(now)
        for holding in derived.holdings if page_size > 1 else ():  # at page size 1 every slot is aligned
            if not self.memo.get(("aligned", *holding, page_size),
                                 lambda: not alignment_violations([HeldSequence(*holding)], page_size)):
                return False
        for r in now.requests:
            if r.cache_protected_len % page_size or r.swa_evicted_seqlen % page_size:
                return False
        return all(node.key and not len(node.key) % page_size and not node.start % page_size
                   for node in derived.non_root)

    # -- window liveness (I8) --------------------------------------------------------------

    def live(self, now: TwoPoolSnapshot, r: RequestView, lo: int, hi: int) -> bool:
        """Every position of [lo, hi) of request r has live SWA KV (window.dead_swa_reason
        finds none)."""
        if lo >= hi:
            return True
        protected = r.cache_protected_len
        top = max(lo, protected)
        if top < hi:
            mapping = now.allocator.mapping
            if top < r.swa_live_from or hi > len(r.row):
                return False
            slots = r.row[top:hi]
            if min(slots) < 0 or max(slots) >= len(mapping) - 1 or min(gather(mapping, slots)) <= 0:
                return False
        below = min(hi, protected)
        if lo < below:
            path = self.of(now).path(r.last_node)
            if path is None:
                return False
            reached = lo
            for node in path:  # rising starts (Derived.path): a gap or a tombstone fails
                if node.end <= reached:
                    continue
                if node.start > reached or node.swa_value is None:
                    return False
                reached = node.end
                if reached >= below:
                    break
            if reached < below:
                return False
        return True

    def window_liveness(self, now: TwoPoolSnapshot) -> bool:
        window = now.config.window
        for r in now.requests:
            start = max(0, r.kv_committed_len - window)
            if not self.live(now, r, start, r.kv_committed_len):
                return False
            last = r.kv_allocated_len - 1
            if last >= 0 and not start <= last < r.kv_committed_len and not self.live(now, r, last, last + 1):
                return False
        return True

    def decode_read_window(self, previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> bool:
        if step is None or step.operation != "decode" or step.outcome != "ok" or step.rid is None:
            return True
        before = next((r for r in previous.requests if r.rid == step.rid), None)
        after = next((r for r in now.requests if r.rid == step.rid), None)
        if before is None or after is None:
            return True
        return self.live(now, after, max(0, before.kv_committed_len - now.config.window), before.kv_committed_len)

    # -- the tree (I11, I13, I14) ----------------------------------------------------------

    def locks(self, now: TwoPoolSnapshot) -> bool:
        derived, window = self.of(now), now.config.window
        if len({r.rid for r in now.requests}) != len(now.requests):
            return False  # the spec counts one path per request id
        path_locks: dict[int, int] = {}
        for r in now.requests:
            if r.last_node is None:
                if r.cache_protected_len:
                    return False
                continue
            path = derived.path(r.last_node)
            if path is None or derived.nodes[r.last_node].end != r.cache_protected_len:
                return False
            for node in path:
                path_locks[node.node_id] = path_locks.get(node.node_id, 0) + 1
            if any(node.swa_lock_ref < 1 for node in tree.swa_lock_segment(path, window)):
                return False
            prefix = tuple(chain.from_iterable(node.full_value for node in path))
            if r.row[:min(len(prefix), r.cache_protected_len)] != prefix[:r.cache_protected_len]:
                return False
        running = bool(now.requests)
        for node in now.nodes:
            if node.full_lock_ref < 0 or node.swa_lock_ref < 0:
                return False
            if node.parent is None:
                if node.full_lock_ref < 1 or node.swa_lock_ref < 1:
                    return False
            elif (node.full_lock_ref < node.swa_lock_ref or node.full_lock_ref != path_locks.get(node.node_id, 0)
                  or not running and node.swa_lock_ref):
                return False
        return True

    def tree_structure(self, now: TwoPoolSnapshot) -> bool:
        if not now.nodes:
            return True
        derived, mapping, page_size = self.of(now), now.allocator.mapping, now.config.page_size
        if len(derived.nodes) != len(now.nodes):
            return False  # a duplicate id
        roots = [node for node in now.nodes if node.parent is None]
        if len(roots) != 1 or roots[0].key or roots[0].full_value or roots[0].start != 0:
            return False
        last_slot = len(mapping) - 2
        for node in derived.non_root:
            parent = derived.nodes.get(node.parent)
            if parent is None or node.start != parent.end or (parent.parent is not None and not parent.key):
                return False  # starts rise strictly along every parent link: no cycle, the root is reached
            if len(node.full_value) != len(node.key) or node.swa_value is not None and len(node.swa_value) != len(node.key):
                return False
            if node.swa_value is not None and node.full_value:
                if min(node.full_value) < 0 or max(node.full_value) > last_slot:
                    return False
                if gather(mapping, node.full_value) != node.swa_value:
                    return False
        first_pages = {(node.parent, node.key[:page_size]) for node in derived.non_root}
        return len(first_pages) == len(derived.non_root)

    def eviction(self, previous: TwoPoolSnapshot, step: Step | None, now: TwoPoolSnapshot) -> bool:
        if step is None or step.operation not in tree.EVICTING_OPERATIONS:
            return True
        nodes = self.of(now).nodes
        for node in previous.nodes:
            if node.parent is None or not (node.full_lock_ref > 0 or node.swa_lock_ref > 0):
                continue
            kept = nodes.get(node.node_id)
            if (kept is None or kept.parent is None or kept.start != node.start or len(kept.key) != len(node.key)
                    or kept.full_value != node.full_value):
                return False  # gone or split: the spec's predicate looks for its pairs elsewhere
            if node.swa_lock_ref > 0 and node.swa_value is not None and kept.swa_value != node.swa_value:
                return False
        return True

