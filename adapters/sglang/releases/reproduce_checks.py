"""What a reproduction asserts (`CHECKS`): each one property over SGLang's own state in plain
terms, written once here as the file's code, with the helpers that read that state (`OBSERVE`)."""

import re
from dataclasses import dataclass

OBSERVE = {
    "free_pages": '''
def free_pages(pool):
    """A pool's free list: its free pages and those freed since it last sorted them."""
    pages = pool.free_pages.tolist()
    return pages if pool.release_pages is None else pages + pool.release_pages.tolist()
''',
    "tree_nodes": '''
def tree_nodes():
    """Every node of the prefix tree but its root: (node, its full slots, its SWA slots or None
    where its SWA KV was released (a tombstone), its full lock count)."""
    stack = list({root}.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        {read}
''',
    "kv_of": '''
def kv_of(req):
    """What a request holds: (its row of req_to_token_pool, cache_protected_len, its SWA cursor,
    kv_allocated_len), or None before its first extend. A release keeps these on the request or
    in `req.kv`, which took them over one by one (0.5.17 - 0.5.19)."""
    kv = getattr(req, "kv", None)

    def read(name):
        return getattr(kv, name) if hasattr(kv, name) else getattr(req, name)

    if read("req_pool_idx") is None:
        return None
    if hasattr(kv, "get_evicted_seqlen"):  # from 0.5.22
        cursor = kv.get_evicted_seqlen(ComponentType.SWA)
    else:
        cursor = read("swa_evicted_seqlen")
    return read("req_pool_idx"), read("cache_protected_len"), cursor, read("kv_allocated_len")
''',
}
TREE_READS = {
    # the node's fields, by tree (legacy: SWARadixCache; unified: UnifiedRadixCache's Python core)
    "legacy": "yield (node, node.value.tolist(), None if node.swa_tombstone else\n"
              "               allocator.full_to_swa_index_mapping[node.value].tolist(), node.full_lock_ref)",
    "unified": "full, swa = node.component(ComponentType.FULL), node.component(ComponentType.SWA)\n"
               "        yield node, full.value.tolist(), None if swa.value is None else swa.value.tolist(), full.lock_ref",
}
@dataclass(frozen=True)
class Check:
    """One property over SGLang's state, for the clauses of kvspec it stands for."""

    clauses: tuple[str, ...]
    source: str
    uses: tuple[str, ...]
    """The OBSERVE helpers it reads."""
    when: str = "step"
    """"step": after every step, of the requests then running; "pd_admit": after each PD
    admission, of its request; "drain": after the trace's drain."""
    imports: tuple[str, ...] = ()
    """What else of SGLang's it names ("module:name")."""
    needs: str = ""
    """An operation the trace must make for the check to apply ("pd_admit"), or "" for any."""
    trees: tuple[str, ...] = ()
    """The trees whose nodes it reads as written ("unified": UnifiedRadixCache's Python core), or () for any."""

    @property
    def function(self) -> str:
        return re.search(r"def (\w+)", self.source)[1]


CHECKS = (
    Check(("I2", "I3", "I4", "I5", "I13"), '''
def check_tree_is_allocated(after, requests):
    """The tree's KV is allocated: no full slot of a tree node is on the free list, nor the SWA
    slot of a position whose SWA KV is live (a node that is no tombstone), and that SWA slot is
    the one the allocator maps the position's full slot to (kvspec I2 - I5, I13)."""
    free_full = set(free_pages(allocator.full_attn_allocator))
    free_swa = set(free_pages(allocator.swa_attn_allocator))
    mapping = allocator.full_to_swa_index_mapping.tolist()
    for node, full, swa, _ in tree_nodes():
        freed = [slot for slot in full if slot // PAGE_SIZE in free_full]
        assert not freed, (f"{after}: tree node {node.id} holds full slots {freed}, but their pages are free: "
                           f"the next allocation hands them to another request")
        for full_slot, swa_slot in zip(full, swa or ()):
            assert swa_slot // PAGE_SIZE not in free_swa, (
                f"{after}: tree node {node.id} holds live SWA slot {swa_slot} (for full slot {full_slot}), "
                f"but its page {swa_slot // PAGE_SIZE} is free: the next allocation hands it to another request")
            assert mapping[full_slot] == swa_slot, (
                f"{after}: tree node {node.id} holds full slot {full_slot} with live SWA slot {swa_slot}, "
                f"but the allocator maps full slot {full_slot} to SWA slot {mapping[full_slot]}")
''', ("free_pages", "tree_nodes")),
    Check(("I4", "I2"), '''
def check_one_owner(after, requests):
    """No full KV slot has two owners: what a request owns (its row from cache_protected_len
    on) the tree does not hold too, or both free it (kvspec I4)."""
    in_tree = {slot for _, full, _, _ in tree_nodes() for slot in full}
    for req in requests:
        if (kv := kv_of(req)) is None:
            continue
        row, protected, _, allocated = kv
        both = sorted(in_tree.intersection(req_to_token_pool.req_to_token[row, protected:allocated].tolist()))
        assert not both, (f"{after}: request {req.rid} owns full slots {both} (its row from cache_protected_len "
                          f"{protected} on), and the tree holds them too: two owners, which both free them")
''', ("tree_nodes", "kv_of")),
    Check(("I11", "I14"), '''
def check_rows_are_allocated(after, requests):
    """A running request's KV stays allocated: no full slot of its row is on the free list
    (kvspec I11, I14)."""
    free = set(free_pages(allocator.full_attn_allocator))
    for req in requests:
        if (kv := kv_of(req)) is None:
            continue
        row, _, _, allocated = kv
        freed = [slot for slot in req_to_token_pool.req_to_token[row, :allocated].tolist() if slot // PAGE_SIZE in free]
        assert not freed, f"{after}: request {req.rid} still reads full slots {freed} of its row, but they are free"
''', ("free_pages", "kv_of")),
    Check(("I11",), '''
def check_swa_locks_held(after, requests):
    """A running request keeps the SWA lock of the node its prefix ends on until it gives it
    back (swa_prefix_lock_released): while it holds it, the node's SWA lock count is at least
    1, so the tree cannot evict the SWA KV the request still reads (kvspec I11)."""
    for req in requests:
        node = req.last_node  # the node, or from 0.5.20 its id in the tree core
        if isinstance(node, int):
            node = tree_cache.tree_core.node_by_id(node)
        if node is None or node.parent is None or getattr(req, "swa_prefix_lock_released", False):
            continue
        locks = node.component(ComponentType.SWA).lock_ref
        assert locks >= 1, (
            f"{after}: request {req.rid} holds the SWA lock of tree node {node.id}, where its prefix ends, but "
            f"the node's SWA lock count is {locks}: another request's release gave back a lock it did not hold, "
            f"and the tree may now evict SWA KV that {req.rid} still reads")
''', (), needs="pd_admit", trees=("unified",)),
    Check(("I9",), '''
def check_window_bound(after, requests):
    """A decoding request's SWA KV stays bounded: from its third decode step on it holds at
    most WINDOW_BOUND SWA slots from its cursor on (kvspec I9; WIN-5's bound, the window plus
    the tokens decoded between two decode evictions, in whole pages)."""
    for req in requests:
        if (kv := kv_of(req)) is None or req.decode_batch_idx < 3:
            continue
        _, protected, cursor, allocated = kv
        start = max(cursor, protected)
        held = -(-allocated // PAGE_SIZE) * PAGE_SIZE - start
        assert held <= WINDOW_BOUND, (
            f"{after}: request {req.rid} holds {held} SWA slots (positions {start}..{allocated - 1}) after "
            f"{req.decode_batch_idx} decode steps; with window {WINDOW} and decode eviction every "
            f"{EVICTION_INTERVAL} tokens it holds at most {WINDOW_BOUND}")
''', ("kv_of",)),
    Check(("I10",), '''
def check_checkpoint_matches(after, req, inserted):
    """What a checkpoint put into the tree can be matched again: the request's first `inserted`
    tokens match all of them (kvspec I10: the inserted leaf keeps a window of live SWA KV)."""
    key = RadixKey(req.origin_input_ids[:inserted])
    matched = tree_cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
    assert matched == inserted, (
        f"{after}: the checkpoint put {inserted} tokens of request {req.rid} into the tree, but a match of them "
        f"finds {matched}: the new leaf keeps fewer than a window ({WINDOW}) of live SWA tokens")
''', (), when="pd_admit", imports=("sglang.srt.mem_cache.radix_cache:RadixKey",
                                   "sglang.srt.mem_cache.base_prefix_cache:MatchPrefixParams")),
    Check(("I1", "I2", "I3"), '''
def check_drained(after):
    """Every page is free, once, when nothing holds KV: with every request released and the
    whole tree evicted, each pool's free list holds each of its pages once (kvspec I1 - I3)."""
    for name, pool in (("full", allocator.full_attn_allocator), ("SWA", allocator.swa_attn_allocator)):
        free = free_pages(pool)
        twice = sorted({page for page in free if free.count(page) > 1})
        assert not twice, f"{after}: {name} pages {twice} are on the free list twice: freed twice"
        missing = sorted(set(range(1, pool.size // PAGE_SIZE + 1)) - set(free))
        assert not missing, f"{after}: {name} pages {missing} are not free, though nothing holds KV any more"
''', ("free_pages",), when="drain"),
)
"""Each trace is checked by the properties of the clauses its header says it violates;
what needs the tree is left out on the Rust core, which cannot be walked."""
