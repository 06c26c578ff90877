"""The `sglang@` family: every SGLang release from 0.5.14 to 0.5.23, each tree it has,
the SWA settings it reads, alone and in combination. A member is
`sglang@<release>[-<tree>][+<knob>...]`:

  sglang@0.5.18                 the release as it ships: its default tree, default knobs
  sglang@0.5.19-rust            another tree of that release
  sglang@0.5.17+chunk-release   a knob turned from its default
  sglang@0.5.20+early-swa-unlock+need-sort+evict-lfu   several at once

Trees: `legacy` (SWARadixCache, the default of 0.5.14 - 0.5.15; its file stays until
0.5.20, but from 0.5.16 nothing in SGLang builds it, `mem_cache/registry.py`), `python`
(UnifiedRadixCache with its Python tree, the default 0.5.16 - 0.5.20), `rust` (its Rust
tree core, shipped 0.5.19, the default from 0.5.21), `chunk` (the cache SGLang builds with
`--disable-radix-cache`: `SWAChunkCache` to 0.5.21, the unified tree built disabled from
0.5.22; chunk_cache.py). Knobs (KNOBS: SGLang environment
variables set for each engine, or what SGLang's server arguments pass its allocator and
tree): `chunk-release` / `no-chunk-release` (SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS,
off up to 0.5.17, on from 0.5.18; the unified tree reads it), `drop-margin`
(SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN, read only by 0.5.14), `early-swa-unlock`
(SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW, every release, off by default),
`swa-compact` and `split-leaf` (SGLANG_OPT_SWA_RADIX_CACHE_COMPACT,
SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT: the legacy tree's, off by default), `need-sort` (the
allocator's need_sort, on for SGLang's PD servers), `evict-lfu` (radix_eviction_policy
lfu: the unified tree's order of evicting full leaves). The decode eviction interval is a
parameter of each run (`I`), not a member. docs/engines/sglang-releases.md has the
evidence for every fact here.

Each tree's members are its knobs turned one at a time and in combination (combinations():
every pair of knobs meets, each in both settings). Each member declares the policy version
its release implements (spec/window.py): retention `W + P` in 0.5.14 (`design-margin`;
`drop-margin` with that knob), `max(W, P)` in 0.5.15 - 0.5.22 (`max-window-page`),
`ceil_page(max(W, P))` in 0.5.23; `no-prefix-sharing` (`W`, nothing shared) on the `chunk`
tree; and whether its chunked prefill releases (chunk_release).
"""

from dataclasses import dataclass
from functools import partial

from kvspec.conformance.harness.built_for import BuiltFor
from kvspec.conformance.harness.declarations import Capability
from kvspec.conformance.harness.families import Family, PreparedMembers

from .chunk_cache import TREE as CHUNK
from .chunk_cache import chunk_engine
from .environment import RELEASES, activate, install_command

KNOBS = {
    "chunk-release": {"environment": {"SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS": "1"}},
    "no-chunk-release": {"environment": {"SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS": "0"}},
    "drop-margin": {"environment": {"SGLANG_OPT_SWA_EVICT_DROP_PAGE_MARGIN": "1"}},
    "early-swa-unlock": {"environment": {"SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW": "1"}},
    "swa-compact": {"environment": {"SGLANG_OPT_SWA_RADIX_CACHE_COMPACT": "1"}},
    "split-leaf": {"environment": {"SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT": "1"}},
    "need-sort": {"need_sort": True},
    "evict-lfu": {"eviction_policy": "lfu"},
}
"""What each knob sets: SGLang environment variables, or the engine's keyword arguments
(adapters/sglang/engine.py: the allocator's need_sort, the tree's eviction policy)."""
GENERATIONS = {
    # first release of an API generation: the module of its engine shim (releases/api_*.py)
    "0.5.14": "api_0_5_14", "0.5.16": "api_0_5_16", "0.5.17": "api_0_5_17", "0.5.19": "api_0_5_19",
    "0.5.21": "api_0_5_21", "0.5.22": None,  # None: adapters/sglang/engine.py itself
}


def key(release: str) -> tuple[int, ...]:
    return tuple(int(part.removeprefix("post")) for part in release.split("."))


@dataclass(frozen=True)
class Release:
    release: str

    @property
    def generation(self) -> str:
        return max((first for first in GENERATIONS if key(first) <= key(self.release)), key=key)

    @property
    def trees(self) -> tuple[str, ...]:
        k = key(self.release)
        return tuple(tree for tree, present in (("legacy", k < (0, 5, 16)), ("python", True),
                                                ("rust", k >= (0, 5, 19)), (CHUNK, True)) if present)

    @property
    def default_tree(self) -> str:
        k = key(self.release)
        return "legacy" if k < (0, 5, 16) else "python" if k < (0, 5, 21) else "rust"

    @property
    def chunk_release_default(self) -> bool:
        return key(self.release) >= (0, 5, 18)

    @property
    def disabled_tree(self) -> bool:
        """Whether `--disable-radix-cache` builds the unified tree disabled (0.5.22 on)
        rather than `SWAChunkCache` (chunk_cache.py)."""
        return key(self.release) >= (0, 5, 22)

    def knobs(self, tree: str) -> tuple[str, ...]:
        """The knobs a member of this tree may turn from their default, in the order a
        member's name gives them. The `chunk` tree reads the allocator's need_sort only:
        its extend and decode releases read no flag but the eviction interval (0.5.18
        `managers/schedule_batch.py:3370-3384`, `mem_cache/common.py:75-78`), the early
        unlock needs a tree lock it does not take (`hasattr(tree_cache, "dec_swa_lock_only")`,
        `:3328-3331`; from 0.5.22 the disabled tree's receipt holds no SWA lock,
        0.5.22 `unified_radix_cache.py:996-998, 1032-1041`), and it evicts nothing."""
        if tree == CHUNK:
            return ("need-sort",)
        knobs = ["early-swa-unlock"]
        if tree != "legacy":
            knobs.insert(0, "no-chunk-release" if self.chunk_release_default else "chunk-release")
        if self.release == "0.5.14":
            knobs.append("drop-margin")
        if tree == "legacy":
            knobs += ["swa-compact", "split-leaf"]
        knobs.append("need-sort")
        if tree != "legacy":
            knobs.append("evict-lfu")
        return tuple(knobs)

    def combinations(self, tree: str) -> tuple[tuple[str, ...], ...]:
        """The knob settings of this tree's members: the defaults, each knob alone, and a
        covering array of strength 2 (every knob but one, for each one; both, for two
        knobs), so that every two knobs meet in all four settings."""
        knobs = self.knobs(tree)
        alone = [(knob,) for knob in knobs]
        together = [knobs] if len(knobs) == 2 else \
            [tuple(knob for knob in knobs if knob != left_out) for left_out in knobs] if len(knobs) > 2 else []
        return ((), *alone, *together)

    def chunk_release(self, tree: str, knobs: tuple[str, ...]) -> bool:
        """Whether a chunked prefill releases its out-of-window SWA (the spec policy's
        chunk_release, WIN-4): always on the `chunk` tree (before each extend, with no flag:
        chunk_cache.py), never on the legacy tree, else the flag's value."""
        if tree == CHUNK:
            return True
        if tree == "legacy" or "no-chunk-release" in knobs:
            return False
        return self.chunk_release_default or "chunk-release" in knobs

    def policy_version(self, knobs: tuple[str, ...], tree: str | None = None) -> str:
        if tree == CHUNK:  # retention W, no prefix shared (chunk_cache.py)
            return "no-prefix-sharing"
        if self.release == "0.5.14":
            return "drop-margin" if "drop-margin" in knobs else "design-margin"
        return "sglang-0.5.23" if self.release == "0.5.23" else "max-window-page"


def engine_class(release: Release, tree: str | None = None):
    if tree == CHUNK:
        return chunk_engine(engine_class(release), release.disabled_tree)
    module = GENERATIONS[release.generation]
    if module is None:
        from ..engine import SglangEngine
        return SglangEngine
    from importlib import import_module
    # each shim names its engine after its generation: api_0_5_14 defines Engine_0_5_14
    return getattr(import_module(f"{__package__}.{module}"), "Engine" + module.removeprefix("api"))


def shim_modules(release: Release) -> tuple[str, ...]:
    """The release's engine shim, for the forkserver to import before SGLang: a shim may
    register what must run first (runtime.BEFORE_IMPORT)."""
    module = GENERATIONS[release.generation]
    return () if module is None else (f"{__package__}.{module}",)


def make_engine(config, release: Release, tree: str, knobs: tuple[str, ...]):
    activate(release.release)
    settings = {"environment": {}}
    for knob in knobs:
        for name, value in KNOBS[knob].items():
            settings[name] = {**settings[name], **value} if name == "environment" else value
    return engine_class(release, tree)(config, tree=tree, release=release.release,
                                       policy_version=release.policy_version(knobs, tree), **settings)


def make_allocator(size_full: int, size_swa: int, page_size: int, release: str):
    activate(release)
    from ..allocator import SglangAllocatorAdapter
    from ..runtime import sglang
    from .api_0_5_21 import use_cpu_kernels
    use_cpu_kernels(sglang())  # a no-op from 0.5.22
    adapter = SglangAllocatorAdapter(size_full, size_swa, page_size)
    if key(release) < (0, 5, 20):
        from .api_0_5_19 import add_free_page_census
        add_free_page_census(adapter.allocator)  # what the view reads of each pool
    return adapter


def pd_capabilities(release: Release) -> tuple[Capability, ...]:
    """The PD decode side's pre-allocation is driven from 0.5.19, whose `_swa_tail_len`
    keeps max(W, P) + 1 tokens before the insert boundary (0.5.19
    `disaggregation/decode.py:456-477`), as every later release does; the releases before
    keep W (0.5.18 `:387-398`) and have other budget methods. Each claims
    pd_checkpoint_keeps_window, unsteered: the table's runs draw PD admissions at every
    window and show where the admission's leaf is short (findings.py: pd-tail-not-rounded on
    0.5.23, checkpoint-short-rematch's PD form before it) rather than hiding it. The gating
    adapters `sglang` and `sglang-python` do not claim it (known divergence SGL-11)."""
    pd = key(release.release) >= (0, 5, 19)
    return (Capability.PD_DECODE, Capability.PD_CHECKPOINT_KEEPS_WINDOW) * pd


def allocator_capabilities(release: Release) -> tuple[Capability, ...]:
    """What the release's hybrid allocator offers beyond allocation, `free` and `free_swa`:
    free_full from 0.5.19 (0.5.19 `mem_cache/allocator/swa.py:360`), the segment frees from
    0.5.20 (0.5.20 `:439, 509, 517`). Free groups are claimed from 0.5.20 only: 0.5.19 has
    them (`:374-389`) but keeps a group's frees in one list of the hybrid allocator, which
    the view does not read as pending (it reads each pool's), so a check would blame
    0.5.19 for the view's blindness (a leak in 3 steps, measured)."""
    k = key(release.release)
    return ((Capability.FULL_FREES,) if k >= (0, 5, 19) else ()) + \
        ((Capability.FREE_GROUPS, Capability.SEGMENT_FREES) if k >= (0, 5, 20) else ())


def capabilities(release: Release, tree: str) -> tuple[Capability, ...]:
    """What a member offers. The `chunk` tree shares no prefix, and its PD decode (SGLang's
    decode server without a decode-side radix cache, 0.5.18 `mem_cache/chunk_cache.py:37-41`)
    is another path than the one pd_decode.py drives: it declares neither, so those runs are
    reported skipped. Only 0.5.23 claims short_leaf_checkpoints: 0.5.14 - 0.5.22 match
    again after a checkpoint's insert and trust the match (findings.py, checkpoint-short-rematch,
    recorded), so where their policy leaves a short leaf their runs steer clear of it and go
    on checking the rest; the bug's vectors and the table's bisection still replay it."""
    chunk = tree == CHUNK
    return (Capability.PAGE_SIZE_1, Capability.PAGE_SIZE_GT_1, Capability.SWA_TAIL) \
        + (() if chunk else (Capability.PREFIX_SHARING,)) \
        + (Capability.CHUNKED_PREFILL, Capability.BATCHED_PREFILL, Capability.BATCHED_FINISH, Capability.FLUSH,
           Capability.WAITING_MATCHES) \
        + allocator_capabilities(release) \
        + (pd_capabilities(release) if not chunk else ()) \
        + ((Capability.SHORT_LEAF_CHECKPOINTS,) if release.release == "0.5.23" else ())


def member(release: Release, tree: str, knobs: tuple[str, ...]) -> type:
    name = (f"sglang@{release.release}" + ("" if tree == release.default_tree else f"-{tree}")
            + "".join(f"+{knob}" for knob in knobs))
    attributes = dict(
        __doc__=f"SGLang {release.release}, tree {tree}" + (f", knobs {', '.join(knobs)}" if knobs else ""),
        name=name, release=release.release, tree=tree, knobs=knobs,
        policy_version=release.policy_version(knobs, tree), chunk_release=release.chunk_release(tree, knobs),
        capabilities=capabilities(release, tree),
        # the Rust core cannot be walked (tree_view.py); the chunk cache's tree is what it holds,
        # nothing (chunk_cache.py), read off the cache as the reference's tree-less engine shows it
        observables=("free_sets", "mapping", "rows") + (() if tree == "rust" else ("tree",)),
        preload=shim_modules(release) + ("kvspec.adapters.sglang.releases.preload",),
        built_for=BuiltFor("sglang", (release.release,), "SGLang"),  # its own faults are the adapter's
        make_engine=staticmethod(partial(make_engine, release=release, tree=tree, knobs=knobs)))
    if not knobs and tree == release.default_tree:  # the allocator is the same whatever the tree and knobs
        attributes["make_allocator"] = staticmethod(partial(make_allocator, release=release.release))
    return type(name.replace("@", "_").replace(".", "_").replace("-", "_").replace("+", "_"), (), attributes)


def members() -> dict[str, type]:
    found = {}
    for release in map(Release, RELEASES):
        for tree in release.trees:
            for knobs in release.combinations(tree):
                adapter = member(release, tree, knobs)
                found[adapter.name.removeprefix("sglang@")] = adapter
    return found


MEMBERS = PreparedMembers(members(), lambda adapter: activate(adapter.release))
"""The family's members; looking one up makes its release this process's SGLang
(environment.activate) before the harness starts its forkserver, whose preload then
activates the same release (KVSPEC_SGLANG_RELEASE), so every worker imports it too."""


def placement(adapter) -> tuple[str, str]:
    """A member's release and its line for `kvspec bisect`: its tree and the knobs it turns
    (`python`, `rust+early-swa-unlock`), what stays the same from release to release."""
    return adapter.release, adapter.tree + "".join(f"+{knob}" for knob in adapter.knobs)


FAMILY = Family(prefix="sglang@", implementation="sglang", shown_as="SGLang's releases",
                members_at="kvspec.adapters.sglang.releases.catalog:MEMBERS", seeded=False,
                install=install_command("RELEASE"),
                versions_at="kvspec.adapters.sglang.releases.environment:RELEASES",
                placed_at="kvspec.adapters.sglang.releases.catalog:placement")
