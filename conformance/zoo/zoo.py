"""`kvspec zoo`: every seeded bug, run against the conformance suite, must be caught.

A conformance suite is as good as the bugs it catches. The zoo runs each mutant (a
reference mutant of kvspec.adapters.mutants; where SGLang is installed, each bug patched
into real SGLang by kvspec.adapters.sglang.mutants; where vLLM is installed, each bug
patched into real vLLM by kvspec.adapters.vllm.mutants) on the run that exposes it,
at the `ci` profile, and checks that it is caught by a violation of the invariant class
it breaks. A mutant's search has room past the profile's examples (ROOM): it ends at
the first counterexample, so only a mutant that is hard to find pays for the room, and a
bug the check finds in example 400 of a seed is not called missed at that seed. A
mutant that passes, crashes, hangs, or is caught by another class is a miss: the exit
status is 1 and the table says which.

The table: per mutant, the clauses that caught it, the length of the shrunk
counterexample (a trace that `kvspec replay` reproduces), and the seconds to the first
counterexample (before shrinking). `--json F` writes the same as a zoo/2 document
(schemas/zoo.schema.json; each run in it is a run of report/2). Interrupted (Ctrl-C,
SIGTERM, SIGHUP), it writes what finished, marked interrupted.
"""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jsonschema
from referencing import Registry, Resource

from kvspec.spec.invariants import INVARIANTS

from ..harness.declarations import CRASH, Run
from ..harness.families import Family, seeded_families
from ..harness.isolation import LOAD_SECONDS, run_jobs
from ..harness.outputs import output_directory, output_file, write_text
from ..harness.profiles import PROFILES
from ..harness.protocol import AdapterError
from ..harness.trace import kvspec_version
from ..reports.json_report import load_report_schema, run_json
from ..reports.model import INTERRUPTS, SCHEMAS, RunResult, utc_now
from ..reports.text import aligned
from ..runs.plan import plan
from ..runs.runner import Job, declared, isolated_check, lost_check

ZOO_SCHEMA_ID = "https://kvspec.dev/schemas/zoo/2"
CLASS_OF_CLAUSE = {invariant.clause: invariant.invariant_class for invariant in INVARIANTS}
IMPLEMENTATION_ORDER = {"reference": 0, "sglang": 1, "vllm": 2}
"""The order of the table: kvspec's own reference first (a family of another package last)."""


def ordered_families() -> list[Family]:
    """Every registered family, in the table's order."""
    return sorted(seeded_families(), key=lambda f: (IMPLEMENTATION_ORDER.get(f.implementation, len(IMPLEMENTATION_ORDER)),
                                             f.prefix))


@dataclass(frozen=True)
class Specimen:
    """One mutant of the zoo: which adapter carries the bug, and how it must be caught."""

    implementation: str  # "reference" | "sglang" | "vllm"
    adapter: str  # the adapter spec a worker loads, e.g. "mutant-stale-mapping"
    slug: str
    exposed_by: Run  # the run that exposes it, at the mutant's own policy version
    clause: str
    invariant_class: str  # an invariant class, or CRASH
    reverts: str
    crash_message: str = ""


def specimens(family: Family) -> list[Specimen]:
    # a mutant that reverts no SGLang fix, or is never seen as a crash, declares neither
    # `reverts` nor `crash_message`
    return [Specimen(family.implementation, f"{family.prefix}{slug}", slug, mutant.exposed_by, mutant.clause,
                     mutant.invariant_class, getattr(mutant, "reverts", ""), getattr(mutant, "crash_message", ""))
            for slug, mutant in sorted(family.members().items())]


def implementations() -> tuple[str, ...]:
    """What the registered families are built on ("reference", "sglang", "vllm", ...)."""
    return tuple(dict.fromkeys(family.implementation for family in ordered_families()))


def collect(chosen_implementations: tuple[str, ...], only: list[str] | None) -> list[Specimen]:
    """The zoo's specimens for the chosen implementations, those named by `only` if given."""
    chosen = []
    for family in ordered_families():
        if family.implementation not in chosen_implementations:
            continue
        if not family.installed():
            raise AdapterError(f"the {family.implementation} mutants need {family.requires or family.shown_as}: "
                               f"{family.install} "
                               f"(or --implementation reference)")
        chosen += specimens(family)
    if only:
        unknown = [text for text in only if not any(text in specimen.adapter for specimen in chosen)]
        if unknown:
            raise AdapterError(f"no mutant matches --only {', '.join(unknown)}; the mutants are: "
                               + ", ".join(specimen.adapter for specimen in chosen))
        chosen = [specimen for specimen in chosen if any(text in specimen.adapter for text in only)]
    return chosen


# -- judging ---------------------------------------------------------------------------------

def detected_classes(result: RunResult) -> list[str]:
    """The invariant classes the run's first counterexample or its shrunk one broke (the
    shrinker may end on another failure of the same bug: a shorter crash, say)."""
    clauses = {*result.first_failure_clauses, *result.clauses}
    return sorted({CLASS_OF_CLAUSE[clause] for clause in clauses if clause in CLASS_OF_CLAUSE})


def caught(specimen: Specimen, result: RunResult) -> bool:
    """Caught as claimed: a violation of the mutant's class, by the first counterexample or
    the shrunk one; or a crash showing the message the mutant declares (its only
    manifestation, for a CRASH mutant, or the same bug's other one)."""
    crashed_as_declared = (result.verdict == "crashed" and bool(specimen.crash_message)
                           and specimen.crash_message in result.message)
    if specimen.invariant_class == CRASH:
        return crashed_as_declared
    return crashed_as_declared or (result.verdict != "ok" and specimen.invariant_class in detected_classes(result))


def verdict(specimen: Specimen, result: RunResult) -> str:
    if caught(specimen, result):
        return "caught"
    if result.verdict == "ok":
        return "MISSED (the run passed)"
    if result.verdict == "violated":
        found = ", ".join(detected_classes(result)) or ", ".join(result.clauses)
        return f"WRONG CLASS ({found}, expected {specimen.invariant_class})"
    if result.verdict == "crashed" and specimen.invariant_class == CRASH:
        return f"WRONG CRASH (without {specimen.crash_message!r})"
    return f"MISSED ({result.verdict})"


# -- running -----------------------------------------------------------------------------------

ROOM = 4
"""A mutant's search runs up to this many times the profile's examples (ci: 1200), as
tests/test_mutants.py's does. Measured: evict-locked-checkpoint, whose counterexample needs a
running request's locked checkpoint to age past every unlocked one under a full state pool,
was missed within the ci profile's 300 examples at seeds 0, 2 and 6 (of 0-6), and within
1200 at seed 2 only: the engine machine seldom fills the state pool (docs/zoo.md)."""


def run_zoo(chosen: list[Specimen], profile: str, seed: int | None, traces: str, workers: int,
            step_timeout: float, shrink_seconds: float | None = None, progress=print,
            results: dict[Specimen, RunResult] | None = None,
            load_seconds: float = LOAD_SECONDS) -> dict[Specimen, RunResult]:
    """Each specimen on its exposing run (the planned run of its `exposed_by`), in worker
    processes; results as they end, into `results` (what finished is there when an
    interruption raises)."""
    specs = list(dict.fromkeys(specimen.adapter for specimen in chosen))
    declarations = dict(zip(specs, declared(specs, load_seconds)))
    jobs = {Job(specimen.adapter, plan(declarations[specimen.adapter]).of(specimen.exposed_by), profile, seed, traces,
                shrink_seconds=shrink_seconds, examples=PROFILES[profile][0] * ROOM,
                adapter_name=declarations[specimen.adapter].name):
            specimen for specimen in chosen}
    results = {} if results is None else results

    def done(job: Job, result):
        specimen = jobs[job]
        results[specimen] = result
        timing = "" if result.first_failure_seconds is None else \
            f", first counterexample after {result.first_failure_seconds:.1f} s"
        progress(f"[{len(results)}/{len(jobs)}] {specimen.adapter} ({specimen.exposed_by.label}): "
                 f"{verdict(specimen, result)}{timing}", flush=True)

    run_jobs(list(jobs), isolated_check, lost_check, workers, step_timeout, done, adapters=specs,
             load_seconds=load_seconds)
    return {specimen: results[specimen] for specimen in chosen}


# -- reporting ---------------------------------------------------------------------------------

def detected_by(result: RunResult) -> str:
    shrunk = ", ".join(result.clauses) or result.verdict
    first = ", ".join(result.first_failure_clauses)
    return shrunk if not first or first == shrunk else f"{first}; shrunk: {shrunk}"


def table(results: dict[Specimen, RunResult]) -> str:
    rows = [["mutant", "run", "expected", "detected by", "shrunk steps", "s to detect", "result"]]
    for specimen, result in results.items():
        expected = f"{specimen.clause} ({specimen.invariant_class}" + \
            (f": {specimen.crash_message})" if specimen.invariant_class == CRASH else ")")
        rows.append([specimen.adapter, specimen.exposed_by.label, expected,
                     detected_by(result),
                     "-" if result.trace_steps is None else str(result.trace_steps),
                     "-" if result.first_failure_seconds is None else f"{result.first_failure_seconds:.1f}",
                     verdict(specimen, result)])
    detected = sum(caught(specimen, result) for specimen, result in results.items())
    rows.append([f"total ({len(results)} mutants)", "", "", "", "", "", f"{detected} of {len(results)} caught"])
    return aligned(rows, right_aligned={4, 5})


def to_json(results: dict[Specimen, RunResult], profile: str, seed: int | None, started: str, seconds: float,
            interrupted: str | None = None, unfinished: list[Specimen] = ()) -> dict:
    return {
        "schema": ZOO_SCHEMA_ID,
        "kvspec_version": kvspec_version(),
        "profile": profile,
        "seed": seed,
        "started": started,
        "seconds": round(seconds, 3),
        "caught": sum(caught(specimen, result) for specimen, result in results.items()),
        "mutants": [{
            "adapter": specimen.adapter,
            "implementation": specimen.implementation,
            "slug": specimen.slug,
            "clause": specimen.clause,
            "invariant_class": specimen.invariant_class,
            "reverts": specimen.reverts,
            "crash_message": specimen.crash_message,
            "caught": caught(specimen, result),
            "detected_classes": detected_classes(result),
            "run": run_json(result),
        } for specimen, result in results.items()],
        **({"interrupted": {"signal": interrupted, "unfinished": [specimen.adapter for specimen in unfinished]}}
           if interrupted else {}),
    }


def validate_json(document: dict) -> None:
    """Raise jsonschema.ValidationError unless `document` is a zoo/2 document (its runs
    are report/2 runs)."""
    schema = json.loads((SCHEMAS / "zoo.schema.json").read_text(encoding="utf-8"))
    report = load_report_schema()
    registry = Registry().with_resource(report["$id"], Resource.from_contents(report))
    jsonschema.Draft202012Validator(schema, registry=registry).validate(document)


def write_json(document: dict, path: str | Path) -> None:
    validate_json(document)
    write_text(path, json.dumps(document, indent=2) + "\n")


def installed_implementations(implementation: str, say=print) -> tuple[str, ...]:
    """The implementations `--implementation` names: for "all", those of every registered
    family whose engine is installed (saying which are not)."""
    if implementation != "all":
        return (implementation,)
    chosen = []
    for family in ordered_families():
        if family.installed():
            chosen.append(family.implementation)
        else:
            say(f"kvspec zoo: {family.requires or family.shown_as} is not installed, so its mutants do not run "
                f"({family.install})")
    return tuple(dict.fromkeys(chosen))


def zoo_command(args) -> int:
    if args.implementation not in ("all", *implementations()):
        raise AdapterError(f"--implementation {args.implementation}: no registered family of mutants is built on it; "
                           f"choose all or one of {', '.join(implementations())}")
    chosen = collect(installed_implementations(args.implementation), args.only)
    print(f"kvspec zoo: {len(chosen)} mutants, profile {args.profile}, seed {args.seed}, "
          f"{args.workers} worker(s)", flush=True)
    started, stamp = time.perf_counter(), utc_now()
    results: dict[Specimen, RunResult] = {}
    interrupted = None
    try:
        run_zoo(chosen, args.profile, args.seed, args.traces, args.workers, args.step_timeout, args.shrink_seconds,
                results=results, load_seconds=args.load_timeout)
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM or SIGHUP: report the mutants that finished
        interrupted = getattr(stop, "signal_name", "SIGINT")
        print(f"\nkvspec zoo: interrupted ({interrupted}) with {len(results)} of {len(chosen)} mutants finished; "
              f"the report holds those, marked interrupted", flush=True)
    results = {specimen: results[specimen] for specimen in chosen if specimen in results}
    print()
    print(table(results))
    if args.json:
        document = to_json(results, args.profile, args.seed, stamp, time.perf_counter() - started, interrupted,
                           [specimen for specimen in chosen if specimen not in results])
        try:
            write_json(document, args.json)
            print(f"wrote {args.json}")
        except OSError as error:
            print(f"kvspec: cannot write {args.json}: {error.strerror or error}; the report is lost", file=sys.stderr)
            return 2
    if interrupted:
        return 128 + INTERRUPTS[interrupted]
    return 0 if all(caught(specimen, result) for specimen, result in results.items()) else 1


def add_command(subparsers):
    """Register `zoo` on the CLI's subparsers; `args.func(args)` runs it."""
    parser = subparsers.add_parser("zoo", help="run every seeded bug; each must be caught by its invariant class",
                                   description=__doc__.split("\n\n")[0])
    # the choices are checked when the zoo runs: reading the families imports their adapters
    parser.add_argument("--implementation", default="all", metavar="IMPLEMENTATION",
                        help="whose mutants: the reference's, those patched into real SGLang, real vLLM or "
                             "TokenSpeed, or all (default; the engines' only where they are installed)")
    parser.add_argument("--only", action="append", metavar="TEXT",
                        help="only the mutants whose adapter name contains TEXT (repeatable)")
    parser.add_argument("--profile", default="ci", choices=sorted(PROFILES), help="how hard to search (default: ci)")
    parser.add_argument("--seed", type=int, default=0,
                        help="Hypothesis' seed (default 0, so that CI's verdict is reproducible)")
    parser.add_argument("--shrink-seconds", type=float, metavar="SECONDS",
                        help="stop shrinking a counterexample after this long (default: the profile's budget, "
                             "60 s at ci; Hypothesis' own limit is 300, and some of these take that long)")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help="write the results as JSON (schemas/zoo.schema.json)")
    parser.add_argument("--traces", metavar="DIR", default="kvspec-traces/zoo", type=output_directory,
                        help="where the shrunk counterexamples are saved (default: kvspec-traces/zoo)")
    parser.set_defaults(func=zoo_command)
    return parser
