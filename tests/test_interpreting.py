"""vectors/INTERPRETING.md, the instructions for a runner in any language: the versions it
says it describes are the ones kvspec reads and writes, every trace line it quotes is a
line of the tree, its capability table is the table kvspec skips by, and every name and
path it cites exists."""

import json
import re
from pathlib import Path

from test_writing_an_adapter import inline_code, resolve

from kvspec.conformance.harness.declarations import Capability
from kvspec.conformance.harness.needs import NOT_FROM_STEPS
from kvspec.conformance.harness.trace import FORMAT_VERSION, SCHEMA_ID
from kvspec.conformance.runs.tree import CONFORMANCE, INDEX, INDEX_SCHEMA, INDEX_VERSION, TREE

PAGE = TREE / "INTERPRETING.md"
REPO = TREE.parent


def test_it_says_which_trace_format_and_index_version_it_describes():
    text = PAGE.read_text()
    assert f"**trace format {FORMAT_VERSION}**" in text and f"`\"kvspec_trace\": {FORMAT_VERSION}`" in text
    assert f"**index version {INDEX_VERSION}**" in text and f"`\"kvspec_vectors\": {INDEX_VERSION}`" in text
    assert f"`{SCHEMA_ID}`" in text and f"`{INDEX_SCHEMA['$id']}`" in text


def test_every_quoted_trace_line_is_a_line_of_the_tree_and_the_count_is_the_corpus():
    """Every line of its ```json blocks is a line of a trace in the tree (the header's
    kvspec_version aside), and it gives the number of conformance vectors."""
    written = {json.dumps({k: v for k, v in json.loads(line).items() if k != "kvspec_version"}, sort_keys=True)
               for path in TREE.rglob("*.jsonl") for line in path.read_text().splitlines()}
    text = PAGE.read_text()
    quoted = [line for block in re.findall(r"^```json\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
              for line in block.splitlines() if line.strip()]
    assert len(quoted) >= 4
    for line in quoted:
        line = {k: v for k, v in json.loads(line).items() if k != "kvspec_version"}
        assert json.dumps(line, sort_keys=True) in written, line
    index = json.loads((TREE / INDEX).read_text())
    count = len([entry for entry in index["vectors"] if entry["file"].startswith(f"{CONFORMANCE}/")])
    assert f"writes {count} traces" in text


def test_its_capability_table_is_the_one_replay_skips_by():
    """Each capability's row: its meaning, and what needs it where a header says nothing
    (needs.derived_needs: never derived for NOT_FROM_STEPS)."""
    text = PAGE.read_text()
    for capability in Capability:
        needed = "never derived; only a header names it" if capability in NOT_FROM_STEPS else capability.needed_by
        assert f"| `{capability.value}` | {capability.meaning} | {needed} |" in text, capability


def test_every_name_and_path_it_cites_exists():
    """A path is the repository's or the tree's (`conformance/allocator/` is the tree's)."""
    spans = inline_code(PAGE.read_text())
    names = {match for span in spans for match in re.findall(r"(?<![\w./])kvspec(?:\.\w+)+(?::\w+)?", span)}
    assert names and all(resolve(name) is not None for name in names)
    paths = [span for span in spans if re.fullmatch(r"[\w./<>-]+", span) and "/" in span
             and not span.startswith(("/", "kvspec.", "DIR/")) and "<" not in span]  # DIR: a placeholder
    assert "conformance/schemas/trace.schema.json" in paths and "regressions/sglang/" in paths
    missing = [path for path in paths if not (REPO / path).exists() and not (TREE / path).exists()]
    assert not missing, missing
    assert Path(REPO / "docs" / "writing-an-adapter.md").read_text().count("vectors/INTERPRETING.md") >= 1
