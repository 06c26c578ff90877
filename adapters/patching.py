"""Seeding a bug into a real implementation's own code, in process: one edit of one of its
functions, on only while a mutant's calls run. The bug zoos on real SGLang
(kvspec.adapters.sglang.mutants) and real vLLM (kvspec.adapters.vllm.mutants) are built on it.

How a patch is applied (`Patch`, `active`, `Patched`): the function's own source text
(`inspect.getsource`) with the one edit is compiled again (a method inside its class),
and the new code object replaces the function's `__code__`; it runs in the function's
own module globals. The function object stays the same one, so every caller runs the
edit, including modules that imported the function by name (`from x import f`: SGLang's
components/swa.py imports `free_swa_out_of_window_slots`, the sglang adapter's runtime
imports `release_kv_cache`), which a module-attribute patch would miss. The patch is on
only while a call into the mutant's allocator or engine runs (`Patched` wraps each
operation), so an unpatched adapter of the same implementation in the same process,
before, after or between those calls, runs it unpatched; nothing is patched at import.
A patch whose text is not in the function exactly once raises PatchError: an upgrade of
the implementation that moves the code stops the mutant instead of leaving it silently
unpatched.

An implementation's zoo subclasses `Patch` to name the implementation in its errors and
to import its modules the way its adapter does (`prepare`).
"""

import __future__

import ast
import contextlib
import functools
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from types import CodeType, FunctionType


class PatchError(Exception):
    """A patch that cannot be applied as written (its text is not found exactly once)."""


FUTURE_FLAGS = functools.reduce(lambda flags, name: flags | getattr(__future__, name).compiler_flag,
                                __future__.all_feature_names, 0)


@dataclass(frozen=True)
class Patch:
    """One edit of one function of an implementation: `old`, exact source text of the
    function (whole lines, indentation as in the implementation's file), becomes `new`."""

    module: str
    """The module that defines the function, e.g. sglang.srt.mem_cache.common."""
    function: str
    """Its qualified name in that module: `free_kv_row_segments`, `Class.method`."""
    old: str
    new: str

    implementation = "the implementation"
    """Its name in errors (a subclass's: "SGLang", "vLLM")."""

    def __str__(self) -> str:
        return f"{self.module}.{self.function}: {self.old.strip()!r} -> {self.new.strip()!r}"

    def prepare(self) -> None:
        """Runs before the module is imported: a subclass imports the implementation the
        way its adapter does (SGLang through the adapter's runtime, for its torchvision stub)."""

    def target(self) -> FunctionType:
        self.prepare()
        owner = importlib.import_module(self.module)
        *classes, name = self.function.split(".")
        for part in classes:
            owner = getattr(owner, part, None)
            if not isinstance(owner, type):
                raise PatchError(f"{self.module} has no class {'.'.join(classes)}; update the patch {self}")
        function = vars(owner).get(name)
        if not isinstance(function, FunctionType):
            raise PatchError(f"{self.module}.{self.function} is not a plain function here; update the patch {self}")
        ORIGINAL_CODE.setdefault(function, function.__code__)
        return function

    def code(self) -> CodeType:
        """The function's code with the edit (compiled once)."""
        return patched_code(self)


ORIGINAL_CODE: dict[FunctionType, CodeType] = {}
"""Each patched function's own code, from the first time a patch named it."""


@functools.cache
def patched_code(patch: Patch) -> CodeType:
    function = patch.target()
    original = ORIGINAL_CODE[function]
    source = inspect.getsource(original)
    found = source.count(patch.old)
    if found != 1:
        raise PatchError(f"{patch.module}.{patch.function}: the text to replace occurs {found} times in its source, "
                         f"not once; {patch.implementation}'s code moved (an upgrade?), so update the patch. "
                         f"Text:\n{patch.old}")
    edited = textwrap.dedent(source.replace(patch.old, patch.new))
    if edited.startswith("@"):
        raise PatchError(f"{patch.module}.{patch.function} is decorated; patch the function it wraps")
    # a method is compiled inside its class, for private-name mangling and super()'s __class__ cell
    *classes, _ = patch.function.split(".")
    wrapped = "".join(f"{'    ' * depth}class {part}:\n" for depth, part in enumerate(classes))
    tree = ast.parse(wrapped + textwrap.indent(edited, "    " * len(classes)))
    ast.increment_lineno(tree, original.co_firstlineno - 1 - len(classes))  # tracebacks show the real lines
    code = compile(tree, original.co_filename, "exec", flags=original.co_flags & FUTURE_FLAGS, dont_inherit=True)
    for part in patch.function.split("."):  # nothing is executed: the function's code is a constant of its class's
        code = next(const for const in code.co_consts if isinstance(const, CodeType) and const.co_name == part)
    if code.co_freevars != original.co_freevars:
        raise PatchError(f"{patch.module}.{patch.function}: the edit changes the variables it closes over "
                         f"({original.co_freevars} -> {code.co_freevars}); keep them")
    return code


@contextlib.contextmanager
def active(patches: tuple[Patch, ...]):
    """The patches on for the duration of the block (idempotent: a nested block under the
    same patches changes nothing); the original code back afterwards, however it ends."""
    swapped = []
    try:
        for patch in patches:
            function, code = patch.target(), patch.code()
            if function.__code__ is code:
                continue
            if function.__code__ is not ORIGINAL_CODE[function]:
                raise PatchError(f"{patch.module}.{patch.function} is already patched by another mutant's call")
            function.__code__ = code
            swapped.append(function)
        yield
    finally:
        for function in reversed(swapped):
            function.__code__ = ORIGINAL_CODE[function]


class Patched:
    """An allocator or engine of a real implementation built, and driven call by call,
    with patches on: every operation of the protocol (and snapshot/state) runs inside
    `active`."""

    def __init__(self, patches: tuple[Patch, ...], build, *args, **kwargs):
        self.patches = patches
        with active(patches):
            self.implementation = build(*args, **kwargs)

    def __getattr__(self, name: str):
        attribute = getattr(self.implementation, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def patched(*args, **kwargs):
            with active(self.patches):
                return attribute(*args, **kwargs)

        return patched
