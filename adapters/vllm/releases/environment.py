"""Where each vLLM release lives, how it gets there, and how a process switches to it:
vLLM's shelf (adapters/release_shelf.py).

A release is unpacked from its wheel into its own folder under `KVSPEC_VLLM_RELEASES`
(default `~/.cache/kvspec/vllm-releases/<release>`). Only vLLM's Python and the data files
its imports read (`.json`, `.jinja`) are kept, 16 - 68 MB a release with the bytecode its
imports write (all 41: 1.3 GB); the compiled kernels (`.so`, 200-450 MB a wheel) and their headers are
never unpacked, since the KV cache manager is pure Python and loads none of them. The
wheel is deleted once unpacked. Everything vLLM imports besides itself comes from kvspec's
environment, at the pins of `adapters/vllm/requirements.txt`, plus what older releases
import beside them (`requirements.txt` here).

    python -m kvspec.adapters.vllm.releases install 0.20.1   # or: all
"""

from pathlib import Path, PurePosixPath

from ...release_shelf import OtherReleaseLoaded, ReleaseNotInstalled, Shelf

__all__ = ["RELEASES", "SHELF", "ACTIVE", "activate", "OtherReleaseLoaded", "ReleaseNotInstalled"]

RELEASES = ("0.9.2", "0.10.0", "0.10.1", "0.10.1.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0",
            "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0",
            "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
            "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
            "0.34.0")
"""Every release with the hybrid KV cache coordinator and a Mamba manager (0.9.2) to the newest."""

ACTIVE = "KVSPEC_VLLM_RELEASE"
"""Read by the forkserver's preload (releases/preload.py): the release to import."""

KEPT = {".py", ".json", ".jinja", ".typed"}


def kept(name: str) -> bool:
    """A file of the wheel worth unpacking: vLLM's Python and what its imports read, and the
    distribution's metadata (what `importlib.metadata` reads the installed release from)."""
    path = PurePosixPath(name)
    return path.parts[0].endswith(".dist-info") or path.suffix in KEPT


SHELF = Shelf("vllm", "vLLM", RELEASES, "KVSPEC_VLLM_RELEASES", ACTIVE,
              (Path(__file__).parents[1] / "requirements.txt", Path(__file__).with_name("requirements.txt")),
              "kvspec.adapters.vllm.releases", keeps=kept, keep_wheels=False)


def activate(release: str) -> None:
    """`SHELF.activate`, and what an old release needs of today's environment to import:
    0.9.2 registers a transformers configuration (`aimv2`, for Ovis) that the transformers of
    kvspec's environment already ships, and transformers refuses a second registration. That
    model code is never used on the KV cache manager's paths, so in a 0.9.2 process (one
    release per process) a registration of a taken name replaces it, as `exist_ok` asks."""
    SHELF.activate(release)
    if release == "0.9.2":
        from transformers import AutoConfig

        register = AutoConfig.register
        AutoConfig.register = staticmethod(lambda model_type, config, exist_ok=False:
                                           register(model_type, config, exist_ok=True))
