"""vLLM 0.23.0 - 0.25.1: a prefix hit without its junction.

`get_computed_blocks` returns the hit's blocks and tokens only; 0.26.0 adds the junction
the scheduler keeps where a group cached more than the hit (`shared_prefix_boundary`).
Everything else as 0.26.0's shim (api_0_26.py), whose retention variable 0.23.0 does not
read: it has dense retention only.
"""

from .api_0_26 import Engine_0_26


class Engine_0_23(Engine_0_26):
    def prefix_hit(self, req) -> tuple[object, int]:
        return self.manager.get_computed_blocks(req)
