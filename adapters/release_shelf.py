"""A shelf of an engine's releases, each in its own folder, one of which a process imports.

A release family (`sglang@`, `vllm@`) checks every release of an engine from one kvspec
environment. Each release is unpacked alone from its wheel (no dependencies) into its own
folder under the shelf's home; everything it imports besides itself comes from kvspec's
environment, at the pins of the shelf's requirements files. Only the files a release's
pure-Python paths can read are unpacked (`keeps`): vLLM's wheels are 230-490 MB of
compiled kernels that the KV cache manager never loads, its Python 16 - 68 MB.
Downloaded wheels are deleted once unpacked unless the shelf keeps them (`keep_wheels`);
an unpacked folder is never downloaded again.

One process imports one release. `activate(release)` puts its folder first on `sys.path`
before anything imports the engine, and names it in the shelf's variable for the
processes this one starts: kvspec's forkserver preloads its imports before it takes the
parent's `sys.path` (Python 3.11), so a family's preload module activates the release
the variable names first.
"""

import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kvspec.conformance.harness.families import UnavailableMember


class ReleaseNotInstalled(UnavailableMember):
    """The named release has no folder yet, or what it imports is not in this environment."""


class OtherReleaseLoaded(UnavailableMember):
    """This process already imported another release of the engine."""


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def every_file(name: str) -> bool:
    return True


@dataclass(frozen=True)
class Shelf:
    distribution: str
    """The engine's name on PyPI, and the package it imports ("sglang", "vllm")."""
    shown_as: str
    releases: tuple[str, ...]
    home_variable: str
    """The environment variable naming the shelf's home (else ~/.cache/kvspec/<distribution>-releases)."""
    active_variable: str
    """The environment variable naming the release this process activated, for its forkserver."""
    requirements: tuple[Path, ...]
    """What every release imports besides itself; installed --no-deps into kvspec's environment."""
    command: str
    """The module whose `install` command installs releases ("kvspec.adapters.sglang.releases")."""
    keeps: Callable[[str], bool] = every_file
    """Which files of a wheel are unpacked (by their path in the wheel)."""
    keep_wheels: bool = True

    def home(self) -> Path:
        default = Path.home() / ".cache" / "kvspec" / f"{self.distribution}-releases"
        return Path(os.environ.get(self.home_variable, default))

    def folder(self, release: str) -> Path:
        return self.home() / release

    def unpacked(self, release: str) -> bool:
        return (self.folder(release) / self.distribution / "version.py").is_file()

    def installed(self, release: str) -> bool:
        """The release can run here: its folder, and what it imports, in this environment."""
        return self.unpacked(release) and not self.missing_dependencies()

    def install_command(self, release: str) -> str:
        return f"python -m {self.command} install {release}"

    def missing_dependencies(self) -> list[str]:
        """The pinned distributions of the requirements absent from this environment (the engine
        aside: a release's folder brings it). A folder without them fails at import, deep inside."""
        missing = []
        for requirements in self.requirements:
            for line in requirements.read_text().splitlines():
                name = re.match(r"\s*([A-Za-z0-9_.\-]+)==", line)
                if name and name[1] != self.distribution:
                    try:
                        metadata.distribution(name[1])
                    except metadata.PackageNotFoundError:
                        missing.append(name[1])
        return missing

    def install_requirements(self) -> None:
        for requirements in self.requirements:
            subprocess.run([*PIP, "install", "--no-deps", "-r", str(requirements)], check=True)

    def install(self, release: str) -> Path:
        """Unpack one release (the wheel's kept files, no dependencies), reusing a downloaded wheel."""
        if release not in self.releases:
            raise SystemExit(f"unknown {self.shown_as} release {release!r}; kvspec covers {', '.join(self.releases)}")
        if self.unpacked(release):
            return self.folder(release)
        wheels = self.home() / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        wheel = self.wheel(wheels, release)
        if wheel is None:
            subprocess.run([*PIP, "download", "--no-deps", "--dest", str(wheels), f"{self.distribution}=={release}"],
                           check=True)
            wheel = self.wheel(wheels, release)
        target = self.folder(release).with_suffix(".partial")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target, [name for name in archive.namelist() if self.keeps(name)])
        target.rename(self.folder(release))  # a folder is complete or absent
        if not self.keep_wheels:
            wheel.unlink()
        return self.folder(release)

    def wheel(self, wheels: Path, release: str) -> Path | None:
        return next(wheels.glob(f"{self.distribution}-{release}-*.whl"), None)

    def activate(self, release: str) -> None:
        """Make `import <engine>` import `release` in this process (and its forkserver)."""
        if not self.unpacked(release):
            raise ReleaseNotInstalled(f"{self.shown_as} {release} is not installed under {self.home()}; install it "
                                      f"with `{self.install_command(release)}`")
        if missing := self.missing_dependencies():
            raise ReleaseNotInstalled(f"{self.shown_as} {release} is installed under {self.home()}, but what it "
                                      f"imports is not in this environment ({', '.join(missing[:5])}"
                                      f"{', ...' if len(missing) > 5 else ''}); install it with "
                                      f"`{self.install_command(release)}`")
        path = str(self.folder(release))
        loaded = sys.modules.get(self.distribution)
        if loaded is not None and not str(Path(loaded.__file__)).startswith(path):
            raise OtherReleaseLoaded(f"this process already imported {self.shown_as} from "
                                     f"{Path(loaded.__file__).parent}; one process drives one release (run each "
                                     f"release in its own `kvspec check`)")
        if path not in sys.path:
            sys.path.insert(0, path)
        os.environ[self.active_variable] = release
