"""Real SGLang 0.5.23 behind kvspec's adapter protocol (see README, "Checking real SGLang").

`SGLANG` drives SGLang's default Rust tree core, `SGLANG_PYTHON` its Python tree core;
both drive the same real allocator, request-to-token pool, requests and scheduler
allocation paths. Nothing of SGLang is imported until an adapter builds something.
"""

from .allocator import SglangAllocatorAdapter

CAPABILITIES = ("page_size_1", "page_size_gt_1", "swa_tail", "prefix_sharing", "free_groups", "chunked_prefill",
                "pd_decode")


class SGLANG:
    name = "sglang"
    policy_version = "sglang-0.5.23"
    capabilities = CAPABILITIES
    make_allocator = SglangAllocatorAdapter
