"""Running `crosshair diffbehavior` on one pair (helper_pairs.py) in a subprocess, and
reading its verdict from what it prints.

The subprocess imports a module written for the pair, whose `spec` and `adapter` are the
two sides (helper_sides.py). "same" is what CrossHair could show within its budget: "all
paths exhausted" is as close to a proof as it gets; "no difference in N iterations" is a
bounded search. A hang is cut off at --helper-timeout and the run goes on.
"""

import dataclasses
import os
import re
import subprocess
import sys
import time

from .helper_pairs import HelperPair

DEFAULT_PER_CONDITION_TIMEOUT = 10.0

PAIR_MODULE = """\
# Written by kvspec diff-helpers: `crosshair diffbehavior` compares `spec` with `adapter`.
import atexit
import sys

from kvspec.conformance.review.helper_sides import paired

spec, adapter = paired({helper!r}, {target!r})
atexit.register(lambda: print(f"{COMPARED_MARK}{{spec.inputs_compared}}", file=sys.stderr))
"""
COMPARED_MARK = "kvspec diff-helpers: inputs inside the preconditions: "


@dataclasses.dataclass
class HelperComparison:
    """What CrossHair found for one pair."""

    helper: str
    target: str
    verdict: str  # "same", "DIFFERENT" or "error"
    seconds: float
    detail: str = ""
    """same: how far the search went; error: why there is no verdict."""
    counterexamples: list[dict[str, str]] = dataclasses.field(default_factory=list)
    """Per input found: {"given": the arguments, "spec": ..., "adapter": ...} (returns/raises)."""
    crosshair_output: str = ""


GIVEN = re.compile(r"^Given: \((.*)\),$")
SIDE = re.compile(r"^\s*\S+\.(spec|adapter) : (.*)$")


def counterexamples(stdout: str) -> list[dict[str, str]]:
    """The inputs `crosshair diffbehavior` printed, with what each side did:
        Given: (x=0, page_size=1),
          kvspec_diff_pages_ceil_page.spec : returns 0
          kvspec_diff_pages_ceil_page.adapter : returns 1
    """
    found = []
    for line in stdout.splitlines():
        given, side = GIVEN.match(line), SIDE.match(line)
        if given:
            found.append({"given": given[1]})
        elif side and found:
            found[-1][side[1]] = side[2]
    return found


def crosshair_options(args) -> list[str]:
    """CrossHair's budget per helper: the CPU seconds given, or the iterations given, or
    DEFAULT_PER_CONDITION_TIMEOUT seconds."""
    options = []
    if args.per_condition_timeout is not None or args.max_uninteresting_iterations is None:
        options.append(f"--per_condition_timeout={args.per_condition_timeout or DEFAULT_PER_CONDITION_TIMEOUT:g}")
    if args.max_uninteresting_iterations is not None:
        options.append(f"--max_uninteresting_iterations={args.max_uninteresting_iterations}")
    return options


def helper_timeout(args) -> float:
    """The wall-clock limit of one subprocess: CrossHair's own budget is CPU time, and a
    hanging helper (or solver) must not hang the run."""
    if args.helper_timeout is not None:
        return args.helper_timeout
    if args.per_condition_timeout is None and args.max_uninteresting_iterations is not None:
        return 600
    return 3 * (args.per_condition_timeout or DEFAULT_PER_CONDITION_TIMEOUT) + 60


def diff_pair(pair: HelperPair, args, workdir: str) -> HelperComparison:
    """Run `crosshair diffbehavior` on one pair in a subprocess and read its verdict."""
    module = "kvspec_diff_" + pair.helper.replace(".", "_")
    with open(os.path.join(workdir, f"{module}.py"), "w") as file:
        file.write(PAIR_MODULE.format(helper=pair.helper, target=pair.target, COMPARED_MARK=COMPARED_MARK))
    # The child sees what this process sees (an adapter found through its sys.path too).
    path = [workdir, *(entry or os.getcwd() for entry in sys.path)]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    command = [sys.executable, "-m", "crosshair", "diffbehavior", *crosshair_options(args),
               f"{module}.spec", f"{module}.adapter"]
    started = time.perf_counter()
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, env=environment, cwd=workdir,
                                timeout=helper_timeout(args))
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or b""  # bytes, whatever `text` says
        output = output.decode(errors="replace") if isinstance(output, bytes) else output
        return HelperComparison(pair.helper, pair.target, "error", time.perf_counter() - started,
                       f"timed out after {helper_timeout(args):.0f} s (a hanging helper? raise --helper-timeout)",
                       crosshair_output=output)
    seconds = time.perf_counter() - started
    output = result.stdout + result.stderr
    found = counterexamples(result.stdout)
    compared = re.search(re.escape(COMPARED_MARK) + r"(\d+)", result.stderr)
    if result.returncode == 0 and compared and compared[1] == "0":
        return HelperComparison(pair.helper, pair.target, "error", seconds,
                       "CrossHair found no input that meets the spec helper's preconditions, so compared "
                       "nothing; raise --per-condition-timeout", crosshair_output=output)
    if result.returncode == 0:
        iterations = re.search(r"attempted (\d+) iterations", result.stdout)
        detail = ("all paths exhausted" if "All paths exhausted" in result.stdout
                  else f"no difference in {iterations[1] if iterations else '?'} iterations")
        if compared:
            detail += f", {compared[1]} inside the preconditions"
        return HelperComparison(pair.helper, pair.target, "same", seconds, detail, crosshair_output=output)
    if result.returncode == 1 and found:
        return HelperComparison(pair.helper, pair.target, "DIFFERENT", seconds, "", found, output)
    # Exit 2 is an import failure or nondeterminism; 1 without a difference, a crash.
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    reason = lines[-1] if lines else f"crosshair exited {result.returncode}"
    if "nondetermin" in output.lower():
        reason = "the helper is nondeterministic (the same input gave different results): " + reason
    return HelperComparison(pair.helper, pair.target, "error", seconds, reason, found, output)
