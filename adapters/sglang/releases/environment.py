"""Where each SGLang release lives, how it gets there, and how a process switches to it:
SGLang's shelf (adapters/release_shelf.py).

A release is unpacked alone from its wheel into its own folder under
`KVSPEC_SGLANG_RELEASES` (default `~/.cache/kvspec/sglang-releases/<release>`), beside
kvspec's own environment: everything SGLang imports besides itself (torch, transformers,
...) comes from there, at the pins of `adapters/sglang/requirements.txt`, plus the few the
older releases import that 0.5.23 does not (`requirements.txt` here, installed into the
environment by `install`). Downloaded wheels are kept in `<folder>/wheels` and reused
(SGLang's are pure Python, a few MB each).

    python -m kvspec.adapters.sglang.releases install 0.5.18   # or: all
"""

from pathlib import Path

from ...release_shelf import OtherReleaseLoaded, ReleaseNotInstalled, Shelf

__all__ = ["RELEASES", "SHELF", "ACTIVE", "OtherReleaseLoaded", "ReleaseNotInstalled", "activate", "folder",
           "install", "install_command", "install_requirements", "installed", "missing_dependencies",
           "releases_home", "unpacked"]

RELEASES = ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
            "0.5.22", "0.5.23")
"""Every release from the first with the window-release hook (0.5.14) to the newest."""

ACTIVE = "KVSPEC_SGLANG_RELEASE"
"""Imported by the forkserver before it forks workers: the activated release's imports,
once. The forkserver does not yet have the parent's `sys.path` (release_shelf.py)."""

SHELF = Shelf("sglang", "SGLang", RELEASES, "KVSPEC_SGLANG_RELEASES", ACTIVE,
              (Path(__file__).parents[1] / "requirements.txt", Path(__file__).with_name("requirements.txt")),
              "kvspec.adapters.sglang.releases")
"""The requirements: 0.5.23's pins (adapters/sglang), and what the older releases import
beside them (here)."""

releases_home, folder, unpacked, installed = SHELF.home, SHELF.folder, SHELF.unpacked, SHELF.installed
install_command, missing_dependencies = SHELF.install_command, SHELF.missing_dependencies
install_requirements, install, activate = SHELF.install_requirements, SHELF.install, SHELF.activate
