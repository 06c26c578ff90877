"""Traces: a run of steps as data, in JSON Lines, for counterexamples and conformance vectors.

The first line is a header (format version, kvspec version, tier, configuration with
the policy, adapter, seed), and optionally its front matter, as test262 puts it in front
of a test: `clauses` (what the trace exercises), `needs` (the capabilities a replay needs)
and `violates` (what a regression or divergence must break; front_matter.py writes them,
needs.py reads `needs`). Every other line is one step: the operation, its portable
arguments (sequence indices, request ids, token counts: never slot ids, which differ
between implementations), optionally `refuse` (the spec requires the call to be
refused), `expect` (the observables the spec fixes after the step, from the reference)
and `violated` (the clauses the recorded implementation broke there).

`schemas/trace.schema.json` (JSON Schema 2020-12, `$id` .../trace/1) is the format's
contract, for any language. Loading a trace parses JSON and validates it against the
schema, nothing else: a trace never executes code. A malformed trace raises TraceError
naming the file, the line and what is wrong. JSON is read strictly where parsers of
other languages differ (`read_json`): a key twice in one object is refused, an integral
number written with a fraction or exponent (`16.0`, `1.6e1`) is the integer it is.
Beyond the schema, what a trace shows wrong by itself is refused too (`config_problems`,
`line_problem`, `front_matter_problems`: a clause the spec does not have, a capability
kvspec does not know), and a trace is at most MAX_STEPS steps long.
"""

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kvspec.spec.allocator import validate_pool_config
from kvspec.spec.clauses import load_clauses
from kvspec.spec.group_layouts import layout_problems
from kvspec.spec.models import BLOCK_POOL, MemoryModel, model_of_version
from kvspec.spec.scheduler import SchedulerConfig, validate_scheduler_config
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.state import validate_state_grid
from kvspec.spec.window import EVERY_GROUP, Policy, validate_window_config

from .declarations import Capability
from .outputs import write_text

FORMAT_VERSION = 1
SCHEMA = json.loads((Path(__file__).parent.parent / "schemas" / "trace.schema.json").read_text())
SCHEMA_ID = SCHEMA["$id"]
MAX_LINE = 1 << 20
"""Longest line accepted: a trace is small data, a huge line is a malformed file."""
MAX_FILE = 64 << 20
"""Most bytes read of one trace (or index) file: what is longer is refused unread."""
MAX_STEPS = 100_000
"""Most steps of one trace, refused before any is parsed: the bytes bound alone lets a
file hold a million short steps, which cost the harness minutes and gigabytes to validate
(about 0.25 ms and 1.5 KB each) before the first ran. kvspec's vectors have tens of steps,
a shrunk counterexample fewer; a long decode of 100,000 steps still fits."""
MAX_CONFIG_SLOTS = 1 << 28
"""Most slots (and pages, table entries, state slots) a trace's configuration may ask an
engine to keep: its pools, and at the engine tier its request table (max_requests + 1
rows of size_full + page_size slots, as SGLang's ReqToTokenPool and the reference keep
it) and its state pool. The schema bounds each size alone (int32 slot ids), which still
allows a table of 2^62 slots that nothing can build: such a trace is refused, instead of
the adapter being blamed for not building it. 2^28 int64 entries are 2 GiB."""


def kvspec_version() -> str:
    try:
        return version("kvspec")
    except PackageNotFoundError:
        return "unknown"


def validator(definition: str) -> Draft202012Validator:
    return Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{definition}"})


HEADER = validator("header")
STEPS = {"allocator": validator("allocator_step"), "engine": validator("engine_step"),
         "scheduler": validator("scheduler_step")}
OPERATIONS = {tier: tuple(SCHEMA["$defs"][f"{tier}_args"]) for tier in STEPS}


class TraceError(ValueError):
    """A trace that cannot be read: what is wrong, and where."""


class DuplicateKey(ValueError):
    """A JSON object that names a key twice (read_json)."""

    def __init__(self, key: str):
        super().__init__(f"key {key!r} appears twice in one object; parsers of other languages keep the first, "
                         f"the last, or refuse it, so a kvspec trace or index names each key once: remove one")
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's dict, refusing a key named twice (json's object_pairs_hook)."""
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        raise DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return document


def integral(literal: str) -> int | float | Decimal:
    """A JSON number written with a fraction or an exponent (json's parse_float): the int it
    equals when it is integral, exactly (`16.0`, `1.6e1`, `9007199254740993.0`). JSON
    Schema's "integer" is any number with a zero fraction, so `16.0` is a valid count by
    the schema other languages replay against; kvspec reads it as that count rather than
    passing a float to the implementation. Any other number is no integer, and must stay
    one the schema refuses: a float with a fraction, or, where the float would round to an
    integer (`16.0000000000000000001`, `1e-400`) or the number is past 10^19 (every integer
    of the schema is below 2^63; `1e999999999` makes no int), the exact Decimal."""
    value = Decimal(literal)
    if value.adjusted() < 19 and value == value.to_integral_value():
        return int(value)
    number = float(literal)
    return value if number.is_integer() else number


def not_json(constant: str):
    """NaN and Infinity, which Python's json reads but JSON does not have (parse_constant)."""
    raise ValueError(f"{constant} is not a JSON value")


def read_json(text: str):
    """A JSON document, read as strictly as the trace and index formats require: no key
    twice in an object (DuplicateKey), integral numbers as ints, no NaN or Infinity."""
    return json.loads(text, object_pairs_hook=unique_keys, parse_float=integral, parse_constant=not_json)


@dataclass(frozen=True)
class TraceStep:
    op: str
    args: dict[str, Any] = field(default_factory=dict)
    refuse: bool = False
    expect: dict[str, Any] | None = None
    violated: tuple[str, ...] = ()
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"op": self.op, "args": self.args}
        if self.refuse:
            line["refuse"] = True
        if self.expect is not None:
            line["expect"] = self.expect
        if self.violated:
            line["violated"] = list(self.violated)
        if self.message:
            line["message"] = self.message
        return line

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{'refused? ' if self.refuse else ''}{self.op}({args})"


@dataclass(frozen=True)
class Trace:
    tier: str
    config: dict[str, Any]
    """allocator: page_size, size_full, size_swa; engine: the EngineConfig with its policy;
    scheduler: the SchedulerConfig."""
    adapter: str
    steps: tuple[TraceStep, ...]
    seed: int | None = None
    label: str = ""
    description: str = ""
    kvspec_version: str = field(default_factory=kvspec_version)
    clauses: tuple[str, ...] = ()
    """Front matter: the clauses the trace exercises (front_matter.exercised); () when
    its header does not say."""
    needs: tuple[str, ...] | None = None
    """Front matter: the capabilities a replay of it needs (Capability values); None when
    its header does not say, as in a hand-written trace: then they are derived from its
    steps (needs.py)."""
    violates: tuple[str, ...] = ()
    """Front matter of a regression or divergence: the clauses (or crashed, hung) an
    implementation that has the bug breaks on it, at least one of them; () for any other
    trace."""

    def header(self) -> dict[str, Any]:
        header = {"kvspec_trace": FORMAT_VERSION, "kvspec_version": self.kvspec_version, "tier": self.tier,
                  "config": self.config, "adapter": self.adapter, "seed": self.seed, "label": self.label,
                  "description": self.description}
        # front matter only where it says something, so a trace without it writes as before
        if self.clauses:
            header["clauses"] = list(self.clauses)
        if self.needs is not None:
            header["needs"] = list(self.needs)
        if self.violates:
            header["violates"] = list(self.violates)
        return header

    def engine_config(self) -> EngineConfig:
        config = dict(self.config)
        return EngineConfig(**{**config, "policy": Policy(**config["policy"])})

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(**{**self.config, "groups": tuple(self.config["groups"])})

    @property
    def violated(self) -> tuple[str, ...]:
        """The clauses the recorded run broke, at its first violating step."""
        return next((step.violated for step in self.steps if step.violated), ())

    def dumps(self) -> str:
        lines = [self.header(), *(step.to_json() for step in self.steps)]
        return "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)

    def save(self, path: str | Path) -> Path:
        """Write the trace to `path` (a link planted at the name is replaced, never followed)."""
        return write_text(path, self.dumps())


def engine_config_json(config: EngineConfig) -> dict[str, Any]:
    """The configuration as a trace's header writes it; a model without recurrent state
    leaves the state pool out, so its traces read as they did before chapter 09."""
    fields = {**asdict(config), "policy": policy_json(config.policy)}
    if not config.state_slots:
        del fields["state_slots"], fields["state_grid"]
    if tuple(config.layout) == EVERY_GROUP:  # traces read as they did before layouts (BLOCK-11)
        del fields["layout"]
    else:
        fields["layout"] = list(config.layout)
    return fields


def policy_json(policy: Policy) -> dict[str, Any]:
    """A policy as a trace's header writes it: a setting at the spec's default is left out, so
    traces read as they did before it was a choice (chunk release, WIN-4; the null block's
    count kept, BLOCK-3; uncached blocks first in every group, BLOCK-10)."""
    fields = asdict(policy)
    if policy.chunk_release:
        del fields["chunk_release"]
    if policy.null_block_counted:
        del fields["null_block_counted"]
    if set(policy.uncached_first) == set(EVERY_GROUP):
        del fields["uncached_first"]
    else:
        fields["uncached_first"] = list(policy.uncached_first)
    return fields


def problem(where: str, errors: Iterable) -> TraceError:
    error = best_match(errors)
    at = "/".join(str(part) for part in error.absolute_path)
    return TraceError(f"{where}: {at + ': ' if at else ''}{error.message}")


def parse(text: str, source: str = "<trace>") -> Trace:
    """A trace from its JSON Lines text; TraceError if it is not a valid kvspec trace."""
    # JSON Lines separates lines by "\n" only (a "\r" before it is JSON whitespace):
    # str.splitlines() would also split at U+2028 and others, valid inside a JSON string
    lines = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not lines:
        raise TraceError(f"{source}: empty; a trace starts with a header line (see {SCHEMA_ID})")
    if len(lines) - 1 > MAX_STEPS:
        raise too_long(source, len(lines) - 1)
    documents = []
    for number, line in lines:
        if len(line) > MAX_LINE:
            raise TraceError(f"{source} line {number}: longer than {MAX_LINE} characters")
        try:
            documents.append((number, line, read_json(line)))
        except DuplicateKey as error:
            raise TraceError(f"{source} line {number}: {error}") from None
        except (ValueError, RecursionError) as error:  # ValueError: also an integer of thousands of digits
            raise TraceError(f"{source} line {number}: not JSON ({error}); a trace line is one JSON object "
                             f"(see {SCHEMA_ID})") from None
    (number, _, header), steps = documents[0], documents[1:]
    if not isinstance(header, dict) or "kvspec_trace" not in header:
        raise TraceError(f"{source} line {number}: not a kvspec trace header (no 'kvspec_trace' key)")
    if header["kvspec_trace"] != FORMAT_VERSION:
        raise TraceError(f"{source}: trace format version {header['kvspec_trace']!r}; this kvspec reads "
                         f"version {FORMAT_VERSION}")
    if errors := list(HEADER.iter_errors(header)):
        raise problem(f"{source} line {number} (header)", errors)
    tier, config = header["tier"], header["config"]
    if problems := config_problems(tier, config):
        raise TraceError(f"{source} line {number} (header): invalid config: " + "; ".join(problems))
    if problems := front_matter_problems(header):
        raise TraceError(f"{source} line {number} (header): " + "; ".join(problems))
    model = model_of_version(config["policy"]["version"], bool(config.get("state_slots"))) \
        if tier == "engine" else None
    parsed = []
    checked: set[str] = set()  # lines already found valid: a long trace repeats its steps
    for number, line, step in steps:
        if line not in checked:
            if isinstance(step, dict) and isinstance(step.get("op"), str) and step["op"] not in OPERATIONS[tier]:
                raise TraceError(f"{source} line {number}: unknown {tier} operation {step['op']!r}; "
                                 f"known: {', '.join(OPERATIONS[tier])}")
            if errors := list(STEPS[tier].iter_errors(step)):
                raise problem(f"{source} line {number}", errors)
            if why := line_problem(tier, step, model, config):
                raise TraceError(f"{source} line {number}: {why}")
            checked.add(line)
        parsed.append(TraceStep(step["op"], step["args"], step.get("refuse", False), step.get("expect"),
                                tuple(step.get("violated", ())), step.get("message")))
    return Trace(tier, config, header["adapter"], tuple(parsed), header.get("seed"),
                 header.get("label", ""), header.get("description", ""), header["kvspec_version"],
                 tuple(header.get("clauses", ())), tuple(header["needs"]) if "needs" in header else None,
                 tuple(header.get("violates", ())))


def too_long(source: str, steps: int) -> TraceError:
    return TraceError(f"{source}: {steps} steps, more than the {MAX_STEPS} kvspec reads of one trace; "
                      f"split it into shorter traces")


def config_problems(tier: str, config: dict[str, Any]) -> list[str]:
    """What is wrong with a header's configuration (valid by the schema) by the spec's
    rules (MODEL-4, STATE-3) and by MAX_CONFIG_SLOTS, as sentences that say how to fix it."""
    if tier == "scheduler":
        problems = validate_scheduler_config(SchedulerConfig(**{**config, "groups": tuple(config["groups"])}))
        slots = {"pages": config["pages"]}
    else:
        problems = validate_pool_config(config["size_full"], config["size_swa"], config["page_size"])
        slots = {"size_full": config["size_full"], "size_swa": config["size_swa"]}
    if tier == "engine":
        problems += validate_window_config(config["window"], config["page_size"], Policy(**config["policy"]))
        if "layout" in config:
            problems += layout_problems(config["layout"])
            if model_of_version(config["policy"]["version"]) is not BLOCK_POOL:
                problems.append("a layout of attention groups (BLOCK-11) is a shared block pool's; the two-pool "
                                "model has one full and one SWA pool: leave layout out")
        slots["(max_requests + 1) x (size_full + page_size)"] = \
            (config["max_requests"] + 1) * (config["size_full"] + config["page_size"])
        if config.get("state_slots"):
            problems += validate_state_grid(config.get("state_grid", 1), config["page_size"])
            slots["state_slots"] = config["state_slots"]
    if sum(slots.values()) > MAX_CONFIG_SLOTS:
        problems.append(f"{' + '.join(slots)} = {sum(slots.values())}, more than the {MAX_CONFIG_SLOTS} slots kvspec "
                        f"builds an implementation with (its pools, request table and state pool); use smaller sizes")
    return problems


OUTCOMES_WITHOUT_CLAUSE = ("crashed", "hung")
"""What a trace may record as broken besides a clause: the implementation raised what the
spec does not allow, died, or stopped making progress."""


@cache
def clause_ids() -> tuple[str, ...]:
    """The spec's clause ids, in the chapters' order."""
    return tuple(load_clauses())


def front_matter_problems(header: dict[str, Any]) -> list[str]:
    """What a header's front matter (valid by the schema) names that does not exist: a
    clause the spec's chapters do not have, a capability kvspec.conformance.harness.
    declarations.Capability does not list; as sentences that say how to fix it."""
    problems = []
    known = set(clause_ids())
    if unknown := [clause for clause in header.get("clauses", ()) if clause not in known]:
        problems.append(f"clauses names {', '.join(unknown)}, which the spec has no clause of (its clauses are "
                        f"the headings of spec/*.md, e.g. I10, LIFE-4): fix the id or drop it")
    if unknown := [clause for clause in header.get("violates", ())
                   if clause not in known and clause not in OUTCOMES_WITHOUT_CLAUSE]:
        problems.append(f"violates names {', '.join(unknown)}, which is neither a clause of the spec nor "
                        f"{' nor '.join(OUTCOMES_WITHOUT_CLAUSE)}: fix the id or drop it")
    names = [capability.value for capability in Capability]
    if unknown := [need for need in header.get("needs", ()) if need not in names]:
        problems.append(f"needs names {', '.join(unknown)}, which is no capability kvspec knows (it knows "
                        f"{', '.join(names)}): fix the name or drop it")
    return problems


def line_problem(tier: str, step: dict[str, Any], model: MemoryModel | None, config: dict[str, Any]) -> str | None:
    """What a step line (valid by the schema) shows wrong by itself: a submission with
    more outputs than its max_new_tokens (SCHED-4), an expectation of an observable the
    header's memory model does not fix (OBS-3)."""
    args = step["args"]
    if tier == "scheduler" and step["op"] == "submit" and len(args["outputs"]) > args["max_new_tokens"]:
        return (f"request {args['rid']!r} has {len(args['outputs'])} outputs, more than its max_new_tokens "
                f"{args['max_new_tokens']}; a request ends at its max_new_tokens: drop the outputs past it")
    if model is not None and (foreign := [key for key in step.get("expect") or () if key not in model.fixed]):
        return (f"expect names {', '.join(foreign)}, which the {model.name} memory model of the header's policy "
                f"version {config['policy']['version']} does not fix (it fixes {', '.join(model.fixed)}): "
                f"the policy version or the expectations are wrong")
    return None


def read_bounded(path: str | Path, limit: int = MAX_FILE, what: str = "trace") -> bytes:
    """The bytes of a regular file of at most `limit` bytes, else TraceError. A link, a
    directory, a FIFO or a device is refused before it is opened (a FIFO would block, a
    device never end, a link may lead outside the corpus); the file is opened without
    following a link and without blocking, and checked again once open, so a file
    swapped in between is refused too."""
    path = Path(path)
    kinds = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO",
             stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode):
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            with os.fdopen(descriptor, "rb") as file:
                mode = os.fstat(file.fileno()).st_mode
                data = file.read(limit + 1) if stat.S_ISREG(mode) else b""
    except OSError as error:
        raise TraceError(f"cannot read {what} {path}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise TraceError(f"{what} {path} is {kinds.get(stat.S_IFMT(mode), 'not a regular file')}, not a file: "
                         f"kvspec reads traces and indexes from regular files only; copy the file there")
    if len(data) > limit:
        raise TraceError(f"{what} {path} is longer than {limit} bytes, more than kvspec reads of one; "
                         f"is it a {what}?")
    return data


def load(path: str | Path, data: bytes | None = None) -> Trace:
    """The trace in the file at `path` (read_bounded), or in `data` already read from it."""
    path = Path(path)
    data = read_bounded(path) if data is None else data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return parse(text, str(path))
