"""What `kvspec diff-helpers` compares: the spec's pure helpers an adapter may expose, and
the pairs an adapter's `helpers` mapping makes of them (diff_helpers.py says what the
mapping is).

An entry CrossHair could not compare is refused with a sentence saying how to fix it: a
key that names no spec helper, a value that is not a function a fresh interpreter can
import by name, or one that cannot be called with the spec helper's parameters.
Parameters named unlike the spec's are compared by position, with a note.
"""

import dataclasses
import difflib
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..harness.protocol import AdapterError, load_adapter

SPEC_MODULES = ("pages", "allocator", "window", "lifecycle")
"""The kvspec.spec modules whose module-level functions an adapter may expose."""


def spec_helpers() -> dict[str, Callable]:
    """Every helper an adapter may expose, by its name within kvspec.spec ("pages.ceil_page")."""
    helpers = {}
    for module_name in SPEC_MODULES:
        module = importlib.import_module(f"kvspec.spec.{module_name}")
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_"):
                helpers[f"{module_name}.{name}"] = value
    return helpers


@dataclasses.dataclass(frozen=True)
class HelperPair:
    """A spec helper and the adapter's version of it."""

    helper: str
    """The spec helper's name within kvspec.spec, e.g. "pages.ceil_page"."""
    target: str
    """The adapter's function as "module:qualname", importable in a fresh interpreter."""
    note: str = ""
    """Something the user should know about the pair (parameter names that differ)."""


def import_target(target: str) -> Any:
    """The object a "module:qualname" string names."""
    module_name, _, qualname = target.partition(":")
    value = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def describe_parameters(signature: inspect.Signature) -> str:
    return "(" + ", ".join(signature.parameters) + ")"


def check_pair(helper: str, value: Any, known: dict[str, Callable]) -> HelperPair | str:
    """The pair, or a sentence saying what is wrong with one entry and how to fix it."""
    where = f"helpers[{helper!r}]"
    if not isinstance(helper, str) or helper not in known:
        suggestions = difflib.get_close_matches(str(helper), known, n=3, cutoff=0.5)
        suggestions += [name for name in known if name.endswith(f".{helper}") and name not in suggestions]
        if suggestions:
            return f"{where}: kvspec.spec has no helper {helper!r}; did you mean {' or '.join(suggestions)}?"
        return (f"{where}: kvspec.spec has no helper {helper!r}; keys are module.function within "
                f"kvspec.spec, one of: {', '.join(known)}")
    if isinstance(value, str):
        if ":" not in value:
            return f"{where}: {value!r} is not \"module:function\"; write it as e.g. \"my_adapter:{helper.split('.')[1]}\""
        try:
            function = import_target(value)
        except AttributeError as error:
            return f"{where}: cannot find {value!r} ({error}); name a function its module defines"
        except Exception as error:  # noqa: BLE001 (whatever the adapter's module raises on import)
            return f"{where}: cannot import {value!r} ({type(error).__name__}: {error}); is it on PYTHONPATH?"
        target = value
    else:
        function = value
        target = None
    if not callable(function):
        return f"{where}: {function!r} is not callable; map the name to your own function (or \"module:function\")"
    if not inspect.isfunction(function):
        return (f"{where}: {function!r} is not a plain function; CrossHair imports the adapter's helper "
                f"by name in a fresh interpreter, so wrap it in a module-level `def`")
    if target is None:
        target = f"{function.__module__}:{function.__qualname__}"
        try:
            importable = import_target(target) is function
        except (ImportError, AttributeError):
            importable = False
        if not importable:
            return (f"{where}: {function.__qualname__} (in {function.__module__}) cannot be imported by name; "
                    f"CrossHair loads the adapter's helper in a fresh interpreter, so define it with `def` "
                    f"at module level (not a lambda or a nested function)")
    spec_signature = inspect.signature(known[helper])
    signature = inspect.signature(function)
    try:
        signature.bind(*spec_signature.parameters)
    except TypeError as error:
        return (f"{where}: {target}{describe_parameters(signature)} cannot be called like the spec's "
                f"{helper}{describe_parameters(spec_signature)} ({error}); take the same parameters, in the same order")
    note = ""
    theirs = list(signature.parameters)[:len(spec_signature.parameters)]
    if theirs != list(spec_signature.parameters):
        note = (f"parameters {describe_parameters(signature)} are named unlike the spec's "
                f"{describe_parameters(spec_signature)}; compared by position")
    return HelperPair(helper, target, note)


def validate_helpers(helpers: Any, adapter: str) -> list[HelperPair]:
    """The pairs of an adapter's `helpers` mapping; AdapterError listing every problem."""
    if not isinstance(helpers, Mapping):
        raise AdapterError(f"adapter {adapter!r}: `helpers` must be a mapping from a spec helper name "
                           f"(e.g. \"pages.ceil_page\") to your function (got {type(helpers).__name__})")
    known = spec_helpers()
    checked = [check_pair(helper, value, known) for helper, value in helpers.items()]
    problems = [entry for entry in checked if isinstance(entry, str)]
    if problems:
        raise AdapterError(f"adapter {adapter!r}: its `helpers` mapping is not usable:\n  - "
                           + "\n  - ".join(problems))
    return checked


def adapter_helpers(spec: str) -> Any:
    """The adapter's `helpers` attribute (None when it has none), after the protocol's
    own validation of the adapter."""
    adapter = load_adapter(spec)
    helpers = getattr(adapter, "helpers", None)
    if helpers is None:
        # The loaded Adapter record may not carry it: read the object the spec names.
        from ..harness import protocol

        helpers = getattr(protocol.resolve(spec), "helpers", None)
    return helpers
