"""The `kvspec` command line.

    kvspec check   --adapter X [--profile quick|ci|deep] [--seed N] [--json F] [--junit F]
                   [--traces DIR] [-n WORKERS] [--step-timeout S] [--differential [ADAPTER]] [--run TEXT]
                   [--no-shrink] [--plot FILE] [--memory-limit GIB]
    kvspec replay  TRACE|DIR --adapter X [-n WORKERS] [--step-timeout S] [--memory-limit GIB] [--verbose] [--plot FILE]
                   [--allow-skipped]
    kvspec vectors --out DIR [--seed N]
    kvspec diff-helpers --adapter X
    kvspec zoo     [--implementation all|reference|sglang] [--only TEXT] [--json F] [-n WORKERS]
    kvspec spec    [--out DIR] [--tests DIR]

`check` runs the allocator-tier and engine-tier state machines (runs.py) in worker
processes, shows each run as it ends, then a table per run and per invariant class, and
saves each failure as a shrunk trace that `replay` reproduces. `--plot` draws each run or
trace: both pools per step, by holder (occupancy.py). Exit status, for every
command: 0 conformant, 1 a violation (or a crash, a hang, a divergence), 2 usage,
adapter or trace errors.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from .harness.checks import ImplementationCrash, checks_mode_problem
from .harness.isolation import MEMORY_LIMIT, Journal, Lost, run_jobs
from .harness.profiles import PROFILES
from .harness.protocol import AdapterError, load_adapter
from .harness.replay import Replay, replay, unmet_requirements
from .harness.trace import TraceError, kvspec_version, load
from .reports.json_report import write_json
from .reports.junit import write_junit
from .reports.model import INTERRUPTS, CheckReport, utc_now
from .reports.text import class_table, run_table
from .review.diff_helpers import add_command as add_diff_helpers
from .review.occupancy import PlotError, draw, picture_path, timeline
from .review.spec_view import add_command as add_spec
from .runs.jobs import Job, isolated_check, lost_check, machines, require_page_sizes, skipped_runs, slug
from .runs.vectors import corpus, write_corpus
from .zoo.zoo import add_command as add_zoo


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job cancelled): unwinds like Ctrl-C, so the workers are stopped and
    a check still writes what finished."""


def terminate(signum, frame):
    raise Terminated()


def signal_name(stop: KeyboardInterrupt) -> str:
    return "SIGTERM" if isinstance(stop, Terminated) else "SIGINT"


def positive_number(unit: str, most: float = float("inf")):
    """An option's type: a finite number of `unit` above 0, at most `most`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text} {unit}: give a finite number above 0")
        if value > most:
            raise argparse.ArgumentTypeError(f"{text} {unit}: give at most {most:.15g} {unit}")
        return value
    return parse


positive_seconds = positive_number("seconds")
gibibytes = positive_number("GiB", most=1 << 20)  # 1 PiB; 1e300 GiB in bytes overflows a float


def memory_bytes(args) -> int:
    return int(args.memory_limit * (1 << 30))


def existing_ancestor(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def output_file(text: str) -> str:
    """An option's file to write: not a directory, and in a folder that is or can be
    made (checked before the run, so that a finished run's report is never lost)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file to write, e.g. {path / 'report'}")
    if not existing_ancestor(path.parent).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {existing_ancestor(path.parent)} is not a directory, so the file "
                                         f"cannot be written there; name a file in a directory")
    return text


def output_directory(text: str) -> str:
    """An option's directory to write into: a directory, or one that can be made."""
    path = Path(text)
    if os.path.lexists(path) and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory; name a directory (it is made if "
                                         f"missing)")
    if not existing_ancestor(path).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {existing_ancestor(path)} is not a directory; name a directory")
    return text


def pictures(plot: Path | None, names: list[str]) -> dict[str, str | None]:
    """Where `--plot FILE` draws each of `names` (runs or traces): FILE itself for one,
    FILE's stem + '-' + name + its suffix for each of several."""
    if plot is None:
        return dict.fromkeys(names)
    if len(names) == 1:
        return {names[0]: str(plot)}
    return {name: str(plot.with_name(f"{plot.stem}-{name}{plot.suffix}")) for name in names}


def check(args) -> int:
    plot = picture_path(args.plot) if args.plot else None  # a bad --plot fails before the adapter loads
    adapter = load_adapter(args.adapter)
    require_page_sizes(adapter)  # building an implementation runs its code: each worker does that (probe)
    other = load_adapter(args.differential) if args.differential else None
    labels = [label for label, _ in machines(adapter, args.differential)]
    if args.run:
        # each TEXT picks the run it names exactly, else every run whose label contains it
        chosen = [label for label in labels
                  if any(label == text or (text not in labels and text in label) for text in args.run)]
        if not chosen:
            raise AdapterError(f"no run matches --run {' '.join(args.run)}; the runs are: {', '.join(labels)}")
        labels = chosen
    drawn = pictures(plot, [slug(label) for label in labels])
    jobs = [Job(args.adapter, label, args.profile, args.seed, args.traces, args.differential, not args.no_shrink,
                shrink_seconds=args.shrink_seconds, example_database=args.example_database,
                picture=drawn[slug(label)]) for label in labels]
    print(f"kvspec check: adapter {adapter.name} ({adapter.policy_version}), profile {args.profile}, "
          f"{len(jobs)} runs on {args.workers} worker(s){f', against {args.differential}' if args.differential else ''}",
          flush=True)
    for what, why in skipped_runs(adapter, args.differential).items():
        print(f"  skipped: {what}: {why}")
    started, stamp = time.perf_counter(), utc_now()
    results = {}

    def done(job: Job, result):
        if isinstance(result, BaseException):
            raise result
        results[job.label] = result
        line = f"[{len(results)}/{len(jobs)}] {result.label}: {result.verdict}"
        line += f", {result.steps} steps in {result.seconds:.1f} s" if result.steps else ""
        if result.first_failure_seconds is not None:
            line += f" (first counterexample after {result.first_failure_seconds:.1f} s, " + \
                ("kept unshrunk)" if result.shrink_seconds is None else f"then shrunk for {result.shrink_seconds:.1f} s" +
                 (f", stopped at its {result.shrink_budget_seconds:g} s budget)" if result.shrink_stopped_at_budget
                  else ")"))
        print(line, flush=True)
        if result.verdict != "ok":
            print("    " + result.message.replace("\n", "\n    "))
            if result.trace:
                print(f"    trace ({result.trace_steps} steps): {result.trace}\n"
                      f"    replay: kvspec replay {result.trace} --adapter {result.replay_adapter or args.adapter}",
                      flush=True)
        if result.picture:
            print(f"    picture: {result.picture}", flush=True)

    interrupted = None
    try:
        run_jobs(jobs, isolated_check, lost_check, args.workers, args.step_timeout, done,
                 preload=adapter.preload + (other.preload if other else ()), memory_limit=memory_bytes(args))
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the workers are stopped; report what finished
        interrupted = signal_name(stop)
        print(f"\nkvspec check: interrupted ({interrupted}) with {len(results)} of {len(jobs)} runs finished; "
              f"the report holds those, marked interrupted", flush=True)
    report = CheckReport(kvspec_version(), adapter.name, adapter.policy_version, args.profile, args.seed, stamp,
                         time.perf_counter() - started, [results[label] for label in labels if label in results],
                         interrupted, [label for label in labels if label not in results] if interrupted else [])
    print()
    print(run_table(report))
    print()
    print(class_table(report))
    status = report.exit_status
    for path, write in ((args.json, write_json), (args.junit, write_junit)):
        if path:
            try:
                write(report, path)
            except OSError as error:  # checked before the run; it changed since (or is not writable)
                print(f"kvspec: cannot write {path}: {error.strerror}; the report is lost", file=sys.stderr)
                status = status or 2
                continue
            print(f"wrote {path}")
    return status


def isolated_replay(task: tuple[str, str, bool, str | None], journal: Journal
                    ) -> tuple[Replay | AdapterError | TraceError, str | None]:
    """A worker's replay of one trace, then its picture if `task` names one: (the
    replay, the picture's path)."""
    path, adapter_spec, verbose, picture = task
    try:
        trace, adapter = load(path), load_adapter(adapter_spec)
        try:
            result = replay(trace, adapter, print if verbose else lambda line: None, journal=journal,
                            judge_trace=True)
        except TraceError as error:  # the trace breaks the lifecycle at a step
            raise TraceError(f"{path}: {error}") from None
        if picture is not None:
            draw(timeline(trace, adapter, trace.label or Path(path).stem), picture)
        return result, picture
    except (AdapterError, TraceError) as error:
        return error, None


def lost_replay(task, lost: Lost) -> tuple[Replay, None]:
    """A replay whose process died or hung, at the step it had started: no picture."""
    failure = ImplementationCrash(lost.reason)
    failure.kind = lost.kind
    at = max(0, len(lost.steps) - 1)
    return Replay(at, failure, stopped_at=at), None


def replay_command(args) -> int:
    plot = picture_path(args.plot) if args.plot else None  # a bad --plot fails before anything runs
    traces = corpus(Path(args.trace))  # every file parses, and matches the index, before anything runs
    drawn = pictures(plot, [path.stem for path in traces])
    adapter = load_adapter(args.adapter)
    skipped = {path: unmet for path, trace in traces.items() if (unmet := unmet_requirements(trace, adapter))}
    print(f"kvspec replay: {len(traces)} trace(s) on adapter {args.adapter}", flush=True)
    for path, unmet in skipped.items():
        print(f"skip {path.name}: adapter lacks {', '.join(unmet)}")
    failures = 0

    def done(task, outcome):
        nonlocal failures
        result, picture = outcome
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
        print(f"{'ok  ' if consumed else 'FAIL'} {path.name}: {verdict}".replace("\n", "\n     "), flush=True)
        if picture:
            print(f"     picture: {picture}", flush=True)

    replayed = [path for path in traces if path not in skipped]
    finished = 0

    def counted(task, outcome):
        nonlocal finished
        done(task, outcome)
        finished += 1

    try:
        run_jobs([(str(path), args.adapter, args.verbose, drawn[path.stem]) for path in replayed], isolated_replay,
                 lost_replay, args.workers, args.step_timeout, counted, preload=adapter.preload,
                 memory_limit=memory_bytes(args))
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
    print(f"kvspec vectors: writing the conformance corpus to {args.out}", flush=True)
    written = write_corpus(args.out, args.seed)
    print(f"wrote {len(written)} vectors and index.json to {args.out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kvspec", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    check_parser = commands.add_parser("check", help="run the conformance state machines against an adapter")
    check_parser.add_argument("--adapter", default="reference",
                              help="adapter: a built-in name (reference, mutant-...), an entry point, or module:attribute")
    check_parser.add_argument("--profile", default="quick", choices=sorted(PROFILES), help="how hard to search")
    check_parser.add_argument("--seed", type=int, help="fix Hypothesis' seed to reproduce a run")
    check_parser.add_argument("--json", metavar="FILE", type=output_file,
                              help="write the report as JSON (schemas/report.schema.json)")
    check_parser.add_argument("--junit", metavar="FILE", type=output_file, help="write the report as JUnit XML")
    check_parser.add_argument("--traces", metavar="DIR", default="kvspec-traces", type=output_directory,
                              help="where counterexample traces are saved (default: kvspec-traces)")
    check_parser.add_argument("--run", action="append", metavar="TEXT",
                              help="only the runs whose label contains TEXT (repeatable), e.g. 'engine P=4 W=6'")
    check_parser.add_argument("--no-shrink", action="store_true",
                              help="save the first counterexample as found, unshrunk (shrinking can take a minute)")
    check_parser.add_argument("--shrink-seconds", type=positive_seconds, metavar="SECONDS",
                              help="stop shrinking a counterexample after this long (default: the profile's, "
                                   f"{', '.join(f'{name} {PROFILES[name][2]} s' for name in PROFILES)})")
    check_parser.add_argument("--example-database", metavar="DIR",
                              help="keep failing examples in DIR (Hypothesis' directory database) and try them "
                                   "first: shared by checks of related adapters, e.g. the shards of a matrix")
    check_parser.add_argument("--differential", nargs="?", const="reference", metavar="ADAPTER",
                              help="also run every step on ADAPTER (default: the reference) and compare what the "
                                   "spec fixes (OBS-3)")
    check_parser.add_argument("--plot", metavar="FILE",
                              help="draw each run's pools per step (its counterexample, else its busiest example) "
                                   "to FILE (.png, .svg or .pdf; several runs: FILE-<run>.png); needs matplotlib")
    check_parser.set_defaults(func=check)

    replay_parser = commands.add_parser("replay", help="replay a trace, or a directory of conformance vectors")
    replay_parser.add_argument("trace", help="a .jsonl trace, or a directory written by `kvspec vectors`")
    replay_parser.add_argument("--adapter", default="reference", help="adapter to replay on (default: reference)")
    replay_parser.add_argument("--verbose", action="store_true", help="print each step as it is applied")
    replay_parser.add_argument("--plot", metavar="FILE",
                               help="draw the pools per step to FILE (.png, .svg or .pdf; a directory of traces: "
                                    "FILE-<trace>.png each); needs matplotlib")
    replay_parser.add_argument("--allow-skipped", action="store_true",
                               help="exit 0 when every trace is skipped (the adapter lacks what each needs); "
                                    "without it, a replay that replays nothing exits 2")
    replay_parser.set_defaults(func=replay_command)

    zoo_parser = add_zoo(commands)
    for command in (check_parser, replay_parser, zoo_parser):
        command.add_argument("-n", "--workers", type=int, default=1, metavar="WORKERS",
                             help=f"runs in parallel, each in its own process (this machine has {os.cpu_count()} CPUs)")
        command.add_argument("--step-timeout", type=positive_seconds, default=60.0, metavar="SECONDS",
                             help="a step that takes longer is a hang (default: 60)")
    for command in (check_parser, replay_parser):
        command.add_argument("--memory-limit", type=gibibytes, default=MEMORY_LIMIT / (1 << 30), metavar="GIB",
                             help="a worker whose resident memory grows past this is a crash of the implementation, "
                                  f"with its trace (default: {MEMORY_LIMIT >> 30} GiB; Linux)")

    vectors_parser = commands.add_parser("vectors", help="write kvspec's conformance vectors from the reference")
    vectors_parser.add_argument("--out", required=True, metavar="DIR", type=output_directory,
                                help="directory to write the corpus to")
    vectors_parser.add_argument("--seed", type=int, default=20261130, help="seed of the random lifecycles")
    vectors_parser.set_defaults(func=vectors_command)

    add_diff_helpers(commands)
    add_spec(commands)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, terminate)
    if getattr(args, "workers", 1) < 1:
        parser.error("-n/--workers must be at least 1")
    if args.command in ("check", "replay", "zoo", "vectors") and (problem := checks_mode_problem()):
        parser.error(problem)  # before any worker: each would inherit it
    try:
        return args.func(args)
    except (AdapterError, TraceError, PlotError) as error:
        print(f"kvspec: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # before or after the runs: nothing to report
        print(f"kvspec: interrupted ({signal_name(stop)})", file=sys.stderr)
        return 128 + INTERRUPTS[signal_name(stop)]
    except BrokenPipeError:  # the output was piped into a reader that stopped (`| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush does not raise
        return 1


if __name__ == "__main__":
    sys.exit(main())
