"""Release day (conformance/harness/built_for.py): a pinned adapter run where its engine's
installed release is not one it was built for is a clear error, exit 2, naming both releases
and what to use instead, before anything runs; never a crash blamed on the engine.

The installed release is what the package's metadata says: a folder holding only another
release's metadata, put first on the path, is that release installed, for this check."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.conformance.harness.built_for import BuiltFor, installed_version, release_problem
from kvspec.conformance.harness.protocol import AdapterError, load_adapter


def metadata_of(folder: Path, distribution: str, version: str) -> Path:
    info = folder / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    return folder


def check_with(folder: Path, adapter: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", adapter,
                           "--profile", "quick", "--seed", "0", "-n", "1"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("adapter, distribution, installed, instead", [
    ("vllm", "vllm", "0.35.0", "install a supported release (pip install --no-deps -r adapters/vllm/requirements.txt)"),
    ("sglang-python", "sglang", "0.5.22", "use its member of SGLang's releases: `--adapter sglang@0.5.22`"),
    ("vllm-dense", "vllm", "0.27.0", "use its member of vLLM's releases: `--adapter vllm@0.27.0`"),
    ("tokenspeed", "tokenspeed-scheduler", "0.1.43", "install a supported release"),
])
def test_an_unsupported_release_is_exit_2_naming_both_releases_and_what_to_use(tmp_path, adapter, distribution,
                                                                              installed, instead):
    done = check_with(metadata_of(tmp_path, distribution, installed), adapter)
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert f"{installed} is installed" in message and "nothing was run" in message and instead in message, message
    assert "Traceback" not in done.stderr and "CRASHED" not in done.stdout


def test_a_supported_release_or_none_installed_is_no_problem():
    assert release_problem(BuiltFor("pytest", (installed_version("pytest"),)), "x") is None
    assert release_problem(BuiltFor("no-such-engine-distribution", ("1.0",)), "x") is None  # its import says so
    assert "drives pytest 0.0.1, but pytest" in release_problem(BuiltFor("pytest", ("0.0.1",)), "x")


class Declared:
    name, policy_version, capabilities = "declared", "sglang-0.5.23", ()

    @staticmethod
    def make_allocator(size_full, size_swa, page_size):
        raise NotImplementedError


def test_an_adapter_declares_built_for_as_one_value_and_is_refused_where_it_does_not_hold():
    Declared.built_for = ("pytest", "1.0")
    with pytest.raises(AdapterError, match="built_for must be a kvspec.conformance.harness.built_for.BuiltFor"):
        load_adapter(f"{__name__}:Declared")
    Declared.built_for = BuiltFor("pytest", ("0.0.1",))  # not the installed release: refused
    with pytest.raises(AdapterError, match="but pytest .* is installed"):
        load_adapter(f"{__name__}:Declared")
    Declared.built_for = BuiltFor("pytest", (installed_version("pytest"),))
    assert load_adapter(f"{__name__}:Declared").name == "declared"


# -- the adapter's own fault (built_for.adapter_fault) ----------------------------------------

@pytest.mark.parametrize("adapter, what", [
    ("READS_A_GONE_ATTRIBUTE", "reads `TwoPoolEngine.block_hashes`, which it does not have"),
    ("CALLS_AN_OLD_SIGNATURE", "makes a call whose arguments the callee no longer takes"),
    ("IMPORTS_A_MOVED_NAME", "imports from `kvspec.reference.engine` what it does not have"),
])
def test_a_stale_adapter_is_the_adapters_fault_with_the_installed_release_never_the_engines_crash(tmp_path, adapter,
                                                                                                 what):
    done = check_stale(tmp_path, adapter)
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert f"the adapter's own fault, not the reference's: its code (stale_adapters.py:" in message, message
    assert what in message and f"the reference {installed_version('kvspec')} (installed;" in message, message
    assert "CRASHED" not in done.stdout and "ERROR" in done.stdout, done.stdout


@pytest.mark.parametrize("adapter", ["UNPINNED_READS_A_GONE_ATTRIBUTE", "BROKEN_ENGINE"])
def test_what_the_engine_raises_and_what_an_unpinned_adapter_raises_stay_crashes(tmp_path, adapter):
    done = check_stale(tmp_path, adapter)  # an adapter that names no engine release; the engine's own code raising
    assert done.returncode == 1, done.stdout + done.stderr
    assert "CRASHED" in done.stdout and "own fault" not in done.stderr, done.stdout + done.stderr


def check_stale(folder: Path, adapter: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(Path(__file__).parent),
                                                                     os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "kvspec.conformance.cli", "check", "--adapter", f"stale_adapters:{adapter}",
                           "--profile", "quick", "--seed", "0", "-n", "1", "--run", "engine P=1 W=3", "--no-shrink"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False)
