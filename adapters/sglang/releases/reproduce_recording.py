"""SGLang seen through recording proxies, while the adapter replays a trace (reproduce_replay.py):
each SGLang function or class the adapter calls, each method it calls on an object SGLang gave
it and each attribute it sets there becomes one `Statement` of the file, in order, with literal
arguments (`Recorder`); what it asks only to decide (`QUERIES`) is not recorded."""

import contextlib
import enum
import functools
import json
import types
from array import array
from collections import defaultdict
from dataclasses import dataclass

from .reproduce_preamble import PORTABLE

QUERIES = frozenset({
    # what the adapter asks SGLang only to decide whether a step fits: the answers are pure
    "new_pages_available", "full_available_size", "swa_available_size", "available_size",
    "new_tokens_required_next_decode", "prefix_device_indices", "get_kvcache",
    # the PD-decode pre-allocation's budget arithmetic (pd_decode.py)
    "_pre_alloc_fill_len", "_uses_swa_tail_prealloc", "_required_alloc_tokens", "_allocatable_token_budgets",
    "_swa_tail_allocatable_token_budget", "_uses_swa_reservation", "_prealloc_required_tokens",
    "_prealloc_kv_lens", "_prealloc_reservation_fits", "_radix_full_available", "_swa_tail_len",
})


NOTES = {
    # why the adapter makes a call, where the call's name does not say
    "init_next_round_input": "the prefix match",
    "evict_from_tree_cache": "the eviction an extend's allocation makes first",
    "evict_to_free_tokens": "the eviction an extend's allocation makes first",
    "free_group_begin": "the batch's results are processed inside one free group",
    "check_decode_mem": "the scheduler's gate before a decode batch: it evicts what the batch needs",
    "check_decode_capacity": "the scheduler's gate before a decode batch: it evicts what the batch needs",
    "ServerArgs": "\nSGLang reads its settings from a process-wide context, which its scheduler publishes",
    "SWAKVPool": "\nThe KV pools of a model with a sliding-window layer and a full-attention layer (one head of "
                 "dimension 1: what is checked is which slots hold KV, not the KV), and the request-to-token pool",
}


class ReproductionError(Exception):
    """A trace or member this command cannot write a reproduction for (exit status 2)."""


CONTAINERS = (list, array, dict, set)
"""What the adapter may change in place (`req.output_ids.append(token)`): read as proxies."""


def is_sglang(value) -> bool:
    return type(value).__module__.startswith("sglang")


@dataclass(eq=False)
class Statement:
    """One line of the file: text and the proxies it names, rendered once every name is known."""

    parts: list
    indent: int = 0
    result: "Proxy | None" = None
    raised: BaseException | None = None
    note: str = ""
    """A comment line above it: why the adapter makes this call (NOTES), or a step's words."""


class Proxy:
    """One SGLang object the adapter holds, standing in for it while the adapter runs: the
    adapter's calls on it and its attribute sets are recorded, its reads are not. A proxy
    is named in the file by a name (`tree_cache`, a request's id), by the read it came
    from (`a.last_node`), or by the call that returned it (`Statement.result`)."""

    __slots__ = ("_attribute", "_inline", "_name", "_parent", "_recorder", "_statement", "_target")

    def __init__(self, recorder, target, parent=None, attribute=None, statement=None):
        for slot, value in (("_target", target), ("_recorder", recorder), ("_name", None), ("_parent", parent),
                            ("_attribute", attribute), ("_statement", statement), ("_inline", None)):
            object.__setattr__(self, slot, value)

    @property
    def _returned(self) -> bool:
        """Whether it came from a call, or is read off something that did: its ints are traced."""
        return self._statement is not None or self._parent is not None and self._parent._returned

    def _origin(self) -> "Proxy":
        return self if self._parent is None else self._parent._origin()

    def __getattr__(self, name):
        value = getattr(self._target, name)
        recorder = self._recorder
        if not recorder.active or name.startswith("__"):
            return value
        if isinstance(value, (types.MethodType, types.BuiltinMethodType)):
            if name in QUERIES:
                return value
            return lambda *args, **kwargs: recorder.call([self, f".{name}"], value, args, kwargs)
        if self._returned and type(value) is int:
            return Traced(value, self, name)
        if isinstance(value, CONTAINERS) or is_sglang(value) or self._returned and isinstance(value, recorder.torch.Tensor):
            return Proxy(recorder, value, parent=self, attribute=name)
        return value

    def __setattr__(self, name, value):
        if self._recorder.active:
            self._recorder.add([self, f".{name} = ", *self._recorder.literal(value)])
        setattr(self._target, name, unwrap(value))

    def __len__(self):
        return len(self._target)

    def __iter__(self):
        return iter(self._target)

    def __getitem__(self, index):
        return self._target[index]

    def __bool__(self):
        return bool(self._target)

    def __add__(self, other):
        return self._target + unwrap(other)

    def __repr__(self):
        return f"Proxy({self._target!r})"


class Traced(int):
    """An int the adapter read off an object a recorded call returned: the file writes the
    read (`lock.swa_uuid_for_lock`), not the number, which another release may number otherwise."""

    def __new__(cls, value: int, parent: Proxy, attribute: str):
        traced = super().__new__(cls, value)
        traced.parent, traced.attribute = parent, attribute
        return traced


class Namespace:
    """runtime.sglang()'s namespace (or a module of SGLang's in it) as the adapter reads it
    while recording: SGLang's functions and classes record their calls; torch, enums and
    everything else are themselves."""

    def __init__(self, recorder, target):
        self._recorder, self._target = recorder, target

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if not self._recorder.active:
            return value
        if isinstance(value, types.ModuleType) and value.__name__.startswith("sglang"):
            return Namespace(self._recorder, value)
        if (isinstance(value, types.FunctionType) or isinstance(value, type) and not issubclass(value, enum.Enum)) \
                and value.__module__.startswith("sglang"):
            return functools.wraps(value)(  # inspect.signature reads through it (0.5.14's SWAKVPool)
                lambda *args, **kwargs: self._recorder.call([self._recorder.imported(value)], value, args, kwargs))
        return value


def unwrap(value):
    """What SGLang gets: the objects themselves, never a proxy (nor inside a list, tuple or dict)."""
    if isinstance(value, Proxy):
        return value._target
    if isinstance(value, Traced):
        return int(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map(unwrap, value))
    if isinstance(value, dict):
        return {key: unwrap(item) for key, item in value.items()}
    return value


def sequence(items: list[str], brackets: str) -> str:
    """A list or tuple literal; a run of one literal, as `[0] * 28`."""
    if brackets == "[]" and len(items) > 3 and len(set(items)) == 1:
        return f"[{items[0]}] * {len(items)}"
    inner = ", ".join(items) + ("," if brackets == "()" and len(items) == 1 else "")
    return brackets[0] + inner + brackets[1]


class Recorder:
    """The statements of the file, recorded while the adapter runs a trace's steps."""

    def __init__(self, torch):
        self.torch = torch
        self.statements: list[Statement] = []
        self.imports: dict[str, set[str]] = defaultdict(set)
        self.names: dict[int, Proxy] = {}
        """The pools, by their own id: the adapter builds the tree over them, not their proxies."""
        self.recording = False
        self.inside = 0
        """How deep inside SGLang (a recorded call) or kvspec's own reading the adapter is: what
        happens there is not the adapter's call."""
        self.indent = 0
        self.portable: set[str] = set()
        """The PORTABLE arguments the file passes."""
        self.preset: dict[Proxy, str] = {}
        """Names the file gives objects whatever their use: the tree, the requests, each batch."""

    @property
    def active(self) -> bool:
        return self.recording and not self.inside

    @contextlib.contextmanager
    def paused(self):
        self.inside += 1
        try:
            yield
        finally:
            self.inside -= 1

    @contextlib.contextmanager
    def on(self):
        self.recording = True
        try:
            yield
        finally:
            self.recording = False

    def add(self, parts: list, result: Proxy | None = None) -> Statement:
        statement = Statement(parts, self.indent, result)
        self.statements.append(statement)
        return statement

    def comment(self, text: str = "") -> None:
        """A comment (or, for "", a blank line) of the file."""
        self.add([""]).note = text

    def imported(self, value) -> str:
        self.imports[value.__module__].add(value.__name__)
        return value.__name__

    def call(self, callee: list, function, args: tuple, kwargs: dict):
        if not self.active:
            return function(*unwrap(args), **unwrap(kwargs))
        arguments = [part for value in args for part in (*self.literal(value), ", ")]
        for name, value in kwargs.items():
            if name in PORTABLE:
                self.portable.add(name)
                arguments += [f"**{PORTABLE[name][0]}", ", "]
            else:
                arguments += [f"{name}=", *self.literal(value), ", "]
        statement = self.add([*callee, "(", *arguments[:-1], ")"])
        statement.note = NOTES.get(function.__name__, "")
        with self.paused():
            try:
                result = function(*unwrap(args), **unwrap(kwargs))
            except BaseException as error:
                statement.raised = error
                raise
        if not is_sglang(result):
            return result
        statement.result = Proxy(self, result, statement=statement)
        return statement.result

    def literal(self, value) -> list:
        """`value` as parts of a line: text, and the proxies that name objects."""
        torch = self.torch
        if isinstance(value, Proxy):
            return [value]
        if isinstance(value, Traced):
            return [value.parent, f".{value.attribute}"]
        if isinstance(value, enum.Enum):  # before int: an IntEnum is one
            return [f"{self.imported(type(value))}.{value.name}"]
        if isinstance(value, str):
            return [json.dumps(value)]
        if value is None or isinstance(value, (bool, int, float)):
            return [repr(value)]
        if isinstance(value, torch.dtype):
            return [str(value)]
        if isinstance(value, torch.Tensor):
            dtype = "" if value.dtype == torch.int64 else f", dtype={value.dtype}"
            return [f"torch.tensor({sequence([repr(v) for v in value.tolist()], '[]')}{dtype})"]
        if isinstance(value, array):
            return [f"array({json.dumps(value.typecode)}, {sequence([repr(v) for v in value], '[]')})"]
        if id(value) in self.names:
            return [self.names[id(value)]]  # a pool, passed as itself
        if isinstance(value, (list, tuple)):
            items = [self.literal(item) for item in value]
            if all(len(item) == 1 and isinstance(item[0], str) for item in items):
                return [sequence([item[0] for item in items], "[]" if isinstance(value, list) else "()")]
            parts = [part for item in items for part in (*item, ", ")][:-1]
            return ["[" if isinstance(value, list) else "(", *parts, "]" if isinstance(value, list) else ",)"]
        if isinstance(value, dict):
            parts = [part for key, item in value.items() for part in (repr(key), ": ", *self.literal(item), ", ")]
            return ["{", *parts[:-1], "}"]
        raise ReproductionError(f"the adapter passed SGLang a {type(value).__module__}.{type(value).__name__}, "
                                f"which the reproduction cannot write as a literal")
