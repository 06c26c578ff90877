"""The prefix tree of SGLang's UnifiedRadixCache as kvspec's plain NodeViews.

The Python tree core keeps its nodes as Python objects: the view walks them from the
root. The Rust core keeps them in native memory and offers no walk of its nodes (its
`node_by_id`/`root_node` raise NotImplementedError in 0.5.23), so for it the view is
None and the adapter does not declare the `tree` observable: the checks that read the
tree are reported skipped for it, never passed.
"""

from kvspec.spec.snapshot import Ledgers, NodeView


def slots(value) -> tuple[int, ...]:
    """A node's value: a tensor (read in one call), or the root's empty list."""
    return tuple(value.tolist() if hasattr(value, "tolist") else map(int, value))


def tree_view(cache, component_type) -> tuple[tuple[NodeView, ...], Ledgers]:
    """(nodes, ledgers) of the cache; nodes empty when the tree core cannot be walked."""
    ledgers = Ledgers(cache.full_evictable_size(), cache.full_protected_size(), cache.swa_evictable_size(),
                      cache.swa_protected_size())
    core = cache.tree_core
    if type(core).__module__.endswith("rust_tree_core.adapter"):
        return (), ledgers
    full, swa = component_type.FULL, component_type.SWA
    views = []
    stack = [(core.root_node, 0)]
    while stack:
        node, start = stack.pop()
        key = () if node.key is None else tuple(node.key.raw_token_ids())
        full_data, swa_data = node.component(full), node.component(swa)
        views.append(NodeView(
            node.id, None if node.parent is None else node.parent.id, start, key,
            () if full_data.value is None else slots(full_data.value),
            None if swa_data.value is None else slots(swa_data.value),
            full_data.lock_ref, swa_data.lock_ref))
        stack.extend((child, start + len(key)) for child in node.children.values())
    return tuple(sorted(views, key=lambda v: v.node_id)), ledgers
