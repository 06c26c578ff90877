"""The `vllm@` family: every vLLM release with the hybrid KV cache coordinator, each with
the prefix-cache retentions it has, from 0.9.2, the first. A member
is `vllm@<release>[+dense|+retention-0]`:

  vllm@0.31.0              the release as its engine runs it: from 0.29.0 the sliding-window
                           group caches only the blocks a hit at a prompt's end can use
                           (prefix-cache retention 0, policy vllm-0.33); before, every whole
                           block (dense retention, vllm-0.33-dense)
  vllm@0.31.0+dense        dense retention where the engine's default is 0
  vllm@0.26.0+retention-0  retention 0 where the release has it and dense is the default

The engine tier only, with kvspec's vllm adapter (adapters/vllm/engine.py) for the releases
whose manager it drives as it is, and a shim per older API generation (api_*.py, GENERATIONS).
docs/engines/vllm-releases.md has the evidence for every fact here.
"""

from functools import partial

from kvspec.conformance.harness.built_for import BuiltFor
from kvspec.conformance.harness.declarations import Capability
from kvspec.conformance.harness.families import Family, PreparedMembers
from kvspec.spec.window import VLLM_0_33, VLLM_0_33_DENSE

from .. import CAPABILITIES
from .environment import RELEASES, SHELF, activate

GENERATIONS = {
    # first release of an API generation: the module of its engine shim (releases/api_*.py)
    "0.9.2": "api_0_9", "0.10.0": "api_0_10_0", "0.10.1": "api_0_10_1", "0.10.2": "api_0_10", "0.11.0": "api_0_11",
    "0.12.0": "api_0_12", "0.13.0": "api_0_13", "0.17.0": "api_0_17",
    "0.20.0": "api_0_20", "0.23.0": "api_0_23", "0.26.0": "api_0_26", "0.29.0": "api_0_29",
    "0.31.0": None,  # None: adapters/vllm/engine.py itself
}
STATE = (Capability.RECURRENT_STATE, Capability.PAGED_RECURRENT_STATE, Capability.RELEASES_STATE_AT_STOP)
"""What a Mamba group in align mode needs; driven from 0.31.0 (the scheduler's aligned split,
which the adapter calls, reads other attributes before it)."""
PD = (Capability.PD_DECODE, Capability.PD_CHECKPOINT_KEEPS_WINDOW)
"""A KV connector's loaded tokens (`allocate_slots(num_external_computed_tokens=...)`, from
0.14.0) cached once the load has finished, for every group: from 0.18.0 (0.14.0 - 0.17.1's
scheduler counts the loaded tokens from a single group's table, `(block_ids,) = ...`)."""


def capabilities(release: str) -> tuple[Capability, ...]:
    """What a member declares: the vllm adapter's, less recurrent state before 0.31.0 and PD
    decode before 0.18.0."""
    return tuple(c for c in CAPABILITIES if (key(release) >= (0, 31, 0) or c not in STATE)
                 and (key(release) >= (0, 18, 0) or c not in PD))


def retentions(release: str) -> dict[str, int | None]:
    """A member's suffix -> its prefix-cache retention (None: dense), the engine's default
    first: 0 from 0.29.0 (`KVCacheConfig.prefix_cache_retention_interval`, CacheConfig's
    default 0), dense before; 0.24.0 - 0.28.0 read 0 from the environment (api_0_26.py);
    before 0.24.0 every whole block is cached, the only retention."""
    if key(release) >= (0, 29, 0):
        return {"": 0, "+dense": None}
    return {"": None, "+retention-0": 0} if key(release) >= (0, 24, 0) else {"": None}


def key(release: str) -> tuple[int, ...]:
    return tuple(map(int, release.split(".")))


def generation(release: str) -> str | None:
    """The first release of `release`'s API generation, or None where kvspec has no shim for it."""
    return max((first for first in GENERATIONS if key(first) <= key(release)), key=key, default=None)


def engine_class(release: str):
    module = GENERATIONS[generation(release)]
    if module is None:
        from ..engine import VllmEngine
        return VllmEngine
    from importlib import import_module
    # each shim names its engine after its generation: api_0_20 defines Engine_0_20
    return getattr(import_module(f"{__package__}.{module}"), "Engine" + module.removeprefix("api"))


def make_engine(config, release: str, retention: int | None):
    activate(release)
    return engine_class(release)(config, retention=retention)


def uncached_first(release: str) -> tuple[str, ...]:
    """[BLOCK-10] The groups whose releases queue the blocks they free without a key at the
    free queue's head: every group from 0.24.0 (`BlockPool.free_blocks` splits them), the
    sliding-window one in 0.23.0 (its `SlidingWindowManager.free` and window release
    prepend them, `single_type_kv_cache_manager.py:497-501, 751-764`; the full group's
    inherited `free` appends every block), none before (`free_blocks` appends)."""
    if key(release) >= (0, 24, 0):
        return ("full", "swa")
    return ("swa",) if key(release) >= (0, 23, 0) else ()


def member(release: str, suffix: str) -> type:
    name = f"vllm@{release}{suffix}"
    retention = retentions(release)[suffix]
    return type(name.replace("@", "_").replace(".", "_").replace("+", "_"), (), dict(
        __doc__=f"vLLM {release}, prefix-cache retention {retention}", name=name, release=release,
        retention=retention, policy_version=VLLM_0_33_DENSE if retention is None else VLLM_0_33,
        null_block_counted=key(release) >= (0, 33, 0),  # BLOCK-3: 0.33.0 skips the null block in free_blocks
        uncached_first=uncached_first(release),
        memory_model="block-pool",
        # BLOCK-8: the KV events name their group from 0.20.0 (api_0_17.py)
        observables=("rows", "block_pool") + (("kv_events",) if key(release) >= (0, 20, 0) else ()),
        capabilities=capabilities(release),
        preload=("kvspec.adapters.vllm.releases.preload",),
        built_for=BuiltFor("vllm", (release,), "vLLM"),  # its own faults are the adapter's (built_for.adapter_fault)
        make_engine=staticmethod(partial(make_engine, release=release, retention=retention))))


def members() -> dict[str, type]:
    return {adapter.name.removeprefix("vllm@"): adapter for release in RELEASES if generation(release)
            for adapter in (member(release, suffix) for suffix in retentions(release))}


DRIVEN = tuple(release for release in RELEASES if generation(release))
"""The releases kvspec drives (with a member each), oldest first."""
MEMBERS = PreparedMembers(members(), lambda adapter: activate(adapter.release))
"""Looking a member up makes its release this process's vLLM (release_shelf.py) before the
harness starts its forkserver, whose preload activates the same release."""


def placement(adapter) -> tuple[str, str]:
    """A member's release and its line for `kvspec bisect`: its retention."""
    return adapter.release, "dense" if adapter.retention is None else "retention-0"


FAMILY = Family(prefix="vllm@", implementation="vllm", shown_as="vLLM's releases",
                members_at="kvspec.adapters.vllm.releases.catalog:MEMBERS", seeded=False,
                install=SHELF.install_command("RELEASE"),
                versions_at="kvspec.adapters.vllm.releases.catalog:DRIVEN",
                placed_at="kvspec.adapters.vllm.releases.catalog:placement")
