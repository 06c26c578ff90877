"""`kvspec zoo`: every seeded bug, run against the conformance suite, must be caught.

A conformance suite is as good as the bugs it catches. The zoo runs each mutant (a
reference mutant of kvspec.adapters.mutants; where SGLang is installed, each bug patched
into real SGLang by kvspec.adapters.sglang.mutants; where vLLM is installed, each bug
patched into real vLLM by kvspec.adapters.vllm.mutants) on the run that exposes it,
at the `ci` profile, and checks that it is caught by a violation of the invariant class
it breaks. A mutant that passes, crashes, hangs, or is caught by another class is a
miss: the exit status is 1 and the table says which.

The table: per mutant, the clauses that caught it, the length of the shrunk
counterexample (a trace that `kvspec replay` reproduces), and the seconds to the first
counterexample (before shrinking). `--json F` writes the same as a zoo/1 document
(schemas/zoo.schema.json; each run in it is a run of report/1).
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import jsonschema
from referencing import Registry, Resource

from kvspec.spec.invariants import INVARIANTS

from ..harness.families import CRASH, Family, seeded_families
from ..harness.isolation import run_jobs
from ..harness.profiles import PROFILES
from ..harness.protocol import AdapterError, load_adapter
from ..harness.trace import kvspec_version
from ..reports.json_report import load_report_schema, run_json
from ..reports.model import SCHEMAS, RunResult, utc_now
from ..reports.text import aligned
from ..runs.jobs import Job, isolated_check, lost_check

ZOO_SCHEMA_ID = "https://kvspec.dev/schemas/zoo/1"
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
    run: str  # the label of the run that exposes it, e.g. "engine P=4 W=6 I=4"
    clause: str
    invariant_class: str  # an invariant class, or CRASH
    reverts: str
    crash_message: str = ""


def specimens(family: Family) -> list[Specimen]:
    # a mutant that reverts no SGLang fix, or is never seen as a crash, declares neither
    # `reverts` nor `crash_message`
    return [Specimen(family.implementation, f"{family.prefix}{slug}", slug, mutant.exposed_by.label, mutant.clause,
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

def run_zoo(chosen: list[Specimen], profile: str, seed: int | None, traces: str, workers: int,
            step_timeout: float, shrink_seconds: float | None = None, progress=print) -> dict[Specimen, RunResult]:
    """Each specimen on its exposing run, in worker processes; results as they end."""
    preload = tuple(dict.fromkeys(module for adapter in {specimen.adapter for specimen in chosen}
                                  for module in load_adapter(adapter).preload))
    jobs = {Job(specimen.adapter, specimen.run, profile, seed, traces, shrink_seconds=shrink_seconds): specimen
            for specimen in chosen}
    results = {}

    def done(job: Job, result):
        if isinstance(result, BaseException):
            raise result
        specimen = jobs[job]
        results[specimen] = result
        timing = "" if result.first_failure_seconds is None else \
            f", first counterexample after {result.first_failure_seconds:.1f} s"
        progress(f"[{len(results)}/{len(jobs)}] {specimen.adapter} ({specimen.run}): "
                 f"{verdict(specimen, result)}{timing}", flush=True)

    run_jobs(list(jobs), isolated_check, lost_check, workers, step_timeout, done, preload=preload)
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
        rows.append([specimen.adapter, specimen.run, expected,
                     detected_by(result),
                     "-" if result.trace_steps is None else str(result.trace_steps),
                     "-" if result.first_failure_seconds is None else f"{result.first_failure_seconds:.1f}",
                     verdict(specimen, result)])
    detected = sum(caught(specimen, result) for specimen, result in results.items())
    rows.append([f"total ({len(results)} mutants)", "", "", "", "", "", f"{detected} of {len(results)} caught"])
    return aligned(rows, right_aligned={4, 5})


def to_json(results: dict[Specimen, RunResult], profile: str, seed: int | None, started: str, seconds: float) -> dict:
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
    }


def validate_json(document: dict) -> None:
    """Raise jsonschema.ValidationError unless `document` is a zoo/1 document (its runs
    are report/1 runs)."""
    schema = json.loads((SCHEMAS / "zoo.schema.json").read_text(encoding="utf-8"))
    report = load_report_schema()
    registry = Registry().with_resource(report["$id"], Resource.from_contents(report))
    jsonschema.Draft202012Validator(schema, registry=registry).validate(document)


def write_json(document: dict, path: str | Path) -> None:
    validate_json(document)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


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
    chosen = collect(installed_implementations(args.implementation), args.only)
    print(f"kvspec zoo: {len(chosen)} mutants, profile {args.profile}, seed {args.seed}, "
          f"{args.workers} worker(s)", flush=True)
    started, stamp = time.perf_counter(), utc_now()
    results = run_zoo(chosen, args.profile, args.seed, args.traces, args.workers, args.step_timeout,
                      args.shrink_seconds)
    print()
    print(table(results))
    if args.json:
        write_json(to_json(results, args.profile, args.seed, stamp, time.perf_counter() - started), args.json)
        print(f"wrote {args.json}")
    return 0 if all(caught(specimen, result) for specimen, result in results.items()) else 1


def add_command(subparsers):
    """Register `zoo` on the CLI's subparsers; `args.func(args)` runs it."""
    parser = subparsers.add_parser("zoo", help="run every seeded bug; each must be caught by its invariant class",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--implementation", choices=("all", *implementations()), default="all",
                        help="whose mutants: the reference's, those patched into real SGLang or real "
                             "vLLM, or all (default; SGLang's and vLLM's only where they are installed)")
    parser.add_argument("--only", action="append", metavar="TEXT",
                        help="only the mutants whose adapter name contains TEXT (repeatable)")
    parser.add_argument("--profile", default="ci", choices=sorted(PROFILES), help="how hard to search (default: ci)")
    parser.add_argument("--seed", type=int, default=0,
                        help="Hypothesis' seed (default 0, so that CI's verdict is reproducible)")
    parser.add_argument("--shrink-seconds", type=float, metavar="SECONDS",
                        help="stop shrinking a counterexample after this long (default: the profile's budget, "
                             "60 s at ci; Hypothesis' own limit is 300, and some of these take that long)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON (schemas/zoo.schema.json)")
    parser.add_argument("--traces", metavar="DIR", default="kvspec-traces/zoo",
                        help="where the shrunk counterexamples are saved (default: kvspec-traces/zoo)")
    parser.set_defaults(func=zoo_command)
    return parser
