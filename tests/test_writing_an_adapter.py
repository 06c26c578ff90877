"""docs/writing-an-adapter.md: its example adapter passes its check, the example's seeded
leak fails it naming I2, its capability table lists exactly the Capability members with
their meaning, and every name and repository path the page cites exists (its section on
replaying the vectors from another language is vectors/INTERPRETING.md:
tests/test_interpreting.py)."""

import importlib
import json
import re
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from kvspec.conformance.harness import families
from kvspec.conformance.harness.declarations import Capability

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "writing-an-adapter.md"
EXAMPLE = "docs.examples.minimal_allocator"
KVSPEC = shutil.which("kvspec") or str(Path(sys.executable).with_name("kvspec"))

NOT_IN_REPOSITORY = {"kvspec-traces/"}
"""Paths the page names that a command writes (a check's traces)."""
GROUPS = {families.ADAPTERS, families.FAMILIES, families.DIVERGENCES}
"""Entry-point group names: dotted, but groups, not modules."""
FILE_SUFFIXES = {".py", ".md", ".json", ".jsonl", ".toml", ".txt"}


def check(adapter: str, traces: Path) -> subprocess.CompletedProcess:
    """The page's command, from the repository root (the CLI puts the cwd on sys.path),
    shrinking for 5 s instead of the quick profile's 30: the verdict does not depend on it."""
    return subprocess.run([KVSPEC, "check", "--adapter", f"{EXAMPLE}:{adapter}", "--profile", "quick",
                           "--run", "allocator P=1", "--seed", "1", "--traces", str(traces), "--shrink-seconds", "5"],
                          check=False, capture_output=True, text=True, cwd=REPO, timeout=600)


def test_the_minimal_allocator_passes_its_check(tmp_path):
    result = check("ADAPTER", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "allocator P=1: ok" in result.stdout
    assert not list(tmp_path.iterdir())  # no counterexample was saved


def test_its_seeded_leak_fails_the_check_naming_i2(tmp_path):
    result = check("LEAKY_ADAPTER", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[I2]" in result.stdout and "VIOLATED I2" in result.stdout, result.stdout
    trace, = tmp_path.glob("*.jsonl")
    assert json.loads(trace.read_text().splitlines()[-1])["violated"] == ["I2"]


def inline_code(text: str) -> list[str]:
    """The page's `code` spans, outside fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return re.findall(r"`([^`\n]+)`", prose)


def resolve(name: str):
    """import a.b.c then getattr the rest; `module:attribute` too."""
    dotted, _, attribute = name.partition(":")
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:] + ([attribute] if attribute else []):
            found = getattr(found, part)
        return found
    raise ModuleNotFoundError(name)


def test_every_kvspec_name_the_page_cites_exists():
    names = {match for span in inline_code(PAGE.read_text())
             for match in re.findall(r"(?<![\w./])kvspec(?:\.\w+)+(?::\w+)?", span)}
    assert len(names) > 20  # the page cites the protocol's names
    missing = []
    for name in sorted(names):
        if name in GROUPS:
            if not entry_points(group=name):
                missing.append(f"{name} (no entry point in this group)")
            continue
        try:
            resolve(name)
        except (ImportError, AttributeError) as error:
            missing.append(f"{name} ({error})")
    assert not missing, missing


def test_every_repository_path_the_page_cites_exists():
    paths = [span for span in inline_code(PAGE.read_text())
             if re.fullmatch(r"[\w./-]+", span) and not span.startswith(("/", "kvspec."))
             and ("/" in span or Path(span).suffix in FILE_SUFFIXES) and span not in NOT_IN_REPOSITORY]
    assert "docs/examples/minimal_allocator.py" in paths and "conformance/harness/protocol.py" in paths
    assert not [path for path in paths if not (REPO / path).exists()]


def capability_table(text: str) -> list[tuple[str, str]]:
    """The (capability, meaning) of each row of the page's capability table."""
    table = text[text.index("| capability | meaning | what runs only with it |"):]
    rows = table[:table.index("\n\n")].splitlines()[2:]
    return [tuple(cell.strip().strip("`") for cell in row.strip("|").split(" | ")[:2]) for row in rows]


def test_the_capability_table_is_declarations_capability_member_by_member():
    """The guide's table and the one table of capabilities (declarations.Capability) say the
    same: every member, in order, with its meaning; a new capability needs its row."""
    assert capability_table(PAGE.read_text()) == [(str(capability), capability.meaning) for capability in Capability]
