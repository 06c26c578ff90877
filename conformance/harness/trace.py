"""Traces: a run of steps as data, in JSON Lines, for counterexamples and conformance vectors.

The first line is a header (format version, kvspec version, tier, configuration with
the policy, adapter, seed); every other line is one step: the operation, its portable
arguments (sequence indices, request ids, token counts: never slot ids, which differ
between implementations), optionally `refuse` (the spec requires the call to be
refused), `expect` (the observables the spec fixes after the step, from the reference)
and `violated` (the clauses the recorded implementation broke there).

`schemas/trace.schema.json` (JSON Schema 2020-12, `$id` .../trace/1) is the format's
contract, for any language. Loading a trace parses JSON and validates it against the
schema, nothing else: a trace never executes code. A malformed trace raises TraceError
naming the file, the line and what is wrong.
"""

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kvspec.spec.allocator import validate_pool_config
from kvspec.spec.scheduler import SchedulerConfig, validate_scheduler_config
from kvspec.spec.snapshot import EngineConfig
from kvspec.spec.window import Policy, validate_window_config

FORMAT_VERSION = 1
SCHEMA = json.loads((Path(__file__).parent.parent / "schemas" / "trace.schema.json").read_text())
SCHEMA_ID = SCHEMA["$id"]
MAX_LINE = 1 << 20
"""Longest line accepted: a trace is small data, a huge line is a malformed file."""
MAX_FILE = 64 << 20
"""Most bytes read of one trace (or index) file: what is longer is refused unread."""


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

    def header(self) -> dict[str, Any]:
        return {"kvspec_trace": FORMAT_VERSION, "kvspec_version": self.kvspec_version, "tier": self.tier,
                "config": self.config, "adapter": self.adapter, "seed": self.seed, "label": self.label,
                "description": self.description}

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
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.dumps())
        return path


def engine_config_json(config: EngineConfig) -> dict[str, Any]:
    """The configuration as a trace's header writes it; a model without recurrent state
    leaves the state pool out, so its traces read as they did before chapter 09."""
    fields = asdict(config)
    if not config.state_slots:
        del fields["state_slots"], fields["state_grid"]
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
    documents = []
    for number, line in lines:
        if len(line) > MAX_LINE:
            raise TraceError(f"{source} line {number}: longer than {MAX_LINE} characters")
        try:
            documents.append((number, json.loads(line)))
        except (ValueError, RecursionError) as error:  # ValueError: also an integer of thousands of digits
            raise TraceError(f"{source} line {number}: not JSON ({error}); a trace line is one JSON object "
                             f"(see {SCHEMA_ID})") from None
    (number, header), steps = documents[0], documents[1:]
    if not isinstance(header, dict) or "kvspec_trace" not in header:
        raise TraceError(f"{source} line {number}: not a kvspec trace header (no 'kvspec_trace' key)")
    if header["kvspec_trace"] != FORMAT_VERSION:
        raise TraceError(f"{source}: trace format version {header['kvspec_trace']!r}; this kvspec reads "
                         f"version {FORMAT_VERSION}")
    if errors := list(HEADER.iter_errors(header)):
        raise problem(f"{source} line {number} (header)", errors)
    tier = header["tier"]
    parsed = []
    for number, step in steps:
        if isinstance(step, dict) and isinstance(step.get("op"), str) and step["op"] not in OPERATIONS[tier]:
            raise TraceError(f"{source} line {number}: unknown {tier} operation {step['op']!r}; "
                             f"known: {', '.join(OPERATIONS[tier])}")
        if errors := list(STEPS[tier].iter_errors(step)):
            raise problem(f"{source} line {number}", errors)
        parsed.append(TraceStep(step["op"], step["args"], step.get("refuse", False), step.get("expect"),
                                tuple(step.get("violated", ())), step.get("message")))
    config = header["config"]
    if tier == "scheduler":
        problems = validate_scheduler_config(SchedulerConfig(**{**config, "groups": tuple(config["groups"])}))
    else:
        problems = validate_pool_config(config["size_full"], config["size_swa"], config["page_size"])
    if tier == "engine":
        problems += validate_window_config(config["window"], config["page_size"], Policy(**config["policy"]))
    if problems:
        raise TraceError(f"{source} line {documents[0][0]} (header): invalid config: " + "; ".join(problems))
    return Trace(tier, header["config"], header["adapter"], tuple(parsed), header.get("seed"),
                 header.get("label", ""), header.get("description", ""), header["kvspec_version"])


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


def trace_files(path: str | Path) -> list[Path]:
    """A trace file, or every *.jsonl of a corpus directory, in a stable order."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("*.jsonl"))
        if not found:
            raise TraceError(f"{path}: no *.jsonl traces in this directory")
        return found
    if not path.exists():
        raise TraceError(f"no such trace file or directory: {path}")
    return [path.resolve() if path.is_symlink() else path]  # a link named on the command line is the user's choice
