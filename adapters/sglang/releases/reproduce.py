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
SGLang's own state in plain terms, written once, chosen by the clauses the trace violates,
asserted after every step.

Its modules, each importing only those above it (beside this one rather than a subpackage:
this package's __main__ imports the command, and a subpackage importing catalog.py back would
be a cycle of subpackages, which tests/test_architecture.py forbids):

    reproduce_preamble.py   what the file sets up before the trace's steps, as the text it writes
    reproduce_recording.py  SGLang seen through recording proxies: the file's statements
    reproduce_rendering.py  the statements as the file's lines
    reproduce_checks.py     what the file asserts (CHECKS)
    reproduce_replay.py     the trace replayed on the member's adapter, recorded and checked
    reproduce.py            the file itself, and the command (main)
"""

import json
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

from kvspec.conformance.harness.families import UnavailableMember
from kvspec.conformance.harness.trace import TraceError, load
from kvspec.spec.window import decode_window_bound

from .catalog import key
from .findings import FINDINGS
from .reproduce_checks import CHECKS, OBSERVE, TREE_READS, Check  # noqa: F401 - CHECKS: re-exported
from .reproduce_preamble import (BATCH, CPU_DECODE_KERNEL, CPU_KERNELS, EXTEND_RANGE, HELPERS, PD_QUEUE, PORTABLE,
                                 SHIPPED_CONFIGS, TORCHVISION, WARNINGS)
from .reproduce_recording import ReproductionError
from .reproduce_rendering import WIDTH, wrap
from .reproduce_replay import Recording, record


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


def fixed_member(member: str, fixed_in: str) -> str:
    """The member of the fixing release on the same tree with the same knobs."""
    release = re.match(r"sglang@([0-9][^-+]*)", member)[1]
    return member.replace(release, fixed_in, 1)


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
        if finding.fixed_in and finding.fix_calls_differ:
            verdict = (f"It fails on SGLang {release}. On {finding.fixed_in}, which fixed it, the calls differ "
                       f"({finding.fix_calls_differ}): the same trace written for it (`--member "
                       f"{fixed_member(recording.member, finding.fixed_in)}`) passes there.")
    checks = "; ".join(summary(check)[0].lower() + summary(check)[1:] for check in recording.checks)
    knobs = ", ".join(f"{name}={value}" for name, value in recording.environment.items() if value is not None)
    tree = {"legacy": "the legacy SWARadixCache", "unified": "UnifiedRadixCache with its Python tree core",
            "rust": "UnifiedRadixCache with its Rust tree core, which offers no walk of its nodes (what needs "
                    "one is not checked)",
            "chunk": "the radix cache disabled (--disable-radix-cache): no prefix is shared, and nothing is "
                     "cached"}[recording.tree]
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
