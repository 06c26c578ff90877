"""The arrows of the architecture, read off the installed package's imports.

spec <- reference; spec <- conformance <- adapters: the spec imports nothing of kvspec's
own but itself, the reference only the spec, the harness never an adapter (adapters and
their families reach it through entry points: kvspec.conformance.harness.families), and no two
subpackages import each other, directly or around a cycle. Every import counts, also
one inside a function.
"""

import ast
import importlib.util
from collections import defaultdict
from pathlib import Path

import pytest

TOP = ("kvspec.spec", "kvspec.reference", "kvspec.conformance", "kvspec.adapters")
ALLOWED = {  # what each top-level subpackage may import of kvspec
    "kvspec.spec": {"kvspec.spec"},
    "kvspec.reference": {"kvspec.spec", "kvspec.reference"},
    "kvspec.conformance": {"kvspec.spec", "kvspec.conformance"},
    "kvspec.adapters": set(TOP),
}


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the installed package: name -> (source file, is a package)."""
    found = {}
    for top in TOP:
        root = Path(importlib.util.find_spec(top).submodule_search_locations[0])
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            found[".".join((top, *(parts[:-1] if is_package else parts)))] = (path, is_package)
    return found


def imported(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The kvspec modules a module imports, relative imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target.startswith("kvspec.")}
    return found


def package_of(module: str, all_modules: dict[str, tuple[Path, bool]]) -> str:
    return module if all_modules.get(module, (None, False))[1] else module.rpartition(".")[0]


def import_graph() -> dict[str, set[str]]:
    """Subpackage -> the other subpackages its modules import."""
    all_modules = modules()
    graph = defaultdict(set)
    for name, (path, is_package) in all_modules.items():
        source = package_of(name, all_modules)
        for target in imported(name, path, is_package, set(all_modules)):
            while target not in all_modules and "." in target:  # `from kvspec.x import name`
                target = target.rpartition(".")[0]
            destination = package_of(target, all_modules)
            if destination != source:
                graph[source].add(destination)
    return graph


def top_of(package: str) -> str:
    return next(top for top in TOP if package == top or package.startswith(top + "."))


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph, as the packages along it, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == "open":
                return stack[stack.index(successor):] + [successor]
            if successor not in state and (found := visit(successor)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walk_sees_the_imports_it_must():
    """The walk is not blind: it finds the harness's imports of the spec, an adapter's of
    the harness, and one written inside a function."""
    graph = import_graph()
    assert "kvspec.spec" in graph["kvspec.conformance.harness"]
    assert "kvspec.conformance.harness" in graph["kvspec.adapters.sglang"]
    assert "kvspec.reference" in graph["kvspec.adapters"]  # adapters/reference.py imports inside a method


def test_each_subpackage_imports_only_what_the_architecture_allows():
    graph = import_graph()
    wrong = sorted(f"{source} imports {target}" for source, targets in graph.items() for target in targets
                   if top_of(target) not in ALLOWED[top_of(source)])
    assert not wrong, "arrows point the wrong way:\n  " + "\n  ".join(wrong)


def test_no_cycle_between_subpackages():
    found = cycle(import_graph())
    assert found is None, "subpackages import each other: " + " -> ".join(found)


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_the_cycle_finder_finds_a_seeded_cycle(graph, expected):
    """A seeded cycle is found (and a chain is not one), so the test above can fail."""
    assert cycle(graph) == expected


def test_an_adapter_import_from_the_harness_would_be_seen(tmp_path):
    """A seeded bug: a harness module that imports an adapter is reported by the walk."""
    source = tmp_path / "resolve.py"
    source.write_text("def f():\n    from kvspec.adapters.mutants import MUTANTS\n", encoding="utf-8")
    found = imported("kvspec.conformance.resolve", source, False, set(modules()))
    assert top_of(package_of(next(iter(found)), modules())) == "kvspec.adapters"
    assert "kvspec.adapters" not in ALLOWED["kvspec.conformance"]
