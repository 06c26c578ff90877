"""Release day: the engine release an adapter was built for, checked before anything runs.

An adapter of a real engine reads that engine's internals (private attributes, call
signatures), which move between releases. Run against a release it was not built for, it
fails inside its own code, and a check would blame the engine for the adapter's ignorance:
vLLM 0.34.0 under the adapter built for 0.33.0 showed `snapshot() raised AttributeError` as
an engine crash. So an adapter declares the releases it drives (`built_for`), and loading it
where another release is installed is a clear error (exit 2) naming both, and what to use
instead: the engine's release family, where it has a member for the installed release, else
the install command of a supported one. Nothing of the engine is imported: the installed
version is read from the package's metadata.
"""

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from . import families


@dataclass(frozen=True)
class BuiltFor:
    """The releases of one engine package an adapter drives."""

    distribution: str
    """The package's name on PyPI ("vllm", "sglang", "tokenspeed-scheduler")."""
    versions: tuple[str, ...]
    """The releases the adapter was built and checked for."""
    shown_as: str = ""
    """How the message names the engine ("vLLM"); the distribution's name by default."""
    family: str = ""
    """The prefix of the engine's release family ("sglang@"), whose member for the installed
    release the message names where there is one."""
    install: str = ""
    """How to install a supported release (a command)."""


def installed_version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def release_problem(built_for: BuiltFor, adapter: str) -> str | None:
    """One paragraph saying why `adapter` must not run here, or None: the engine's installed
    release is one it was built for, or the engine is not installed at all (what happens
    then is the adapter's own error on import, which names its requirements)."""
    installed = installed_version(built_for.distribution)
    if installed is None or installed in built_for.versions:
        return None
    engine = built_for.shown_as or built_for.distribution
    supported = ", ".join(built_for.versions)
    family = next((f for f in families.families() if f.prefix == built_for.family), None) if built_for.family else None
    if family is not None and installed in family.versions():
        instead = (f"To check {engine} {installed}, use its member of {family.shown_as}: `--adapter "
                   f"{family.prefix}{installed}`.")
    else:
        instead = (f"kvspec has no adapter of {engine} {installed} yet: install a supported release"
                   + (f" ({built_for.install})" if built_for.install else "")
                   + ", or add this one (README, \"A new engine release\").")
    return (f"adapter {adapter!r} drives {engine} {supported}, but {engine} {installed} is installed. An adapter "
            f"reads its engine's internals, which move between releases, so a run here would judge the adapter, "
            f"not {engine}: nothing was run. {instead}")
