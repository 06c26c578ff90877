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

import re
import traceback
import types
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

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


# -- the adapter's own fault -----------------------------------------------------------------

SIGNATURE = re.compile(r"unexpected keyword argument|missing \d+ required|takes \d+ positional|"
                       r"positional arguments? but|takes no arguments")
"""How Python words a call whose arguments do not fit the callee's signature (a TypeError
raised at the caller's line, before the callee runs)."""


def adapter_fault(error: BaseException | None, adapter) -> str | None:
    """One paragraph saying that `error`, raised during a run, is the adapter's own fault, not
    the engine's, or None. It is where the adapter's code reads the engine in a way the
    installed release does not allow: its innermost frame is the adapter's, and it is an
    attribute the engine's object lacks (AttributeError), a call whose arguments the engine's
    function no longer takes (TypeError), or a name the engine's module no longer has
    (ImportError). Only for an adapter that says which engine it drives (`built_for`):
    anything else raised, and anything an engine raises in its own code, stays the engine's."""
    built_for = getattr(adapter, "built_for", None)
    if error is None or built_for is None or not isinstance(error, AttributeError | TypeError | ImportError):
        return None
    frame = innermost(error)
    if frame is None or not of_the_adapter(frame.f_globals.get("__name__", ""), adapter):
        return None
    engine_modules = top_level_modules(built_for.distribution)
    if isinstance(error, AttributeError):
        obj = getattr(error, "obj", None)
        module = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
        if module.split(".")[0] not in engine_modules:
            return None
        owner = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__name__
        what = f"reads `{owner}.{error.name}`, which it does not have"
    elif isinstance(error, ImportError):
        if (error.name or "").split(".")[0] not in engine_modules:
            return None
        what = f"imports from `{error.name}` what it does not have"
    elif SIGNATURE.search(str(error)):
        what = "makes a call whose arguments the callee no longer takes"
    else:
        return None
    engine = built_for.shown_as or built_for.distribution
    installed = installed_version(built_for.distribution)
    where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
    return (f"the adapter's own fault, not {engine}'s: its code ({where}) {what} in {engine} {installed} (installed; "
            f"the adapter was built for {', '.join(built_for.versions)}): {type(error).__name__}: {error}. The "
            f"adapter must be updated for this release (README, \"A new engine release\").")


def innermost(error: BaseException):
    """The frame that raised `error`, past the import machinery's own."""
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)
              if not frame.f_code.co_filename.startswith("<frozen")]
    return frames[-1] if frames else None


def of_the_adapter(module: str, adapter) -> bool:
    """Whether `module` is the adapter's code: its own package (`kvspec.adapters.vllm` for
    kvspec's built-in adapters of vLLM; an outside adapter's top-level package)."""
    parts = adapter.home.split(".")
    root = ".".join(parts[:3]) if parts[:2] == ["kvspec", "adapters"] else parts[0]
    return bool(root) and (module == root or module.startswith(root + "."))


def top_level_modules(distribution: str) -> set[str]:
    """The modules `import` reaches of an installed distribution ("tokenspeed-scheduler" ->
    its package's name)."""
    names = {module for module, owners in packages_distributions().items() if distribution in owners}
    return names or {distribution.replace("-", "_")}
