"""TokenSpeed's scheduler built from its published source with kvspec's seeded bugs
(bugs.py), beside the pinned wheel the tokenspeed adapter uses.

One build serves every bug: patches/seeded-bugs.diff adds a switch per bug to the C++
sources of tokenspeed-scheduler 0.1.42, and KVSPEC_TOKENSPEED_BUG chooses which one is on
when a Scheduler is constructed (bugs.select). Unset, the build is 0.1.42 (it keeps every
fact of tests/test_tokenspeed_semantics.py).

    python -m kvspec.adapters.tokenspeed.builds install     # about 3 min on 2 cores, once
    python -m kvspec.adapters.tokenspeed.builds path        # the folder, if installed

`install` fetches the sdist from PyPI (its sha256 checked on every fetch), builds a
pinned toolchain (build-requirements.txt) in a virtual environment of its own, applies
the patch, compiles (scikit-build-core, CMake, nanobind; a C++20 compiler and OpenSSL's
headers are needed) and installs the wheel alone (`pip install --no-deps --target`) into
`KVSPEC_TOKENSPEED_BUILDS` (default `~/.cache/kvspec/tokenspeed-builds`)/<name>, where
<name> digests everything the build depends on: a second `install` of the same inputs
returns at once. The patched source tree and its CMake build folder are kept between
builds, and a file is rewritten only when the patch changes it, so a rebuild after an
edit of the patch recompiles only what the edit touches.

One process imports one `tokenspeed_scheduler`. `activate()` puts the build's folder first
on `sys.path` before anything imports it, and names the folder in KVSPEC_TOKENSPEED_BUILD
for the processes this one starts: kvspec's forkserver preloads its imports before it
takes the parent's `sys.path`, so build_preload.py (a forkserver preload, listed before
kvspec.adapters.tokenspeed.runtime) activates the build the variable names.
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from kvspec.conformance.harness.families import UnavailableMember

VERSION = "0.1.42"
SDIST = f"tokenspeed_scheduler-{VERSION}.tar.gz"
SDIST_SHA256 = "c39667f8f7f3af98c475f9e4975094037466406d48bcbf69bc636e39cb571319"
"""The sdist of tokenspeed-scheduler 0.1.42 on PyPI, as first fetched for kvspec."""
HERE = Path(__file__).parent
PATCHES = HERE / "patches"
TOOLCHAIN = HERE / "build-requirements.txt"
ACTIVE = "KVSPEC_TOKENSPEED_BUILD"
"""Names the activated build's folder for child processes (the forkserver's preload)."""
CMAKE_DEFINES = ("CMAKE_UNITY_BUILD=ON", "CMAKE_UNITY_BUILD_BATCH_SIZE=11")
"""Beside the sdist's own CMake settings: the core library's 21 sources share heavy headers
(spdlog, the STL), so compiling them as two unity batches (one per core of a 2-core
machine) takes about a third of the CPU time of one object per source (about 90 s
against 250 s here)."""
INSTALL_COMMAND = "python -m kvspec.adapters.tokenspeed.builds install"
MARKER = "kvspec-build.json"
"""Written last into an installed build's folder: what it was built from, and how long it took."""


class BuildError(RuntimeError):
    """The build could not be made here: what is missing, and how to get it."""


class BuildNotInstalled(UnavailableMember):
    """The patched build has no folder yet."""


class OtherBuildLoaded(UnavailableMember):
    """This process already imported another tokenspeed_scheduler (the pinned wheel, say)."""


# -- where things live ------------------------------------------------------------------------


def home() -> Path:
    return Path(os.environ.get("KVSPEC_TOKENSPEED_BUILDS", Path.home() / ".cache" / "kvspec" / "tokenspeed-builds"))


def patches() -> list[Path]:
    return sorted(PATCHES.glob("*.diff"))


def interpreter() -> str:
    """The interpreter and machine a compiled build is for."""
    return f"{sys.implementation.cache_tag}-{platform.machine()}"


def pins() -> list[str]:
    return [line for line in TOOLCHAIN.read_text().splitlines() if line.strip() and not line.startswith("#")]


def toolchain_key() -> str:
    digest = hashlib.sha256(TOOLCHAIN.read_bytes() + interpreter().encode()).hexdigest()
    return digest[:12]


def build_name() -> str:
    """The build's name: the version and a digest of every input of the build (the sdist,
    the patches, the toolchain's pins, the interpreter), so a change of any makes a new
    build instead of reusing a stale one."""
    digest = hashlib.sha256(SDIST_SHA256.encode())
    for patch in patches():
        digest.update(patch.name.encode() + b"\0" + patch.read_bytes())
    digest.update(TOOLCHAIN.read_bytes() + interpreter().encode() + " ".join(CMAKE_DEFINES).encode())
    return f"{VERSION}-seeded-{digest.hexdigest()[:12]}"


def folder() -> Path:
    return home() / build_name()


def installed() -> bool:
    return (folder() / MARKER).is_file() and (folder() / "tokenspeed_scheduler" / "__init__.py").is_file()


# -- the steps --------------------------------------------------------------------------------


def run(command: list[str], log: Path, what: str, **kwargs) -> None:
    """Run one step, its output appended to `log`; a failure names the step and shows the
    end of the log."""
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False, **kwargs)
        out.write(f"[{what}: {time.monotonic() - started:.1f} s]\n")
    if done.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise BuildError(f"{what} failed (exit {done.returncode}); the whole log is {log}. Its end:\n{tail}")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_compiler() -> str:
    """The C++ compiler CMake will find, checked for OpenSSL's headers (the scheduler hashes
    prefixes with OpenSSL's SHA-256); what to install when either is missing."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    compiler = next((found for name in names if (found := shutil.which(name))), None)
    if compiler is None:
        raise BuildError(f"no C++ compiler found ({', or '.join(names)} on PATH): TokenSpeed's scheduler is C++20; "
                         f"install one (Debian/Ubuntu: apt-get install g++, GCC 12 or newer) or set CXX")
    probe = subprocess.run([compiler, "-std=c++20", "-E", "-x", "c++", "-"], check=False, input="#include <openssl/sha.h>\n",
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise BuildError(f"{compiler} finds no OpenSSL headers (<openssl/sha.h>), which the scheduler needs: install "
                         f"them (Debian/Ubuntu: apt-get install libssl-dev)\n{probe.stderr.strip()[-500:]}")
    return compiler


def toolchain(log: Path) -> Path:
    """The pinned build toolchain's interpreter, in a virtual environment of its own,
    made once per set of pins and interpreter."""
    venv = home() / f"toolchain-{toolchain_key()}"
    python = venv / "bin" / "python"
    if (venv / "kvspec-toolchain-ready").is_file():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(venv)], log, "creating the toolchain's virtual environment")
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-r", str(TOOLCHAIN)],
        log, f"installing the build toolchain ({TOOLCHAIN.name})")
    (venv / "kvspec-toolchain-ready").write_text(TOOLCHAIN.read_text())
    return python


def fetch(python: Path, log: Path) -> Path:
    """The sdist, downloaded once into home()/sdist and checked against SDIST_SHA256
    whenever it is used (a file placed there by hand is checked the same way)."""
    target = home() / "sdist"
    sdist = target / SDIST
    if not sdist.is_file():
        target.mkdir(parents=True, exist_ok=True)
        # --no-binary for this package only (with :all: pip also builds the build tools from
        # source and does not finish); --no-build-isolation reads its metadata with the toolchain.
        run([str(python), "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--no-binary", "tokenspeed-scheduler", "--no-build-isolation", "-d", str(target),
             f"tokenspeed-scheduler=={VERSION}"], log,
            f"downloading {SDIST} from PyPI (offline? put the file at {sdist})")
    found = sha256(sdist)
    if found != SDIST_SHA256:
        sdist.unlink()
        raise BuildError(f"{SDIST} has sha256 {found}, not the {SDIST_SHA256} kvspec pins: the file was replaced or "
                         f"damaged; it was deleted, so the next install fetches it again")
    return sdist


def unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, filter="data")
        else:  # Python < 3.11.4: the archive's sha256 was checked, so its members are the pinned ones
            archive.extractall(into)
    return into / f"tokenspeed_scheduler-{VERSION}"


def apply_patches(tree: Path, log: Path) -> None:
    if shutil.which("patch") is None:
        raise BuildError("the `patch` tool is missing (Debian/Ubuntu: apt-get install patch)")
    for diff in patches():
        base = ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-d", str(tree), "-i", str(diff)]
        # a dry run first: a patch that no longer fits the sdist changes nothing
        run([*base, "--dry-run"], log, f"checking {diff.name} against {SDIST}")
        run(base, log, f"applying {diff.name}")


def sync(fresh: Path, tree: Path, keep: str = "build") -> list[str]:
    """Make `tree` equal to `fresh` (its `keep` folder aside), rewriting only the files
    whose content differs: the others keep their timestamps, so ninja recompiles only what
    changed. Returns the files rewritten or removed."""
    changed = []
    wanted = set()
    for source in fresh.rglob("*"):
        if source.is_dir():
            continue
        relative = source.relative_to(fresh)
        wanted.add(relative)
        target = tree / relative
        if not target.is_file() or target.read_bytes() != source.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)  # a new timestamp, unlike copy2: ninja must see the change
            changed.append(str(relative))
    for target in tree.rglob("*"):
        relative = target.relative_to(tree)
        if target.is_file() and relative.parts[0] != keep and relative not in wanted:
            target.unlink()
            changed.append(str(relative))
    return changed


def patched_source(sdist: Path, log: Path) -> Path:
    """The patched source tree, kept (with its CMake build folder) between builds."""
    tree = home() / "work" / toolchain_key() / f"tokenspeed_scheduler-{VERSION}"
    tree.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home()) as scratch:
        fresh = unpack(sdist, Path(scratch))
        apply_patches(fresh, log)
        changed = sync(fresh, tree)
    with log.open("a") as out:
        out.write(f"\nsource tree {tree}: {len(changed)} files rewritten\n")
    return tree


def compile_wheel(python: Path, tree: Path, jobs: int, log: Path) -> Path:
    wheels = home() / "wheels" / build_name()
    shutil.rmtree(wheels, ignore_errors=True)
    environment = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    # the sdist's own build settings (Release, its CMake options) with the pinned toolchain, in unity batches
    defines = [f"--config-settings=cmake.define.{define}" for define in CMAKE_DEFINES]
    run([str(python), "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
         *defines, "-w", str(wheels), str(tree)], log, "compiling the patched scheduler", env=environment)
    wheel, = wheels.glob("tokenspeed_scheduler-*.whl")
    return wheel


def check_switches(target: Path) -> None:
    """The installed build imports in this interpreter and has exactly the switches bugs.py
    lists, in order (the patch and the list are edited together)."""
    from .bugs import BY_SLUG

    probe = "import tokenspeed_scheduler as ts; print(' '.join(ts._ext.kvspec_seeded_bugs()))"
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(target)})
    if done.returncode != 0:
        raise BuildError(f"the build in {target} does not import here:\n{done.stderr.strip()[-1500:]}")
    if done.stdout.split() != list(BY_SLUG):
        raise BuildError(f"the build's switches {done.stdout.split()} are not bugs.py's {list(BY_SLUG)}: "
                         f"edit patches/seeded-bugs.diff and bugs.py together")


@contextlib.contextmanager
def locked():
    """One install at a time in home() (pytest-xdist workers, two CI steps)."""
    home().mkdir(parents=True, exist_ok=True)
    with (home() / "install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def install(jobs: int = 2, force: bool = False) -> Path:
    """Build and install the patched scheduler into folder(), unless it is there already."""
    with locked():
        if installed() and not force:
            return folder()
        started = time.monotonic()
        check_compiler()
        logs = home() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{build_name()}.log"
        log.write_text(f"kvspec: building {build_name()} ({SDIST} with {', '.join(p.name for p in patches())})\n")
        python = toolchain(log)
        sdist = fetch(python, log)
        tree = patched_source(sdist, log)
        wheel = compile_wheel(python, tree, jobs, log)
        partial = folder().parent / f"{folder().name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-compile",
             "--target", str(partial), str(wheel)], log, "installing the patched wheel")
        check_switches(partial)
        (partial / MARKER).write_text(json.dumps({
            "name": build_name(), "version": VERSION, "sdist_sha256": SDIST_SHA256,
            "patches": {patch.name: sha256(patch) for patch in patches()},
            "toolchain": pins(), "interpreter": interpreter(),
            "seconds": round(time.monotonic() - started, 1)}, indent=2))
        shutil.rmtree(folder(), ignore_errors=True)
        partial.rename(folder())  # a folder is complete or absent
        return folder()


# -- using it ---------------------------------------------------------------------------------


def activate() -> Path:
    """Make `import tokenspeed_scheduler` import the patched build in this process (and in
    the processes it starts, through build_preload.py). Call it before anything imports
    tokenspeed_scheduler; the bug itself is chosen later, per Scheduler (bugs.select)."""
    if not installed():
        raise BuildNotInstalled(f"TokenSpeed's patched build {build_name()} is not installed under {home()}; "
                                f"build it with `{INSTALL_COMMAND}` (about 3 min on 2 cores; needs a C++20 compiler "
                                f"and OpenSSL's headers)")
    path = str(folder())
    loaded = sys.modules.get("tokenspeed_scheduler")
    if loaded is not None and not str(Path(loaded.__file__).resolve()).startswith(str(Path(path).resolve())):
        raise OtherBuildLoaded(f"this process already imported tokenspeed_scheduler from "
                               f"{Path(loaded.__file__).parent}; one process imports one build: activate the patched "
                               f"one before the first import (in a forkserver: build_preload before runtime)")
    if path not in sys.path:
        sys.path.insert(0, path)
    os.environ[ACTIVE] = path
    return folder()


def activate_from_environment() -> None:
    """Activate the build KVSPEC_TOKENSPEED_BUILD names, if it names one (a process started
    by one that called activate())."""
    if os.environ.get(ACTIVE):
        if Path(os.environ[ACTIVE]) != folder():
            raise OtherBuildLoaded(f"{ACTIVE}={os.environ[ACTIVE]} names another build than this kvspec's "
                                   f"({folder()}); reinstall with `{INSTALL_COMMAND}`")
        activate()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.adapters.tokenspeed.builds",
                                     description="TokenSpeed's scheduler 0.1.42 with kvspec's seeded bugs.")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("install", help="fetch, patch, compile and install the build (cached: a no-op when present)")
    add.add_argument("-j", "--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    add.add_argument("--force", action="store_true", help="build again even if installed (incremental)")
    sub.add_parser("path", help="print the build's folder; exit 1 if it is not installed")
    args = parser.parse_args()
    if args.command == "path":
        print(folder())
        return 0 if installed() else 1
    started = time.monotonic()
    was_there = installed() and not args.force
    try:
        path = install(args.jobs, args.force)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    took = "already installed" if was_there else f"built in {time.monotonic() - started:.0f} s"
    print(f"TokenSpeed {VERSION} with seeded bugs: {path} ({took})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
