"""The vectors tree: where each trace lives, its index, and what a replay reads of it.

One tree holds every trace kvspec keeps (vectors/INTERPRETING.md tells a runner in any
language how to read it), laid out by what each trace is:

    conformance/allocator/                      the allocator tier's vectors
    conformance/engine/<memory model>/<policy version>/   the engine tier's
    conformance/scheduler/                      the scheduler tier's
    regressions/<engine>/   bugs found in an engine's releases (kvspec.adapters.sglang.releases)
    divergences/<engine>/   an engine's known divergences (kvspec.adapters.<engine>.divergences)
    tests/                  traces kvspec's own tests replay
    examples/               the traces the docs draw (docs/examples/ writes one)

and one `index.json` at its root lists every trace by its path relative to the root, with
its step count and SHA-256, so a replay notices a trace that is missing, altered or not
listed (schemas/index.schema.json, version 2; version 1 is a flat directory of plain
names). Replaying a directory replays every trace under it, each checked against the
index of the tree that holds it: the nearest `index.json` in its directory or above it;
every trace that index lists under the directory must be there. A trace named alone is
checked against that index where it lists the trace. Nothing is read through a link
inside a tree, every file is a regular file read within a bound, and the whole replay
within MAX_CORPUS_BYTES and MAX_CORPUS_STEPS, counted before any trace is parsed.

The tree ships with kvspec (the package `kvspec.vectors`, from the repository's
`vectors/`), so TREE is the repository's `vectors/` in a checkout and the installed copy
in a wheel.
"""

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kvspec.spec.models import model_of_version

from ..harness.trace import MAX_STEPS, DuplicateKey, Trace, TraceError, load, read_bounded, read_json, too_long

TREE = Path(__file__).resolve().parents[2] / "vectors"
"""kvspec's vectors tree: the repository's vectors/ (conformance/runs/ is two levels
below the root), or, installed, the package kvspec.vectors beside kvspec.conformance."""
CONFORMANCE = "conformance"
"""The sub-tree of the conformance vectors `kvspec vectors` writes."""
INDEX = "index.json"
INDEX_VERSION = 2
INDEX_SCHEMA = json.loads((Path(__file__).parent.parent / "schemas" / "index.schema.json").read_text())
INDEX_VALIDATOR = Draft202012Validator(INDEX_SCHEMA)
MAX_INDEX = 16 << 20
"""Most bytes read of an index.json: a vector takes about 130 bytes of it."""
MAX_CORPUS_BYTES = 256 << 20
"""Most bytes of traces read from one corpus: every file is read, checked against the
index and parsed before the first runs, so the per-file bound alone would let a corpus of
many files hold the harness's memory hostage. kvspec's own tree is under 1 MiB."""
MAX_CORPUS_STEPS = 4 * MAX_STEPS
"""Most steps of all the traces of one corpus, counted before any is parsed (each costs the
harness about 0.25 ms and 1.5 KB to validate and hold: this many, under two minutes and
a GB). kvspec's own tree has a few thousand."""


def folder(trace: Trace) -> PurePosixPath:
    """Where a conformance vector lives in the tree: by tier, and at the engine tier by the
    memory model and policy version of its header (a recurrent-state pool makes the
    model's state variant, spec chapter 09)."""
    if trace.tier != "engine":
        return PurePosixPath(CONFORMANCE, trace.tier)
    version = trace.config["policy"]["version"]
    model = model_of_version(version, bool(trace.config.get("state_slots")))
    return PurePosixPath(CONFORMANCE, trace.tier, model.name, version)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the files of a tree ---------------------------------------------------------------------------

def tree_files(directory: Path) -> list[Path]:
    """Every *.jsonl under `directory`, its sub-directories' too, in a stable order. A link to
    a directory inside it is refused, never followed (it may lead anywhere); what is named
    *.jsonl and is not a regular file is listed, for read_bounded to refuse by what it is."""
    found = []

    def unreadable(error: OSError):
        raise TraceError(f"cannot read directory {error.filename}: {error.strerror}")

    for here, directories, names in os.walk(directory, onerror=unreadable):
        for name in list(directories):
            if os.path.islink(os.path.join(here, name)):
                raise TraceError(f"{os.path.join(here, name)} is a symbolic link to a directory: kvspec reads the "
                                 f"traces of a tree from its own directories only, never through a link; copy "
                                 f"the traces there, or replay the directory the link leads to")
            if name.endswith(".jsonl"):  # a directory in place of a trace: refused as such, not walked
                directories.remove(name)
                found.append(Path(here, name))
        found += [Path(here, name) for name in names if name.endswith(".jsonl")]
    if not found:
        raise TraceError(f"{directory}: no *.jsonl traces in this directory or under it")
    return sorted(found, key=lambda path: path.relative_to(directory).parts)


def relative(path: Path, root: Path) -> str:
    """The path of a trace as an index lists it: relative to the tree's root, with forward
    slashes (the directories resolved, the file itself never: a link stays a link)."""
    return PurePosixPath(real(path).relative_to(root)).as_posix()


# -- the index -----------------------------------------------------------------------------------------

def write_index(root: Path, seed: int | None) -> list[dict]:
    """Index every trace of the tree at `root` (each read and parsed, so only a valid
    trace is listed) in `root/index.json`; its entries."""
    root = Path(os.path.realpath(root))
    entries = []
    for path in tree_files(root):
        data = read_bounded(path)
        entries.append({"file": relative(path, root), "steps": len(load(path, data).steps), "sha256": sha256(data)})
    (root / INDEX).write_text(json.dumps({"kvspec_vectors": INDEX_VERSION, "seed": seed, "vectors": entries},
                                         indent=1) + "\n")
    return entries


def index_document(path: Path):
    """The JSON of an index.json, read as strictly as a trace (read_json), within MAX_INDEX."""
    data = read_bounded(path, MAX_INDEX, "index")
    try:
        return read_json(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); "
                         f"rewrite it with `kvspec vectors --out DIR`") from None
    except DuplicateKey as error:
        raise TraceError(f"{path}: {error}, or rewrite it with `kvspec vectors --out DIR`") from None
    except (ValueError, RecursionError) as error:
        raise TraceError(f"{path}: not JSON ({error}); rewrite it with `kvspec vectors --out DIR`") from None


def is_index(document) -> bool:
    """Whether a JSON document says it is a kvspec vector index (valid or not)."""
    return isinstance(document, dict) and "kvspec_vectors" in document


def index_entries(path: Path, index) -> dict[str, dict]:
    """The entries of an index by path, validated against schemas/index.schema.json (so
    every path is relative and inside the tree: no `..`, no leading `/` or `.`); TraceError
    naming what is wrong."""
    if errors := list(INDEX_VALIDATOR.iter_errors(index)):
        error = best_match(errors)
        at = "/".join(str(part) for part in error.absolute_path)
        raise TraceError(f"{path}: not a kvspec vector index ({INDEX_SCHEMA['$id']}): {at + ': ' if at else ''}"
                         f"{error.message}; rewrite it with `kvspec vectors --out DIR`")
    listed: dict[str, dict] = {}
    for entry in index["vectors"]:
        if entry["file"] in listed:
            raise TraceError(f"{path}: {entry['file']} is listed twice; each vector is listed once: "
                             f"rewrite it with `kvspec vectors --out DIR`")
        listed[entry["file"]] = entry
    return listed


class Indexes:
    """The index of the tree that holds each directory of a replay: the nearest index.json
    in that directory or above it, each read once. One at or below the directory replayed
    must be a kvspec index; one above it that is JSON but no kvspec index (another tool's)
    is passed over; any that says it is kvspec's must be valid."""

    def __init__(self, replayed: Path):
        self.replayed = Path(os.path.realpath(replayed))
        self.read: dict[Path, dict[str, dict] | None] = {}
        self.nearest: dict[Path, Path | None] = {}

    def root_of(self, directory: Path) -> Path | None:
        """The root of the tree that holds `directory`, or None where none does."""
        directory = Path(os.path.realpath(directory))
        if directory not in self.nearest:
            self.nearest[directory] = next((root for root in (directory, *directory.parents)
                                            if self.entries(root) is not None), None)
        return self.nearest[directory]

    def entries(self, root: Path) -> dict[str, dict] | None:
        """The entries of root/index.json by path; None where there is none, or another tool's."""
        if root not in self.read:
            self.read[root] = None
            if os.path.lexists(root / INDEX):
                document = index_document(root / INDEX)
                inside = root == self.replayed or self.replayed in root.parents
                if is_index(document) or inside:
                    self.read[root] = index_entries(root / INDEX, document)
        return self.read[root]


# -- what a replay reads ---------------------------------------------------------------------------

def corpus(target: Path) -> dict[Path, Trace]:
    """The traces to replay: a trace file, or every trace under a directory (tree_files),
    each read once (read_bounded: regular files only, at most a bound) and parsed. Each is
    checked against the index of the tree that holds it (Indexes; of a link named on the
    command line, the tree of the file it leads to): a trace it does not list, one altered
    (SHA-256) or of another step count, or one it lists under the directory replayed that
    is missing, is an error (TraceError). A file no index lists, replayed alone, is not
    checked. At most MAX_CORPUS_BYTES and MAX_CORPUS_STEPS in all, checked before any
    trace is parsed."""
    target = Path(target)
    if target.is_dir():
        files, start = tree_files(target), target
    elif os.path.lexists(target):
        files = [target.resolve() if target.is_symlink() else target]  # a link named alone is the user's choice
        start = files[0].parent
    else:
        raise TraceError(f"no such trace file or directory: {target}")
    data = bounded_corpus(start, files)
    indexes = Indexes(start)
    listed = {}  # each trace its tree's index holds: (its path there, the tree's root)
    problems: dict[Path, list[str]] = {}  # by the root of the tree whose index they contradict
    for path in files:
        if (root := indexes.root_of(path.parent)) is None:
            continue
        if (name := relative(path, root)) in indexes.entries(root):
            listed[path] = name, root
        elif target.is_dir():  # alone, a trace its index does not list is not checked
            problems.setdefault(root, []).append(f"{name} is not listed in {INDEX}")
    if target.is_dir():  # every trace listed under the directory is there
        within, found = Path(os.path.realpath(start)), {real(path) for path in files}
        for root in {indexes.root_of(start), *(root for _, root in listed.values())} - {None}:
            problems.setdefault(root, []).extend(
                f"{name} is listed but missing" for name in indexes.entries(root)
                if (root / name).is_relative_to(within) and root / name not in found)
    for path, (name, root) in listed.items():
        if sha256(data[path]) != indexes.entries(root)[name]["sha256"]:
            problems.setdefault(root, []).append(f"{name} was altered (its SHA-256 differs from the index)")
    traces = {} if any(problems.values()) else {path: load(path, content) for path, content in data.items()}
    for path, (name, root) in listed.items():
        if path in traces and len(traces[path].steps) != (steps := indexes.entries(root)[name]["steps"]):
            problems.setdefault(root, []).append(f"{name} has {len(traces[path].steps)} steps, the index lists "
                                                 f"{steps}")
    if any(problems.values()):
        raise TraceError(" ".join(f"{root / INDEX}: the traces of its tree do not match it: {'; '.join(wrong)}."
                                  for root, wrong in problems.items() if wrong)
                         + " Write the tree's index again with `kvspec vectors --out DIR`")
    return traces


def real(path: Path) -> Path:
    """A trace's path with its directories resolved, the file itself never (a link stays a link)."""
    return Path(os.path.realpath(path.parent), path.name)


def bounded_corpus(directory: Path, files: list[Path]) -> dict[Path, bytes]:
    """The bytes of every file, read_bounded each, within MAX_CORPUS_BYTES in all and
    MAX_CORPUS_STEPS lines (a step is a line), else TraceError before anything is parsed."""
    data: dict[Path, bytes] = {}
    total = steps = 0
    for path in files:
        data[path] = content = read_bounded(path)
        total += len(content)
        if total > MAX_CORPUS_BYTES:
            raise TraceError(f"{directory}: its traces hold more than {MAX_CORPUS_BYTES} bytes, more than kvspec "
                             f"reads of one corpus; replay it in parts (a file, or a directory of fewer traces)")
        lines = len([line for line in content.split(b"\n") if line.strip()])
        if lines - 1 > MAX_STEPS:  # less the header
            raise too_long(str(path), lines - 1)
        steps += lines - 1
        if steps > MAX_CORPUS_STEPS:
            raise TraceError(f"{directory}: its traces hold more than {MAX_CORPUS_STEPS} steps, more than kvspec "
                             f"replays of one corpus; replay it in parts (a file, or a directory of fewer traces)")
    return data


def trace_name(path: Path, target: Path) -> str:
    """How a replay names a trace: its path under the directory replayed, or its file name."""
    return path.relative_to(target).as_posix() if Path(target).is_dir() else path.name
