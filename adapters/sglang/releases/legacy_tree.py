"""The legacy `SWARadixCache` (the default hybrid-SWA tree up to 0.5.15) as kvspec's
NodeViews. Lines are of the 0.5.14 wheel's `sglang/srt/mem_cache/swa_radix_cache.py`
(0.5.15's has the same node layout).

A `TreeNode` (`:57-96`) holds its full slots in `value`, an `swa_tombstone` flag and the
two lock counts `full_lock_ref` / `swa_lock_ref`; it keeps no SWA slots of its own: a
live node's SWA KV is the allocator's full->SWA mapping of its full slots (what
`free_swa(x.value)` frees when eviction tombstones it, `:621`). The root
(`reset`, `:373-384`) has `key = value = []` and both lock counts 1; the other nodes' keys
are `RadixKey`s. The tree keeps its own ledgers (`full_evictable_size()` ... `swa_protected_size()`, `:823-839`).
"""

from kvspec.spec.snapshot import Ledgers, NodeView


def legacy_tree_view(cache, allocator) -> tuple[tuple[NodeView, ...], Ledgers]:
    ledgers = Ledgers(cache.full_evictable_size(), cache.full_protected_size(), cache.swa_evictable_size(),
                      cache.swa_protected_size())
    mapping = allocator.full_to_swa_index_mapping
    views = []
    stack = [(cache.root_node, 0)]
    while stack:
        node, start = stack.pop()
        root = node is cache.root_node
        key = () if root else tuple(node.key.raw_token_ids())
        full = () if root else tuple(node.value.tolist())
        swa = None if node.swa_tombstone else () if root else tuple(mapping[node.value].tolist())
        views.append(NodeView(node.id, None if root else node.parent.id, start, key, full, swa,
                              node.full_lock_ref, node.swa_lock_ref))
        stack.extend((child, start + len(key)) for child in node.children.values())
    return tuple(sorted(views, key=lambda v: v.node_id)), ledgers
