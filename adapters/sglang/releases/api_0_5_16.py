"""SGLang 0.5.16: as 0.5.17 - 0.5.18 (api_0_5_17.py) but for what follows. Lines are of
the 0.5.16 wheel's `sglang/srt/`.

* One tree class, no separate core: `UnifiedRadixCache` is its own tree, its root is
  `cache.root_node` (`mem_cache/unified_radix_cache.py:460`), its nodes hold the node ids
  (`UnifiedTreeNode`, `:82-107`) the requests hold (`req.last_node`). No tree core to choose.
* Lock: `req.swa_uuid_for_lock = inc_lock_ref(node).swa_uuid_for_lock`, no `skip_lock_node_ids`
  (`managers/schedule_policy.py:786-789`); no `_dec_req_lock`: the finish releases with
  `dec_lock_ref(req.last_node, DecLockRefParams(swa_uuid_for_lock=...))` (`:778-782`).
* `ComponentType` is in `mem_cache/unified_cache_components` (runtime.SYMBOLS has it).
"""

import importlib

from ..tree_view import tree_view
from .api_0_5_17 import Engine_0_5_17


class OwnCore:
    """0.5.16's cache, seen as the later cache-with-a-core that tree_view walks."""

    def __init__(self, cache):
        self.cache = self.tree_core = cache

    def __getattr__(self, name):
        return getattr(self.cache, name)


class Engine_0_5_16(Engine_0_5_17):
    """SGLang 0.5.16."""

    def lock(self, req) -> None:
        req.swa_uuid_for_lock = self.cache.inc_lock_ref(req.last_node).swa_uuid_for_lock

    def unlock(self, req) -> None:
        params = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache").DecLockRefParams
        self.cache.dec_lock_ref(req.last_node, params(swa_uuid_for_lock=req.swa_uuid_for_lock))

    def lock_node(self, req) -> int | None:
        return None if req.last_node is None else req.last_node.id

    def walk_tree(self):
        return tree_view(OwnCore(self.cache), self.s.ComponentType)
