"""Where each SGLang release lives, how it gets there, and how a process switches to it.

A release is installed alone (`pip install --no-deps --target`) into its own folder
under `KVSPEC_SGLANG_RELEASES` (default `~/.cache/kvspec/sglang-releases/<release>`),
beside kvspec's own environment: everything SGLang imports besides itself (torch,
transformers, ...) comes from there, at the pins of `adapters/sglang/requirements.txt`,
plus the few the older releases import that 0.5.23 does not (`requirements.txt` here,
installed into the environment by `install`).
Downloaded wheels are kept in `<folder>/wheels` and reused.

One process imports one SGLang. `activate(release)` puts the release's folder first on
`sys.path` before anything imports `sglang`, and names it in `KVSPEC_SGLANG_RELEASE` for
the processes this one starts: kvspec's forkserver preloads its imports before it takes
the parent's `sys.path` (Python 3.11), so its preload (releases/preload.py) activates the
release the variable names first.

    python -m kvspec.adapters.sglang.releases install 0.5.18   # or: all
"""

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from kvspec.conformance.harness.families import UnavailableMember

RELEASES = ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
            "0.5.22", "0.5.23")
"""Every release from the first with the window-release hook (0.5.14) to the newest."""


class ReleaseNotInstalled(UnavailableMember):
    """The named release has no folder yet, or what it imports is not in this environment."""


class OtherReleaseLoaded(UnavailableMember):
    """This process already imported another SGLang."""


def releases_home() -> Path:
    return Path(os.environ.get("KVSPEC_SGLANG_RELEASES", Path.home() / ".cache" / "kvspec" / "sglang-releases"))


def folder(release: str) -> Path:
    return releases_home() / release


def unpacked(release: str) -> bool:
    return (folder(release) / "sglang" / "version.py").is_file()


def installed(release: str) -> bool:
    """The release can run here: its folder, and what it imports, in this environment."""
    return unpacked(release) and not missing_dependencies()


def install_command(release: str) -> str:
    return f"python -m kvspec.adapters.sglang.releases install {release}"


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
REQUIREMENTS = (Path(__file__).parents[1] / "requirements.txt", Path(__file__).with_name("requirements.txt"))
"""What every release imports besides itself: 0.5.23's pins (adapters/sglang), and what the
older releases import beside them (here). Installed --no-deps into kvspec's environment."""


def missing_dependencies() -> list[str]:
    """The pinned distributions of REQUIREMENTS absent from this environment (sglang aside: the
    release's folder brings it). A release folder without them fails at import, deep inside SGLang."""
    missing = []
    for requirements in REQUIREMENTS:
        for line in requirements.read_text().splitlines():
            name = re.match(r"\s*([A-Za-z0-9_.\-]+)==", line)
            if name and name[1] != "sglang":
                try:
                    metadata.distribution(name[1])
                except metadata.PackageNotFoundError:
                    missing.append(name[1])
    return missing


def install_requirements() -> None:
    for requirements in REQUIREMENTS:
        subprocess.run([*PIP, "install", "--no-deps", "-r", str(requirements)], check=True)


def install(release: str) -> Path:
    """Install one release (the wheel only, no dependencies), reusing a downloaded wheel."""
    if release not in RELEASES:
        raise SystemExit(f"unknown SGLang release {release!r}; kvspec covers {', '.join(RELEASES)}")
    if unpacked(release):
        return folder(release)
    wheels = releases_home() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pip = PIP
    subprocess.run([*pip, "download", "--no-deps", "--dest", str(wheels), f"sglang=={release}"], check=True)
    wheel = next(wheels.glob(f"sglang-{release}-*.whl"))
    target = folder(release).with_suffix(".partial")
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(target), str(wheel)], check=True)
    target.rename(folder(release))  # a folder is complete or absent
    return folder(release)


def activate(release: str) -> None:
    """Make `import sglang` import `release` in this process (and its forkserver)."""
    if not unpacked(release):
        raise ReleaseNotInstalled(f"SGLang {release} is not installed under {releases_home()}; "
                                  f"install it with `{install_command(release)}`")
    if missing := missing_dependencies():
        raise ReleaseNotInstalled(f"SGLang {release} is installed under {releases_home()}, but what it imports is "
                                  f"not in this environment ({', '.join(missing[:5])}"
                                  f"{', ...' if len(missing) > 5 else ''}); install it with "
                                  f"`{install_command(release)}`")
    path = str(folder(release))
    loaded = sys.modules.get("sglang")
    if loaded is not None and not str(Path(loaded.__file__)).startswith(path):
        raise OtherReleaseLoaded(f"this process already imported SGLang from {Path(loaded.__file__).parent}; one "
                                 f"process drives one release (run each release in its own `kvspec check`)")
    if path not in sys.path:
        sys.path.insert(0, path)
    os.environ[ACTIVE] = release


ACTIVE = "KVSPEC_SGLANG_RELEASE"
