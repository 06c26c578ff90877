"""The commands of `kvspec` (cli.py is the entry point that imports this module).

    kvspec check   --adapter X [--profile quick|ci|deep] [--seed N] [--json F] [--junit F]
                   [--traces DIR] [-n WORKERS] [--step-timeout S] [--differential [ADAPTER]] [--run TEXT]
                   [--no-shrink] [--multiple-bugs] [--plot FILE] [--memory-limit GIB] [--load-timeout S]
    kvspec explore --adapter X [--seeds N] [--first-seed N] ... (check at fresh seeds, for triage)
    kvspec replay  TRACE|DIR --adapter X [-n WORKERS] [--step-timeout S] [--memory-limit GIB] [--verbose] [--plot FILE]
                   [--allow-skipped] [--load-timeout S]
    kvspec vectors --out DIR [--seed N]
    kvspec diff-helpers --adapter X
    kvspec zoo     [--implementation all|reference|sglang|...] [--only TEXT] [--json F] [-n WORKERS]
    kvspec spec    [--out DIR] [--tests DIR]
    kvspec bisect  TRACE --family PREFIX [--members PREFIX...] [--json F] [-n WORKERS] (runs/bisect.py)

`check` plans its runs (runs/plan.py) from the adapter's declaration, which a worker
process loads (the harness's own process never imports an adapter), runs each in a worker
(runs/runner.py), shows each run as it ends, then a table per run and per invariant class,
and saves each failure as a shrunk trace that `replay` reproduces. `--plot` draws each run
or trace: both pools per step, by holder (occupancy.py).
"""

import argparse
import math
import os
import sys
import time
from pathlib import Path

from .harness.checks import checks_mode_problem
from .harness.isolation import LOAD_SECONDS, MEMORY_LIMIT, Lost, run_jobs
from .harness.outputs import output_directory, output_file
from .harness.profiles import PROFILES
from .harness.protocol import AdapterError, Declaration
from .harness.trace import Trace, TraceError, kvspec_version
from .reports.model import INTERRUPTS, CheckReport, utc_now
from .reports.text import class_table, run_table
from .review.occupancy_plot import PlotError
from .runs.plan import Plan, plan
from .runs.runner import Job, declared, isolated_check, lost_check, slug

MAX_MEMORY_GIB = 1 << 20
"""The largest --memory-limit taken: a pebibyte, past any machine's memory."""


def positive_number(unit: str, most: float = math.inf):
    """An option's type: a finite number of `unit` above 0 (and at most `most`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"{text} {unit}: give a finite number above 0")
        if value > most:
            raise argparse.ArgumentTypeError(f"{text} {unit}: give at most {most:.15g} {unit}")
        return value
    return parse


positive_seconds = positive_number("seconds")
gibibytes = positive_number("GiB", MAX_MEMORY_GIB)


def memory_bytes(args) -> int:
    return int(args.memory_limit * (1 << 30))


def picture_option(text: str) -> str:
    """`--plot FILE`: a format matplotlib draws (its suffix), in a place that can be written."""
    from .review.occupancy_plot import picture_path

    try:
        picture_path(text)
    except PlotError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--plot {text}: ")) from None
    return output_file(text)


def pictures(plot: str | None, names: list[str]) -> dict[str, str | None]:
    """Where `--plot FILE` draws each of `names` (runs or traces): FILE itself for one,
    FILE's stem + '-' + name + its suffix for each of several."""
    if plot is None:
        return dict.fromkeys(names)
    if len(names) == 1:
        return {names[0]: plot}
    path = Path(plot)
    return {name: str(path.with_name(f"{path.stem}-{name}{path.suffix}")) for name in names}


def shown(path: str) -> str:
    """A path kvspec wrote, as the user would type it: relative to the current folder when
    it is inside it (kvspec keeps its output paths absolute: an implementation may change
    its worker's folder)."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def declarations(specs: list[str], args) -> tuple[Declaration, ...]:
    return declared(specs, args.load_timeout, memory_bytes(args))


def check(args) -> int:
    specs = [args.adapter, *([args.differential] if args.differential else [])]
    declared = declarations(specs, args)
    adapter, other = declared[0], (declared[1] if args.differential else None)
    the_plan: Plan = plan(adapter, other)
    if args.run:
        the_plan = the_plan.select(args.run)
    drawn = pictures(args.plot, [slug(label) for label in the_plan.labels])
    jobs = [Job(args.adapter, planned, args.profile, args.seed, args.traces, args.differential, not args.no_shrink,
                shrink_seconds=args.shrink_seconds, example_database=args.example_database,
                picture=drawn[slug(planned.label)], adapter_name=adapter.name, multiple_bugs=args.multiple_bugs)
            for planned in the_plan.runs]
    print(f"kvspec check: adapter {adapter.name} ({adapter.policy_version}), profile {args.profile}, "
          f"{len(jobs)} runs on {args.workers} worker(s){f', against {args.differential}' if args.differential else ''}",
          flush=True)
    for skipped in the_plan.skipped:
        print(f"  skipped: {skipped.what}: {skipped.why}")
    started, stamp = time.perf_counter(), utc_now()
    results = {}

    def done(job: Job, result):
        results[job.label] = result
        line = f"[{len(results)}/{len(jobs)}] {result.label}: {result.verdict}"
        line += f", {result.steps} steps in {result.seconds:.1f} s" if result.steps else ""
        if result.first_failure_seconds is not None:
            line += f" (first counterexample after {result.first_failure_seconds:.1f} s, " + \
                ("kept unshrunk)" if result.shrink_seconds is None else f"then shrunk for {result.shrink_seconds:.1f} s" +
                 (f", stopped at its {result.shrink_budget_seconds:g} s budget)" if result.shrink_stopped_at_budget
                  else ")"))
        print(line, flush=True)
        if result.message:
            print("    " + result.message.replace("\n", "\n    "))
        if result.cause:  # the message is one line (tables of findings match it): the traceback comes apart
            print(implementation_traceback(result.cause))
        if result.trace:
            print(f"    trace ({result.trace_steps} steps): {shown(result.trace)}\n"
                  f"    replay: kvspec replay {shown(result.trace)} --adapter {result.replay_adapter or args.adapter}",
                  flush=True)
        for other in result.other_failures:  # --multiple-bugs
            print(f"    and {other['verdict']} {', '.join(other['clauses'])}: "
                  + other["message"].replace("\n", "\n    "))
            if other["trace"]:
                print(f"    trace ({other['trace_steps']} steps): {shown(other['trace'])}", flush=True)
        if result.picture:
            print(f"    picture: {shown(result.picture)}", flush=True)

    interrupted = None
    try:
        run_jobs(jobs, isolated_check, lost_check, args.workers, args.step_timeout, done, adapters=specs,
                 memory_limit=memory_bytes(args), load_seconds=args.load_timeout)
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM or SIGHUP: the workers are stopped; report what finished
        interrupted = signal_name(stop)
        print(f"\nkvspec check: interrupted ({interrupted}) with {len(results)} of {len(jobs)} runs finished; "
              f"the report holds those, marked interrupted", flush=True)
    report = CheckReport(kvspec_version(), adapter.name, adapter.policy_version, args.profile, args.seed, stamp,
                         time.perf_counter() - started, [results[job.label] for job in jobs if job.label in results],
                         interrupted, {job.label: str(job.planned.tier) for job in jobs
                                       if job.label not in results} if interrupted else {})
    print()
    print(run_table(report))
    print()
    print(class_table(report))
    errors = dict.fromkeys(run.message for run in report.runs if run.verdict == "error")
    for message in errors:  # what the adapter must fix, once however many runs met it
        print(f"kvspec: {message}", file=sys.stderr)
    return write_reports(report, ((args.json, "json"), (args.junit, "junit")))


def implementation_traceback(cause: str, indent: str = "    ") -> str:
    """What the implementation raised (RunResult.cause, Replay.cause: its traceback, the
    engine's own files and lines last), indented under a failure's message. Without
    Python's "Traceback" header: that word on kvspec's output means kvspec itself failed."""
    lines = [line for line in cause.rstrip().splitlines() if line != "Traceback (most recent call last):"]
    return "\n".join([f"{indent}the implementation raised it here (most recent call last):",
                      *(f"{indent}  {line}" for line in lines)])


def write_reports(report: CheckReport, outputs) -> int:
    """Write the report to each (path, format) given; the check's exit status, or 2 where
    a report could not be written (checked before the run: the path changed since)."""
    from .reports.json_report import to_json, validate_json
    from .reports.junit import to_junit

    status = report.exit_status
    for path, kind in outputs:
        if not path:
            continue
        try:
            if kind == "json":
                document = to_json(report)
                validate_json(document)
                write(path, json_text(document))
            else:
                write(path, to_junit(report))
        except OSError as error:
            print(f"kvspec: cannot write {path}: {error.strerror or error}; the report is lost", file=sys.stderr)
            status = status or 2
            continue
        print(f"wrote {shown(path)}")
    return status


def json_text(document: dict) -> str:
    import json

    return json.dumps(document, indent=2) + "\n"


def write(path: str, text: str) -> None:
    from .harness.outputs import write_text

    write_text(path, text)


def signal_name(stop: KeyboardInterrupt) -> str:
    return getattr(stop, "signal_name", "SIGINT")


def isolated_replay(task: tuple[str, Trace, str, bool, str | None], journal):
    """A worker's replay of one trace (the one the harness read and verified, not the file
    again), then its picture if `task` names one: (the replay, the picture's path, what
    drawing it raised)."""
    from .harness.protocol import load_adapter
    from .harness.replay import replay
    from .review.occupancy import timeline
    from .review.occupancy_plot import draw

    name, trace, adapter_spec, verbose, picture = task
    try:
        adapter = load_adapter(adapter_spec)
        try:
            result = replay(trace, adapter, print if verbose else lambda line: None, journal=journal,
                            judge_trace=True)
        except TraceError as error:  # the trace breaks the lifecycle at a step
            raise TraceError(f"{name}: {error}") from None
    except (AdapterError, TraceError) as error:
        return error, None, ""
    if picture is None:
        return result, None, ""
    try:
        return result, str(draw(timeline(trace, adapter, trace.label or Path(name).stem), picture)), ""
    except Exception as error:  # noqa: BLE001 - a picture is never a verdict of the implementation
        return result, None, f"no picture: drawing {picture} raised {type(error).__name__}: {error}"


def lost_replay(task, lost: Lost):
    """A replay whose process died or hung, at the step it had started: no picture."""
    from .harness.checks import ImplementationCrash
    from .harness.replay import Replay

    failure = ImplementationCrash(lost.reason)
    failure.kind = lost.kind
    at = max(0, len(lost.steps) - 1)
    return Replay(at, failure, stopped_at=at), None, ""


def replay_command(args) -> int:
    from .harness.replay import unmet_requirements
    from .runs.tree import corpus, trace_name

    traces = corpus(Path(args.trace))  # every file parses, and matches the index, before anything runs
    names = {path: trace_name(path, Path(args.trace)) for path in traces}  # its path under a directory replayed
    drawing_names = {path: names[path].removesuffix(".jsonl").replace("/", "-") for path in traces}
    drawn = pictures(args.plot, list(drawing_names.values()))
    (adapter,) = declarations([args.adapter], args)
    skipped = {path: unmet for path, trace in traces.items() if (unmet := unmet_requirements(trace, adapter))}
    print(f"kvspec replay: {len(traces)} trace(s) on adapter {args.adapter}", flush=True)
    for path, unmet in skipped.items():
        print(f"skip {names[path]}: adapter lacks {', '.join(unmet)}")
    failures = 0
    finished = 0

    def done(task, outcome):
        nonlocal failures, finished
        result, picture, drawing = outcome
        if isinstance(result, (AdapterError, TraceError)):
            raise result
        path = Path(task[0])
        trace = traces[path]
        consumed = result.conforms and result.steps == len(trace.steps)
        recorded = trace.violated
        if result.conforms:
            verdict = f"conforms: all {result.steps} steps" if consumed else \
                f"only {result.steps} of {len(trace.steps)} steps consumed"
        else:
            verdict = result.verdict()
            if recorded:
                verdict = ("reproduced: " if result.reproduces(trace) else
                           f"does not reproduce the recorded {', '.join(recorded)}: ") + verdict
        failures += not consumed
        finished += 1
        print(f"{'ok  ' if consumed else 'FAIL'} {names[path]}: {verdict}".replace("\n", "\n     "), flush=True)
        if result.cause:  # one line per trace unless asked: a directory of traces stays readable
            print(implementation_traceback(result.cause, "     ") if args.verbose else
                  "     (--verbose shows where the implementation raised it)", flush=True)
        if picture:
            print(f"     picture: {shown(picture)}", flush=True)
        if drawing:
            print(f"     ({drawing})", flush=True)

    replayed = [path for path in traces if path not in skipped]
    try:
        run_jobs([(str(path), traces[path], args.adapter, args.verbose, drawn[drawing_names[path]])
                  for path in replayed],
                 isolated_replay, lost_replay, args.workers, args.step_timeout, done, adapters=[args.adapter],
                 memory_limit=memory_bytes(args), load_seconds=args.load_timeout)
    except KeyboardInterrupt as stop:
        print(f"\nkvspec replay: interrupted ({signal_name(stop)}) with {finished} of {len(replayed)} trace(s) "
              f"replayed: {failures} failed", flush=True)
        return 128 + INTERRUPTS[signal_name(stop)]
    print(f"\n{len(replayed) - failures} of {len(replayed)} trace(s) replayed in full without a violation"
          + (f"; {len(skipped)} skipped (the adapter lacks what they need)" if skipped else ""))
    if not replayed and not args.allow_skipped:
        raise AdapterError(f"nothing was replayed: adapter {args.adapter!r} lacks what each of the {len(skipped)} "
                           f"trace(s) needs (see the skips above), so none was checked; replay traces it can run, "
                           f"or pass --allow-skipped to accept that")
    return 1 if failures else 0


def vectors_command(args) -> int:
    from .runs.vectors import write_corpus

    print(f"kvspec vectors: writing the conformance vectors to {args.out}/conformance", flush=True)
    written = write_corpus(args.out, args.seed)
    print(f"wrote {len(written)} vectors, and index.json of every trace under {args.out}")
    return 0


def add_check_options(parser) -> None:
    """The options of a check (`check`, and `explore`, which runs checks at fresh seeds)."""
    parser.add_argument("--adapter", default="reference",
                        help="adapter: a built-in name (reference, mutant-...), an entry point, or module:attribute")
    parser.add_argument("--profile", default="quick", choices=sorted(PROFILES), help="how hard to search")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help="write the report as JSON (schemas/report.schema.json)")
    parser.add_argument("--junit", metavar="FILE", type=output_file, help="write the report as JUnit XML")
    parser.add_argument("--traces", metavar="DIR", default="kvspec-traces", type=output_directory,
                        help="where counterexample traces are saved (default: kvspec-traces)")
    parser.add_argument("--run", action="append", metavar="TEXT",
                        help="only the runs whose label contains TEXT (repeatable), e.g. 'engine P=4 W=6'")
    parser.add_argument("--no-shrink", action="store_true",
                        help="save the first counterexample as found, unshrunk (shrinking can take a minute)")
    parser.add_argument("--shrink-seconds", type=positive_seconds, metavar="SECONDS",
                        help="stop shrinking a counterexample after this long (default: the profile's, "
                             f"{', '.join(f'{name} {PROFILES[name][2]} s' for name in PROFILES)})")
    parser.add_argument("--multiple-bugs", action="store_true",
                        help="search on past a run's first failure and report every distinct one (other clauses, "
                             "or a crash elsewhere), each shrunk and saved (slower: each is shrunk and replayed)")
    parser.add_argument("--example-database", metavar="DIR", type=output_directory,
                        help="keep failing examples in DIR (Hypothesis' directory database) and try them "
                             "first: shared by checks of related adapters, e.g. the shards of a matrix")
    parser.add_argument("--differential", nargs="?", const="reference", metavar="ADAPTER",
                        help="also run every step on ADAPTER (default: the reference) and compare what the "
                             "spec fixes (OBS-3)")
    parser.add_argument("--plot", metavar="FILE", type=picture_option,
                        help="draw each run's pools per step (its counterexample, else its busiest example) "
                             "to FILE (.png, .svg or .pdf; several runs: FILE-<run>.png); needs matplotlib")


def build_parser() -> argparse.ArgumentParser:
    from .explore import add_command as add_explore
    from .review.diff_helpers import add_command as add_diff_helpers
    from .review.spec_view import add_command as add_spec
    from .runs.bisect import add_command as add_bisect
    from .zoo.zoo import add_command as add_zoo

    parser = argparse.ArgumentParser(prog="kvspec", description="kvspec: the executable specification, reference "
                                     "and conformance suite of hybrid full/sliding-window KV-cache memory management")
    commands = parser.add_subparsers(dest="command", required=True)

    check_parser = commands.add_parser("check", help="run the conformance state machines against an adapter")
    add_check_options(check_parser)
    check_parser.add_argument("--seed", type=int, help="fix Hypothesis' seed to reproduce a run")
    check_parser.set_defaults(func=check)
    explore_parser = add_explore(commands, add_check_options)

    replay_parser = commands.add_parser("replay", help="replay a trace, or a directory of conformance vectors")
    replay_parser.add_argument("trace", help="a .jsonl trace, or a directory of traces (a vectors tree written "
                                                "by `kvspec vectors`, or part of one): every trace under it")
    replay_parser.add_argument("--adapter", default="reference", help="adapter to replay on (default: reference)")
    replay_parser.add_argument("--verbose", action="store_true", help="print each step as it is applied")
    replay_parser.add_argument("--plot", metavar="FILE", type=picture_option,
                               help="draw the pools per step to FILE (.png, .svg or .pdf; a directory of traces: "
                                    "FILE-<trace>.png each); needs matplotlib")
    replay_parser.add_argument("--allow-skipped", action="store_true",
                               help="exit 0 when every trace is skipped (the adapter lacks what each needs); "
                                    "without it, a replay that replays nothing exits 2")
    replay_parser.set_defaults(func=replay_command)

    zoo_parser = add_zoo(commands)
    bisect_parser = add_bisect(commands)
    for command in (check_parser, explore_parser, replay_parser, zoo_parser, bisect_parser):
        command.add_argument("-n", "--workers", type=int, default=1, metavar="WORKERS",
                             help=f"runs in parallel, each in its own process (this machine has {os.cpu_count()} CPUs)")
        command.add_argument("--step-timeout", type=positive_seconds, default=60.0, metavar="SECONDS",
                             help="a step that takes longer is a hang (default: 60)")
        command.add_argument("--load-timeout", type=positive_seconds, default=LOAD_SECONDS, metavar="SECONDS",
                             help="loading the adapter (importing its module and its preload, in a process of its "
                                  f"own) that takes longer is a hang at import, exit 2 (default: {LOAD_SECONDS:g})")
        command.add_argument("--memory-limit", type=gibibytes, default=MEMORY_LIMIT / (1 << 30), metavar="GIB",
                             help="a worker whose resident memory grows past this is a crash of the implementation, "
                                  f"with its trace (default: {MEMORY_LIMIT >> 30} GiB; Linux)")

    vectors_parser = commands.add_parser("vectors", help="write kvspec's conformance vectors from the reference")
    vectors_parser.add_argument("--out", required=True, metavar="DIR", type=output_directory,
                                help="the root of a vectors tree: the vectors go under DIR/conformance/, and "
                                     "DIR/index.json lists every trace under DIR")
    vectors_parser.add_argument("--seed", type=int, default=20261130, help="seed of the random lifecycles")
    vectors_parser.set_defaults(func=vectors_command)

    add_diff_helpers(commands)
    add_spec(commands)
    return parser


def run(argv=None) -> int:
    """Parse the command line and run its command (cli.main handles the signals)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "workers", 1) < 1:
        parser.error("-n/--workers must be at least 1")
    replaying = ("check", "explore", "replay", "zoo", "vectors", "bisect")
    if args.command in replaying and (problem := checks_mode_problem()):
        parser.error(problem)  # before any worker: each would inherit it
    if getattr(args, "json", None) and args.json == getattr(args, "junit", None):
        parser.error(f"--json and --junit name the same file, {args.json}; give each report a file of its own")
    try:
        return args.func(args)
    except (AdapterError, TraceError, PlotError) as error:
        print(f"kvspec: {error}", file=sys.stderr)
        return 2
