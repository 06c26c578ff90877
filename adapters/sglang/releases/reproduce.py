"""A standalone reproduction of a finding, written from its trace: one Python file that a
SGLang maintainer can attach to an upstream issue.

    python -m kvspec.adapters.sglang.releases reproduce TRACE --member sglang@0.5.18 --out FILE.py
    PYTHONPATH=<the release's folder> python FILE.py   # exit 0: holds; an AssertionError: the bug

The file imports SGLang, torch and the standard library, never kvspec. It is written by
replaying the trace on the member's adapter (adapters/sglang/engine.py and its release shim,
built as catalog.make_engine builds it) with SGLang seen through recording proxies
(`Recorder`): each SGLang function or class the adapter calls, each method it calls on an
object SGLang gave it and each attribute it sets there becomes one line of the file, in
order, with literal arguments; the server arguments, the pools and the tree it builds too.
A value the adapter read off an object a call returned is written as that read, so the file
keeps SGLang's own data flow (`r1.lock = tree_cache.lock(r1.last_node)`). What the adapter
asks only to decide (`QUERIES`), and what it reads to show kvspec SGLang's state, are left
out: their answers are already in the literals that follow.

Around the recorded lines the file carries, as short commented code, what the adapter does
once per process rather than per engine (adapters/sglang/runtime.py and the release shims:
the torchvision stand-in, the config registration of SGLang <= 0.5.19, the CPU allocation
kernels of SGLang <= 0.5.21), the helpers the adapter's `batch()`, PD queue and 0.5.14 extend
range stand for (checked against them), and the assertions (`CHECKS`): each one property over
SGLang's own state in plain terms, written once here, chosen by the clauses the trace
violates, asserted after every step.
"""

import contextlib
import enum
import functools
import json
import keyword
import os
import re
import sys
import textwrap
import types
from array import array
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from kvspec.conformance.harness.families import UnavailableMember
from kvspec.conformance.harness.protocol import PARAMETERS
from kvspec.conformance.harness.trace import Trace, TraceError, load
from kvspec.spec.outcomes import OutOfMemory
from kvspec.spec.window import decode_window_bound

from .catalog import Release, key
from .findings import FINDINGS

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


PORTABLE = {
    # an argument the adapter passes only where the release has it, as the file passes it
    "enable_kvcache_transpose": ("KVCACHE_TRANSPOSE", '''
# 0.5.14's SWAKVPool requires enable_kvcache_transpose (and asserts it is off); later releases have no such
# argument: pass it where SWAKVPool takes it, as kvspec's adapter does.
KVCACHE_TRANSPOSE = {"enable_kvcache_transpose": False} \\
    if "enable_kvcache_transpose" in inspect.signature(SWAKVPool).parameters else {}
'''),
}


class ReproductionError(Exception):
    """A trace or member this command cannot write a reproduction for (exit status 2)."""


# -- recording ------------------------------------------------------------------------------

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


def identifier(name: str, taken: set[str]) -> str:
    """A Python name for a request id: the id itself where it is one."""
    base = re.sub(r"\W", "_", name)
    if not base.isidentifier() or keyword.iskeyword(base) or base in RESERVED:
        base = f"req_{base}".replace("__", "_")
    chosen, number = base, 2
    while chosen in taken:
        chosen, number = f"{base}_{number}", number + 1
    return chosen


RESERVED = frozenset({"torch", "array", "os", "sys", "allocator", "kvcache", "tree_cache", "req_to_token_pool",
                      "batch", "queue", "check", "server_args", "paged"})
"""Names the file's own code uses, which a request's id must not take."""


NAMES = {"SWAKVPool": "kvcache"}
"""What the file calls an object of these classes (else its class's name in snake case)."""


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower()


WIDTH = 110
"""The file's longest line of code."""


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """A line longer than `width` broken at the commas inside its first bracket, each
    continuation under the first item (or four spaces in, where that is far right)."""
    if len(line) <= width or line.lstrip().startswith("#"):
        return [line]
    opened, closed, commas = brackets(line)
    if closed is None or not commas:
        return [line]
    items = [line[start + 1:stop].strip() for start, stop in zip([opened, *commas], [*commas, closed])]
    items = [item + "," for item in items[:-1]] + [items[-1] + line[closed:]]
    hanging = opened + 1 > width // 2
    margin = len(line) - len(line.lstrip()) + 4 if hanging else opened + 1
    lines = [line[:opened + 1]] + ([" " * margin] if hanging else [])
    for item in items:
        bare = lines[-1] == line[:opened + 1] or not lines[-1].strip()
        if not bare and len(lines[-1]) + 1 + len(item) > width:
            lines.append(" " * margin)
            bare = True
        lines[-1] += item if bare else " " + item
    return [piece for text in lines for piece in wrap(text, width)]


def brackets(line: str) -> tuple[int | None, int | None, list[int]]:
    """The first bracket of a line (outside strings) with commas directly inside it: where it
    opens, where it closes, and those commas."""
    code, quote = [], None  # whether each character is code, not inside a string
    for index, char in enumerate(line):
        code.append(quote is None and char not in "\"'")
        if quote and char == quote and line[index - 1] != "\\":
            quote = None
        elif quote is None and char in "\"'":
            quote = char
    for start, char in enumerate(line):
        if not (code[start] and char in "([{"):
            continue
        depth, commas = 0, []
        for index in range(start, len(line)):
            if not code[index]:
                continue
            depth += (line[index] in "([{") - (line[index] in ")]}")
            if depth == 0:
                if commas:
                    return start, index, commas
                break
            if line[index] == "," and depth == 1:
                commas.append(index)
    return None, None, []


INLINE = 60
"""The longest call written into the line that uses it; a longer one gets a name."""


def render(statements: list[Statement], preset: dict[Proxy, str]) -> list[str]:
    """The file's lines. A call's result is named where a later line uses it (`preset` names
    first: the requests, the tree, each batch), written into the next line where only that
    line uses it, and left unnamed where nothing does. A name is taken again once its last
    holder is used no more (`sampling_params` of each request)."""
    uses: dict[Proxy, list[int]] = defaultdict(list)
    for index, statement in enumerate(statements):
        for part in statement.parts:
            if isinstance(part, Proxy):
                uses[part._origin()].append(index)
    last_use: dict[str, int] = {}
    lines = []

    def text(parts) -> str:
        return "".join(part if isinstance(part, str) else expression(part) for part in parts)

    def expression(proxy: Proxy) -> str:
        if proxy._parent is not None:
            return f"{expression(proxy._parent)}.{proxy._attribute}"
        if proxy._inline is not None:
            return proxy._inline
        if proxy._name is None:
            raise ReproductionError(f"a line names an object no earlier line made: {proxy!r}")
        return proxy._name

    for index, statement in enumerate(statements):
        line = text(statement.parts)
        result = statement.result
        if result is not None and (result in preset or uses.get(result)):
            used = uses.get(result, [])
            following = statements[index + 1] if index + 1 < len(statements) else None
            if result not in preset and used == [index + 1] and following.indent == statement.indent \
                    and not statement.note and len(line) <= INLINE:
                object.__setattr__(result, "_inline", line)
                continue
            base = preset.get(result) or NAMES.get(type(result._target).__name__) or snake(type(result._target).__name__)
            name, number = base, 2
            while last_use.get(name, -1) >= index:
                name, number = f"{base}_{number}", number + 1
            last_use[name] = max(used, default=index)
            object.__setattr__(result, "_name", name)
            line = f"{name} = {line}"
        margin = "    " * statement.indent
        if statement.note:
            if statement.note.startswith("\n") and lines and lines[-1]:
                lines.append("")  # a new paragraph
            lines += [margin + f"# {words}" for words in textwrap.wrap(
                statement.note.strip(), WIDTH - len(margin) - 2, break_on_hyphens=False)]
        if statement.raised is not None:
            lines.append(margin + "# here SGLang raised, on the release this file was written on: "
                         f"{type(statement.raised).__name__}")
        if line or not statement.note:
            lines += wrap(margin + line) if line else [""]
    return lines


# -- what the file sets up before the trace's steps ---------------------------------------------

TORCHVISION = '''
# SGLang imports torchvision at module level for its vision models, which nothing here runs.
# Where it cannot be imported (a CPU torch beside PyPI's CUDA torchvision), a stand-in module
# lets those imports finish; calling anything in it raises.
try:
    import torchvision  # noqa: F401
except Exception:  # missing, or a build that fails to load beside this torch
    import importlib.abc
    import importlib.machinery

    class Absent(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Absent(name, (), {})

        def __call__(cls, *args, **kwargs):
            raise RuntimeError("torchvision is not installed")

    class AbsentModule(types.ModuleType):
        __getattr__ = Absent.__getattr__

    class AbsentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "torchvision":
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = AbsentModule(spec.name)
            module.__path__, module.__version__ = [], "0.0.0"
            return module

        def exec_module(self, module):
            pass

    for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
        del sys.modules[name]
    sys.meta_path.insert(0, AbsentFinder())
'''

WARNINGS = '''
# SGLang warns at import that its quantization kernels need a GPU: true, and beside the point here.
warnings.filterwarnings("ignore", message="Only CUDA")
'''

SHIPPED_CONFIGS = '''
# Up to 0.5.19 SGLang registers its qwen3_asr configs without exist_ok, and newer transformers
# ship that model type themselves: let the registration pass, as SGLang 0.5.20 does.
from transformers import AutoConfig

register = AutoConfig.register
AutoConfig.register = staticmethod(lambda model_type, config, exist_ok=False: register(model_type, config, True))
'''

CPU_KERNELS = '''
# Up to 0.5.21 the paged allocator launches Triton kernels, which need a GPU. On CPU, run the
# torch code SGLang 0.5.22 runs instead: the release's own alloc_extend_naive{and_decode}.
import {paged} as paged


class CpuLaunch:
    """`kernel[grid](*args)` for a plain function."""

    def __init__(self, function):
        self.function = function

    def __getitem__(self, grid):
        return self.function


def alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, out_indices, _block, page_size):
    new_pages = ((seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size).sum()
    if int(new_pages) <= free_pages.numel():  # else the kernel's output is dropped: the allocation returns None
        paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, "cpu")
'''

CPU_DECODE_KERNEL = '''

def alloc_decode(seq_lens, last_loc, free_pages, out_indices, _block, page_size):
    need_new_page = ((seq_lens - 1) % page_size == 0).to(torch.int64)
    num_new_pages = int(need_new_page.sum())
    if num_new_pages == 0:
        out_indices.copy_(last_loc + 1)
    elif num_new_pages <= free_pages.numel():
        rank = (torch.cumsum(need_new_page, 0) - need_new_page).clamp_(max=num_new_pages - 1)
        out_indices.copy_(torch.where(need_new_page.bool(), free_pages[rank] * page_size, last_loc + 1))
'''

BATCH = '''

def schedule_batch(reqs, forward_mode, forward_iter=0):
    """A ScheduleBatch with the fields SGLang's allocation paths read, as the scheduler's are
    (no overlap, no speculative decoding, a decoder-only model); `forward_iter` is the
    scheduler's count of the batches it ran before this one."""
    batch = object.__new__(ScheduleBatch)
    batch.reqs = list(reqs)
    batch.tree_cache = tree_cache
    batch.token_to_kv_pool_allocator = allocator
    batch.req_to_token_pool = req_to_token_pool
    batch.forward_mode = forward_mode
    batch.device = "cpu"
    batch.enable_overlap = False
    batch.hisparse_coordinator = None
    batch.dllm_config = None
    batch.forward_iter = forward_iter
    batch.model_config = SimpleNamespace(is_encoder_decoder=False)
    batch.spec_algorithm = SimpleNamespace(is_none=lambda: True)
    return batch
'''
BATCH_FIELDS = frozenset(re.findall(r"batch\.(\w+) =", BATCH))
"""What BATCH sets: exactly what the adapter's `batch()` sets (checked at each batch)."""


# -- what the file asserts ----------------------------------------------------------------------

OBSERVE = {
    "free_pages": '''
def free_pages(pool):
    """A pool's free list: its free pages and those freed since it last sorted them."""
    pages = pool.free_pages.tolist()
    return pages if pool.release_pages is None else pages + pool.release_pages.tolist()
''',
    "tree_nodes": '''
def tree_nodes():
    """Every node of the prefix tree but its root: (node, its full slots, its SWA slots or None
    where its SWA KV was released (a tombstone), its full lock count)."""
    stack = list({root}.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        {read}
''',
    "kv_of": '''
def kv_of(req):
    """What a request holds: (its row of req_to_token_pool, cache_protected_len, its SWA cursor,
    kv_allocated_len), or None before its first extend. A release keeps these on the request or
    in `req.kv`, which took them over one by one (0.5.17 - 0.5.19)."""
    kv = getattr(req, "kv", None)

    def read(name):
        return getattr(kv, name) if hasattr(kv, name) else getattr(req, name)

    if read("req_pool_idx") is None:
        return None
    if hasattr(kv, "get_evicted_seqlen"):  # from 0.5.22
        cursor = kv.get_evicted_seqlen(ComponentType.SWA)
    else:
        cursor = read("swa_evicted_seqlen")
    return read("req_pool_idx"), read("cache_protected_len"), cursor, read("kv_allocated_len")
''',
}
TREE_READS = {
    # the node's fields, by tree (legacy: SWARadixCache; unified: UnifiedRadixCache's Python core)
    "legacy": "yield (node, node.value.tolist(), None if node.swa_tombstone else\n"
              "               allocator.full_to_swa_index_mapping[node.value].tolist(), node.full_lock_ref)",
    "unified": "full, swa = node.component(ComponentType.FULL), node.component(ComponentType.SWA)\n"
               "        yield node, full.value.tolist(), None if swa.value is None else swa.value.tolist(), full.lock_ref",
}
@dataclass(frozen=True)
class Check:
    """One property over SGLang's state, for the clauses of kvspec it stands for."""

    clauses: tuple[str, ...]
    source: str
    uses: tuple[str, ...]
    """The OBSERVE helpers it reads."""
    when: str = "step"
    """"step": after every step, of the requests then running; "pd_admit": after each PD
    admission, of its request; "drain": after the trace's drain."""
    imports: tuple[str, ...] = ()
    """What else of SGLang's it names ("module:name")."""

    @property
    def function(self) -> str:
        return re.search(r"def (\w+)", self.source)[1]


CHECKS = (
    Check(("I2", "I3", "I4", "I5", "I13"), '''
def check_tree_is_allocated(after, requests):
    """The tree's KV is allocated: no full slot of a tree node is on the free list, nor the SWA
    slot of a position whose SWA KV is live (a node that is no tombstone), and that SWA slot is
    the one the allocator maps the position's full slot to (kvspec I2 - I5, I13)."""
    free_full = set(free_pages(allocator.full_attn_allocator))
    free_swa = set(free_pages(allocator.swa_attn_allocator))
    mapping = allocator.full_to_swa_index_mapping.tolist()
    for node, full, swa, _ in tree_nodes():
        freed = [slot for slot in full if slot // PAGE_SIZE in free_full]
        assert not freed, (f"{after}: tree node {node.id} holds full slots {freed}, but their pages are free: "
                           f"the next allocation hands them to another request")
        for full_slot, swa_slot in zip(full, swa or ()):
            assert swa_slot // PAGE_SIZE not in free_swa, (
                f"{after}: tree node {node.id} holds live SWA slot {swa_slot} (for full slot {full_slot}), "
                f"but its page {swa_slot // PAGE_SIZE} is free: the next allocation hands it to another request")
            assert mapping[full_slot] == swa_slot, (
                f"{after}: tree node {node.id} holds full slot {full_slot} with live SWA slot {swa_slot}, "
                f"but the allocator maps full slot {full_slot} to SWA slot {mapping[full_slot]}")
''', ("free_pages", "tree_nodes")),
    Check(("I4", "I2"), '''
def check_one_owner(after, requests):
    """No full KV slot has two owners: what a request owns (its row from cache_protected_len
    on) the tree does not hold too, or both free it (kvspec I4)."""
    in_tree = {slot for _, full, _, _ in tree_nodes() for slot in full}
    for req in requests:
        if (kv := kv_of(req)) is None:
            continue
        row, protected, _, allocated = kv
        both = sorted(in_tree.intersection(req_to_token_pool.req_to_token[row, protected:allocated].tolist()))
        assert not both, (f"{after}: request {req.rid} owns full slots {both} (its row from cache_protected_len "
                          f"{protected} on), and the tree holds them too: two owners, which both free them")
''', ("tree_nodes", "kv_of")),
    Check(("I11", "I14"), '''
def check_rows_are_allocated(after, requests):
    """A running request's KV stays allocated: no full slot of its row is on the free list
    (kvspec I11, I14)."""
    free = set(free_pages(allocator.full_attn_allocator))
    for req in requests:
        if (kv := kv_of(req)) is None:
            continue
        row, _, _, allocated = kv
        freed = [slot for slot in req_to_token_pool.req_to_token[row, :allocated].tolist() if slot // PAGE_SIZE in free]
        assert not freed, f"{after}: request {req.rid} still reads full slots {freed} of its row, but they are free"
''', ("free_pages", "kv_of")),
    Check(("I9",), '''
def check_window_bound(after, requests):
    """A decoding request's SWA KV stays bounded: from its third decode step on it holds at
    most WINDOW_BOUND SWA slots from its cursor on (kvspec I9; WIN-5's bound, the window plus
    the tokens decoded between two decode evictions, in whole pages)."""
    for req in requests:
        if (kv := kv_of(req)) is None or req.decode_batch_idx < 3:
            continue
        _, protected, cursor, allocated = kv
        start = max(cursor, protected)
        held = -(-allocated // PAGE_SIZE) * PAGE_SIZE - start
        assert held <= WINDOW_BOUND, (
            f"{after}: request {req.rid} holds {held} SWA slots (positions {start}..{allocated - 1}) after "
            f"{req.decode_batch_idx} decode steps; with window {WINDOW} and decode eviction every "
            f"{EVICTION_INTERVAL} tokens it holds at most {WINDOW_BOUND}")
''', ("kv_of",)),
    Check(("I10",), '''
def check_checkpoint_matches(after, req, inserted):
    """What a checkpoint put into the tree can be matched again: the request's first `inserted`
    tokens match all of them (kvspec I10: the inserted leaf keeps a window of live SWA KV)."""
    key = RadixKey(req.origin_input_ids[:inserted])
    matched = tree_cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
    assert matched == inserted, (
        f"{after}: the checkpoint put {inserted} tokens of request {req.rid} into the tree, but a match of them "
        f"finds {matched}: the new leaf keeps fewer than a window ({WINDOW}) of live SWA tokens")
''', (), when="pd_admit", imports=("sglang.srt.mem_cache.radix_cache:RadixKey",
                                   "sglang.srt.mem_cache.base_prefix_cache:MatchPrefixParams")),
    Check(("I1", "I2", "I3"), '''
def check_drained(after):
    """Every page is free, once, when nothing holds KV: with every request released and the
    whole tree evicted, each pool's free list holds each of its pages once (kvspec I1 - I3)."""
    for name, pool in (("full", allocator.full_attn_allocator), ("SWA", allocator.swa_attn_allocator)):
        free = free_pages(pool)
        twice = sorted({page for page in free if free.count(page) > 1})
        assert not twice, f"{after}: {name} pages {twice} are on the free list twice: freed twice"
        missing = sorted(set(range(1, pool.size // PAGE_SIZE + 1)) - set(free))
        assert not missing, f"{after}: {name} pages {missing} are not free, though nothing holds KV any more"
''', ("free_pages",), when="drain"),
)
"""Each trace is checked by the properties of the clauses its header says it violates;
what needs the tree is left out on the Rust core, which cannot be walked."""


EXTEND_RANGE = '''

def set_extend_range(req, start, end):
    """This round's extend of the request, tokens [start, end): SGLang 0.5.15 sets it with
    set_extend_range, 0.5.14 with set_extend_input_len and fill_len."""
    req._refresh_fill_ids()
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(start, end)
    else:
        req.set_extend_input_len(end - start)
        req.fill_len = end
'''

PD_QUEUE = '''

def prealloc_queue():
    """SGLang's DecodePreallocQueue over these pools and this tree, with what its pre-allocation
    reads of the scheduler: no other request running, in transfer or waiting, no HiCache, no
    HiSparse, a hybrid SWA model, and no decode tokens reserved per request."""
    queue = object.__new__(DecodePreallocQueue)
    queue.req_to_token_pool = req_to_token_pool
    queue.token_to_kv_pool_allocator = allocator
    queue.token_to_kv_pool = allocator.get_kvcache()
    queue.tree_cache = tree_cache
    queue.num_reserved_decode_tokens = 0
    queue.retracted_queue = []
    queue.transfer_queue = SimpleNamespace(queue=[])
    queue.scheduler = SimpleNamespace(
        sliding_window_size=WINDOW, enable_decode_hicache=False, enable_hisparse=False,
        running_batch=SimpleNamespace(reqs=[]), waiting_queue=[], last_batch=None,
        tp_worker=SimpleNamespace(is_hybrid_swa=True))
    return queue
'''
PD_QUEUE_FIELDS = frozenset(re.findall(r"queue\.(\w+) =", PD_QUEUE))
"""What PD_QUEUE sets: exactly what pd_decode.prealloc_queue sets (checked at each admission)."""

HELPERS = "\0helpers"
"""Where the file's helpers go among the recorded lines: after the tree is built."""


# -- the replay -------------------------------------------------------------------------------

def recording_engine(base: type, recorder: Recorder) -> type:
    """The member's engine class, recorded: what it builds and calls at its seams is written
    as the file builds and calls it; what it reads to show kvspec its state is not recorded."""

    class Recorded(base):
        def make_cache(self):
            """The tree, over the pools themselves: what the adapter adds to them to observe
            them (add_free_page_census, before 0.5.20) is not the file's."""
            pools = self.allocator, self.req_to_token_pool
            for proxy in pools:
                recorder.names[id(proxy._target)] = proxy
            self.allocator, self.req_to_token_pool = (proxy._target for proxy in pools)
            try:
                return super().make_cache()
            finally:
                self.allocator, self.req_to_token_pool = pools

        def batch(self, reqs: list, mode: str):
            with recorder.paused():
                batch = super().batch(reqs, mode)
            fields = set(vars(batch))
            if fields != BATCH_FIELDS:
                raise ReproductionError(f"the adapter's batch() sets {sorted(fields ^ BATCH_FIELDS)} unlike "
                                        "reproduce.BATCH: bring them in step")
            for name, value in vars(batch).items():
                setattr(batch, name, unwrap(value))
            proxy = Proxy(recorder, batch)
            iteration = f", forward_iter={batch.forward_iter}" if batch.forward_iter else ""
            mode_literal = recorder.literal(batch.forward_mode)
            recorder.add(["schedule_batch(", *recorder.literal(list(reqs)), ", ", *mode_literal, iteration, ")"], proxy)
            recorder.preset[proxy] = "batch"
            return proxy

        def kv(self, req):
            with recorder.paused():
                return super().kv(req)

        if any(generation.__name__ == "Engine_0_5_14" for generation in base.__mro__):
            def start_extend(self, req, chunk_len: int):
                """The 0.5.14 shim spells the extend range per release (0.5.14 or 0.5.15): so does
                the file (EXTEND_RANGE), so that it runs on both."""
                with recorder.paused():
                    prefix_len, extend_end, fill_len = super().start_extend(req, chunk_len)
                recorder.add(["set_extend_range(", req, f", {prefix_len}, {extend_end})"])
                return prefix_len, extend_end, fill_len

        def refuse_misuse(self, operation, **args):
            with recorder.paused():
                return super().refuse_misuse(operation, **args)

        def out_of_memory(self):
            with recorder.paused():
                return super().out_of_memory()

    return Recorded


@contextlib.contextmanager
def recorded_pd_decode(recorder: Recorder):
    """pd_decode's queue and decode-radix-cache switch, as the file writes them: the queue
    built by PD_QUEUE, the switch as SGLang's own scoped override around the admission."""
    from .. import pd_decode
    build, switch = pd_decode.prealloc_queue, pd_decode.decode_radix_cache

    def prealloc_queue(engine):
        with recorder.paused():
            queue = build(engine)
        fields = set(vars(queue))
        if fields != PD_QUEUE_FIELDS:
            raise ReproductionError(f"pd_decode.prealloc_queue sets {sorted(fields ^ PD_QUEUE_FIELDS)} unlike "
                                    "reproduce.PD_QUEUE: bring them in step")
        for name, value in vars(queue).items():
            setattr(queue, name, unwrap(value))
        recorder.imported(type(queue))
        proxy = Proxy(recorder, queue)
        recorder.add(["prealloc_queue()"], proxy)
        recorder.preset[proxy] = "queue"
        return proxy

    @contextlib.contextmanager
    def decode_radix_cache():
        from sglang.srt.runtime_context import get_disagg
        recorder.imported(get_disagg)
        recorder.add(["with get_disagg().override(disaggregation_decode_enable_radix_cache=True):  "
                      + "# SGLang's decode-side radix cache on"])
        recorder.indent += 1
        try:
            with switch():
                yield
        finally:
            recorder.indent -= 1

    pd_decode.prealloc_queue, pd_decode.decode_radix_cache = prealloc_queue, decode_radix_cache
    try:
        yield
    finally:
        pd_decode.prealloc_queue, pd_decode.decode_radix_cache = build, switch


OPERATIONS = {
    "admit": "admit {rid} ({prompt_len} prompt tokens): the scheduler matches its prompt against the tree and "
             "locks the node the match ends on",
    "pd_admit": "a PD decode server takes {rid} ({prompt_len} prompt tokens, their KV computed by a prefill "
                "server): match, pre-allocate, then checkpoint the prompt into the tree",
    "prefill_chunk": "extend {rid} by its prompt's next chunk (at most {chunk} tokens), then checkpoint it into "
                     "the tree",
    "prefill_batch": "one extend batch (at most {chunks}); the requests whose prompts it completes are "
                     "checkpointed into the tree, or released if their first token ends them",
    "decode": "one decode step of {rid}",
    "finish": "{rid} finishes{stop}; its KV goes into the tree",
    "finish_batch": "one decode batch's results: {finishes} finish, each one's KV going into the tree, "
                    "inside one free group",
    "abort": "{rid} is aborted: its KV is released",
    "retract": "{rid} is retracted: its KV is released, and it waits to be admitted again",
    "evict": "evict up to {full_tokens} full and {swa_tokens} SWA tokens from the tree",
    "match": "the scheduler matches a waiting request's prompt ({prompt_len} tokens) against the tree, "
             "admitting no one (a cache-aware policy ordering its queue)",
    "flush": "the idle server flushes its cache (Scheduler.flush_cache): the tree is reset, the request "
             "and token pools cleared",
    "drain": "the end: every request is released (those decoding finish, the others are aborted), "
             "then the whole tree is evicted",
}


def describe(number: int, op: str, args: dict) -> str:
    words = dict(args, prompt_len=len(args.get("prompt") or ()),
                 chunks=", ".join(f"{chunk['rid']}: {chunk['chunk']} tokens" + (", its first token ending it"
                                                                                  if chunk.get("finish") else "")
                                  for chunk in args.get("chunks", ())),
                 finishes=", ".join(finish["rid"] + (f" (at a stop {finish['trim']} tokens back)" if finish["trim"] else "")
                                    for finish in args.get("finishes", ())),
                 stop=f" at a stop {args['trim']} tokens back" if args.get("trim") else "")
    return f"step {number}: " + OPERATIONS[op].format(**words)


@dataclass
class Recording:
    """What a replay recorded, for the file: its lines, and what the code around them needs."""

    trace: Trace
    member: str
    release: str
    config: object
    """The EngineConfig it ran (the trace's, at the member's policy version)."""
    lines: list[str]
    imports: dict[str, set[str]]
    environment: dict[str, str | None]
    tree: str
    """"legacy", "unified" (a Python tree, walked) or "rust" (a tree that cannot be walked)."""
    tree_root: str
    checks: tuple[Check, ...]
    portable: set[str]
    """The PORTABLE arguments it passes."""
    crashed: int | None
    """The step at which SGLang raised, where it did: the file ends with that call."""


def applies(check: Check, trace: Trace, tree: str) -> bool:
    ops = {step.op for step in trace.steps}
    if check.when != "step" and check.when not in ops:
        return False
    if check.when == "drain":
        return True  # a drain always ends in every page free, once (engine_driver.drain)
    return bool(set(check.clauses) & set(trace.violates)) and (tree != "rust" or "tree_nodes" not in check.uses)


def record(trace: Trace, member: str) -> Recording:
    """Replay the trace on the member with its SGLang objects recorded (this process imports the
    member's release)."""
    from .catalog import MEMBERS
    slug = member.removeprefix("sglang@")
    if not member.startswith("sglang@") or slug not in MEMBERS:
        raise ReproductionError(f"{member!r} is no member of the sglang@ family (catalog.py): e.g. sglang@0.5.18")
    if trace.tier != "engine":
        raise ReproductionError(f"a reproduction is written from an engine-tier trace; this one is {trace.tier}-tier")
    if MEMBERS.members[slug].tree == "chunk":
        raise ReproductionError(f"{member} drives the chunk cache, which this command does not write yet: "
                                f"name a member of a prefix tree (e.g. sglang@0.5.18)")
    adapter = MEMBERS[slug]  # makes its release this process's SGLang
    engine, recorder = build(adapter, trace)
    base = type(engine).__mro__[1]
    environment = {name: os.environ.get(name) for name in ("SGLANG_SWA_EVICTION_INTERVAL", *base.ENVIRONMENT)}
    config = engine.config
    cache = engine.cache._target
    tree = ("legacy" if type(cache).__name__ == "SWARadixCache" else
            "rust" if type(getattr(cache, "tree_core", None)).__module__.endswith("rust_tree_core.adapter") else
            "unified")
    tree_root = "tree_cache.tree_core.root_node" if hasattr(cache, "tree_core") else "tree_cache.root_node"
    checks = tuple(check for check in CHECKS if applies(check, trace, tree))
    names: dict[str, str] = {}
    crashed, invoked = None, set()
    for number, step in enumerate(trace.steps, 1):
        recorder.comment()
        recorder.comment(describe(number, step.op, step.args))
        if step.refuse:
            recorder.comment("(a call the lifecycle forbids: kvspec's adapter refuses it before SGLang is called)")
            continue
        try:
            with recorder.on(), recorded_pd_decode(recorder):
                outcome = drain(engine, recorder) if step.op == "drain" else \
                    getattr(engine, step.op)(*(step.args[name] for name in PARAMETERS[step.op]))
        except Exception as error:
            if not any(statement.raised is error for statement in recorder.statements):
                raise ReproductionError(f"step {number} ({step.op}) failed in kvspec's adapter, not in SGLang: "
                                        f"{type(error).__name__}: {error}") from error
            crashed = number
            break
        for rid, req in engine.requests.items():
            if req not in recorder.preset:
                recorder.preset[req] = names.setdefault(rid, identifier(rid, set(names.values())))
        if isinstance(outcome, OutOfMemory):
            recorder.comment(f"(out of memory: {outcome}; the scheduler would not run this step)")
        after = json.dumps(f"after step {number} ({step.op})")
        if any(check.when == "step" for check in checks):
            recorder.add([f"check({after}, ", *recorder.literal(list(engine.requests.values())), ")"])
            invoked.update(check for check in checks if check.when == "step")
        for check in checks:
            if check.when == "pd_admit" == step.op and step.args["rid"] in engine.requests:
                req = engine.requests[step.args["rid"]]
                recorder.add([f"{check.function}({after}, ", req, f", {engine.kv(req).protected})"])
                invoked.add(check)
            elif check.when == "drain" == step.op:
                recorder.add([f"{check.function}({after})"])
                invoked.add(check)
    return Recording(trace, member, adapter.release, config, render(recorder.statements, recorder.preset),
                     recorder.imports, environment, tree, tree_root,
                     tuple(check for check in checks if check in invoked), recorder.portable, crashed)


def build(adapter, trace: Trace):
    """The member's engine, as its adapter builds it (catalog.make_engine), of its recorded
    class, with what it builds recorded: the server arguments, the pools, the tree."""
    from .. import runtime
    from . import catalog
    from .api_0_5_21 import use_cpu_kernels
    config = trace.engine_config()
    if config.state_slots:
        raise ReproductionError("a trace with recurrent state is not written as a reproduction (yet)")
    config = replace(config, policy=replace(config.policy, version=adapter.policy_version))
    base = catalog.engine_class(Release(adapter.release), adapter.tree)  # its shim first: it may register what runs before import
    s = runtime.sglang()
    use_cpu_kernels(s)  # before the engine sees SGLang through a Namespace (a no-op from 0.5.22)
    recorder = Recorder(s.torch)
    classes, runtime.SGLANG = catalog.engine_class, Namespace(recorder, s)
    catalog.engine_class = lambda release, tree=None: recording_engine(base, recorder)
    try:
        with recorder.on():
            engine = adapter.make_engine(config)
    finally:
        catalog.engine_class, runtime.SGLANG = classes, s
    recorder.add([HELPERS])
    for proxy, name in ((engine.allocator, "allocator"), (engine.req_to_token_pool, "req_to_token_pool"),
                        (engine.cache, "tree_cache")):
        recorder.preset[proxy] = name
    return engine, recorder


def drain(engine, recorder: Recorder) -> None:
    """kvspec's drain (engine_driver.py): finish every decoding request, abort the others, then
    evict the whole tree."""
    for rid in sorted(engine.requests):
        finished = rid in engine.finished_prefill
        recorder.comment(f"{rid} {'finishes' if finished else 'is aborted'}")
        engine.finish(rid, 0) if finished else engine.abort(rid)
    recorder.comment("evict the whole tree")
    engine.evict(engine.config.size_full, engine.config.size_swa)


# -- the file ---------------------------------------------------------------------------------

def repository() -> Path:
    from kvspec.conformance.runs.tree import TREE
    return TREE.parent


def shown(trace_path: Path) -> str:
    """The trace's path as the file names it: from the repository's root where it lies inside."""
    path = trace_path.resolve()
    return path.relative_to(repository()).as_posix() if path.is_relative_to(repository()) else path.name


def finding_of(trace_path: Path):
    """The finding whose regression vector the trace is, if any."""
    return next((finding for finding in FINDINGS if finding.vector
                 and (repository() / finding.vector).resolve() == trace_path.resolve()), None)


def summary(check: Check) -> str:
    """The first sentence of a check's docstring: what it asserts."""
    return re.search(r'"""([^:]*):', check.source)[1].replace("\n    ", " ")


def docstring(recording: Recording, trace_path: Path, out: Path) -> str:
    trace, release, config = recording.trace, recording.release, recording.config
    finding = finding_of(trace_path)
    if finding is None:
        title = f"A kvspec trace on SGLang {release}, shown with SGLang alone."
        verdict = f"It fails where SGLang breaks what it asserts, as {release} does."
    else:
        span = finding.first if finding.first == finding.last else f"{finding.first} - {finding.last}"
        title = f"{finding.id}: a {finding.kind} of SGLang {span}" + (
            f" (fixed in {finding.fixed_in})" if finding.fixed_in else "") + ", shown with SGLang alone."
        verdict = f"It fails on SGLang {release}" + (
            f" and passes on {finding.fixed_in}, which fixed it." if finding.fixed_in else "; no release fixed it.")
    checks = "; ".join(summary(check)[0].lower() + summary(check)[1:] for check in recording.checks)
    knobs = ", ".join(f"{name}={value}" for name, value in recording.environment.items() if value is not None)
    tree = {"legacy": "the legacy SWARadixCache", "unified": "UnifiedRadixCache with its Python tree core",
            "rust": "UnifiedRadixCache with its Rust tree core, which offers no walk of its nodes (what needs "
                    "one is not checked)"}[recording.tree]
    raised = "" if recording.crashed is None else (
        f" Replayed there without the checks, SGLang raised an AssertionError of its own in step "
        f"{recording.crashed}: the file ends with that call.")
    made = (f"Written by kvspec from the trace {shown(trace_path)} (`python -m kvspec.adapters.sglang.releases "
            f"reproduce TRACE --member {recording.member} --out {out.name}`): the SGLang calls that kvspec's "
            f"adapter of SGLang {release} makes for each step, in order, with their arguments, on CPU with tiny "
            f"pools: page size {config.page_size}, window {config.window}, {tree}; {knobs}.{raised}"
            + ("" if finding is None else f" kvspec's account: docs/engines/sglang-findings.md#{finding.id}."))
    paragraphs = [f"Exit status 0: every check held. An AssertionError: the bug, in plain terms. {verdict}",
                  trace.description, f"What it checks: {checks}." if checks else "It checks nothing of its own: "
                  "SGLang's own assertion is what fails.", made]
    body = "\n\n".join(textwrap.fill(paragraph, 96, break_on_hyphens=False) for paragraph in paragraphs
                         if paragraph)
    return f'"""{title}\n\n    PYTHONPATH=<the folder holding SGLang\'s sglang/> python {out.name}\n\n{body}\n"""\n'


def import_lines(imports: dict[str, set[str]]) -> list[str]:
    lines = []
    for module in sorted(imports):
        names = ", ".join(sorted(imports[module]))
        line = f"from {module} import {names}"
        lines.append(line if len(line) <= WIDTH else f"from {module} import (\n    {names},\n)")
    return lines


def joined(blocks: list[str]) -> str:
    """Blocks of code, one blank line apart, or two around a function or class."""
    text = ""
    for block in (block.strip("\n") for block in blocks if block.strip("\n")):
        definition = re.match(r"(def|class|@) ", block) or re.match(r"(def|class) ", text.rsplit("\n\n", 1)[-1])
        text += ("\n\n\n" if definition else "\n\n") + block if text else block
    return text + "\n"


def source(recording: Recording, trace_path: Path, out: Path) -> str:
    """The file: its docstring, the environment, the CPU setup, the imports, then what the
    adapter built (the server arguments, the pools, the tree), the helpers and the checks,
    and the recorded steps."""
    from ..runtime import sglang
    s, config, release, steps = sglang(), recording.config, recording.release, recording.trace.steps
    imports = defaultdict(set, {module: set(names) for module, names in recording.imports.items()})

    def use(value) -> None:
        imports[value.__module__].add(value.__name__)

    standard = ["import os", "import sys", "import types", "import warnings", "from array import array",
                "from types import SimpleNamespace"]
    if recording.portable:
        standard.insert(1, "import inspect")
    environment = ["# SGLang reads its knobs from the environment: this run's, and the release's defaults for the "
                   + "rest."]
    environment += [f"os.environ[{json.dumps(name)}] = {json.dumps(value)}"
                    for name, value in recording.environment.items() if value is not None]
    cleared = [json.dumps(name) for name, value in recording.environment.items() if value is None]
    if cleared:
        environment += [*wrap(f"for name in ({', '.join(cleared)}):"), "    os.environ.pop(name, None)"]
    cpu = []
    if key(release)[:3] <= (0, 5, 21) and config.page_size > 1:
        decodes = any(step.op in ("decode", "drain") for step in steps)
        cpu += [CPU_KERNELS.replace("{paged}", s.paged.__name__).replace(
                    "{and_decode}", ", and for decode 0.5.22's alloc_decode_naive, restated" if decodes else ""),
                CPU_DECODE_KERNEL if decodes else "",
                "paged.alloc_extend_kernel = CpuLaunch(alloc_extend)"
                + ("\npaged.alloc_decode_kernel = CpuLaunch(alloc_decode)" if decodes else "")]
    body = "\n".join(recording.lines)
    helpers = []
    if "schedule_batch(" in body:
        use(s.ScheduleBatch)
        helpers.append(BATCH)
    if "prealloc_queue()" in body:
        helpers.append(PD_QUEUE)
    if re.search(r"^\s*set_extend_range\(", body, re.MULTILINE):
        helpers.append(EXTEND_RANGE)
    checks = []
    observed = {helper for check in recording.checks for helper in check.uses}
    for helper in ("free_pages", "tree_nodes", "kv_of"):
        if helper in observed:
            checks.append(OBSERVE[helper].replace("{root}", recording.tree_root).replace(
                "{read}", TREE_READS.get(recording.tree, "")))
    for check in recording.checks:
        for name in check.imports:
            imports[name.partition(":")[0]].add(name.partition(":")[2])
        checks.append(check.source)
    step_checks = [check.function for check in recording.checks if check.when == "step"]
    if step_checks:
        checks.append('def check(after, requests):\n    """What must hold after every step."""\n'
                      + "".join(f"    {function}(after, requests)\n" for function in step_checks))
    if checks:
        checks[0] = "# -- what must hold " + "-" * (WIDTH - 20) + "\n\n\n" + checks[0].strip("\n")
    if "ComponentType" in "".join(checks):
        use(s.ComponentType)
    bound = decode_window_bound(config.policy.version, config.window, config.page_size,
                                config.policy.decode_eviction_interval)
    constants = [f"{name} = {value}{comment}" for name, value, comment in (
        ("PAGE_SIZE", config.page_size, ""), ("WINDOW", config.window, ""),
        ("EVICTION_INTERVAL", config.policy.decode_eviction_interval, "  # decode eviction's, in tokens"),
        ("WINDOW_BOUND", bound, f"  # WIN-5's, at SGLang {release}'s window retention"))
        if re.search(rf"\b{name}\b", "".join(checks + helpers))]
    constants += [PORTABLE[name][1] for name in sorted(recording.portable)]
    imports["sglang.version"].add("__version__")
    built, _, steps_text = body.partition(HELPERS)
    return joined([
        docstring(recording, trace_path, out), "\n".join(standard), "\n".join(environment), TORCHVISION,
        SHIPPED_CONFIGS if key(release)[:3] <= (0, 5, 19) else "", WARNINGS,
        "import torch\n" + "\n".join(import_lines(imports)), *cpu, "\n".join(constants), built, *helpers, *checks,
        "# -- the trace's steps " + "-" * (WIDTH - 22) + "\n\n" + steps_text.strip("\n"),
        'print(f"SGLang {__version__}: every check held")'])


def reproduce(trace_path: Path, member: str, out: Path) -> str:
    """Write the reproduction of a trace on a member to `out`; returns its text."""
    text = source(record(load(trace_path), member), trace_path, out)
    out.write_text(text)
    return text


def main(trace_path: Path, member: str, out: Path) -> int:
    """The command: 0 once written; 2, with the reason, for a trace, member or output path it
    cannot write a reproduction of or to (a release not installed says how to install it)."""
    try:
        reproduce(trace_path, member, out)
    except (ReproductionError, TraceError, UnavailableMember, OSError) as error:
        print(f"reproduce: {error}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
