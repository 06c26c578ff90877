"""Clause coverage: for every clause of the spec, what checks it, which tests exercise it,
which seeded bugs break it and which real implementations diverge from it.

Nothing here is declared a second time: every link is read off the code that carries it.
A clause *cites* definitions (its `Definitions:` line); whatever evaluates one of them
works with that clause.

- A **check** is part of the conformance suite that fails when an implementation breaks
  a clause. A registered invariant check (conformance/harness/checks.py) reports its own clause;
  a function of the harness (HARNESS_MODULES) reports the clauses it raises a step
  failure with (`InvariantViolation(..., ["LIFE-1"])`) or claims in its docstring
  (`[ALLOC-2, ALLOC-4]`, the spec's own convention); both also enforce every clause whose
  definitions they evaluate, directly or through other spec functions.
  `kvspec diff-helpers` checks the clauses of each spec helper it compares with an
  adapter's own.
- A **test** is a test function of the project's suite that names a clause id (in its
  body, docstring, comments or decorators, or in a module-level constant it uses) or
  calls a definition a clause cites.
- A **mutant** is a bug of the zoo (adapters/mutants; adapters/sglang/mutants.py and
  adapters/vllm/mutants.py, patched into real SGLang and real vLLM), at its declared
  clause.
- A **divergence** is a known difference of real SGLang or vLLM
  (adapters/{sglang,vllm}/divergences.py), at the clauses it breaks.
- A **reference** definition is a function or class of the reference implementation
  (reference/) that claims the clause in its docstring (`[BLOCK-9]`): where the
  executable model does what the clause says. Its source is read, never imported (the
  harness does not import the reference: tests/test_architecture.py).

`Coverage.problems()` is what CI requires to be empty: every clause has a check and a
test, and nothing cites a clause id that no chapter has.
"""

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

import kvspec.spec
from kvspec.spec.clauses import CLAUSE_ID, Clause, claims_in, documented_definitions, load_clauses, resolve

SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds spec/, conformance/ and adapters/ (and tests/ in a checkout)."""
HARNESS_MODULES = ("protocol", "allocator_driver", "engine_driver", "differential", "replay", "checks")
"""The harness modules whose functions judge an implementation."""
STEP_FAILURES = {"StepFailure", "InvariantViolation", "ImplementationCrash", "StepNotApplicable"}
KINDS = ("reference", "check", "test", "mutant", "divergence")


@dataclass(frozen=True)
class Citation:
    """A check, test, mutant or divergence, and how it bears on each clause it names."""

    kind: str
    name: str
    where: str
    """Its source as `path::name`, the path relative to the repository root."""
    how: dict[str, str]
    """Per clause id: how this cites it ("reports", "evaluates `kvspec.spec.window.retention`")."""


@dataclass(frozen=True)
class Coverage:
    clauses: dict[str, Clause]
    citations: tuple[Citation, ...]

    def of(self, clause_id: str, kind: str) -> list[Citation]:
        return [c for c in self.citations if c.kind == kind and clause_id in c.how]

    def problems(self) -> list[str]:
        """Clauses with no check or no test, and citations of ids no chapter has."""
        found = [f"{clause_id} has no {kind}: write one that names {clause_id} (conformance/review/clause_coverage.py "
                 f"says what counts)" for clause_id in self.clauses for kind in ("check", "test")
                 if not self.of(clause_id, kind)]
        found += [f"{c.kind} {c.name} ({c.where}) cites {clause_id}, which no chapter has a heading for"
                  for c in self.citations for clause_id in c.how if clause_id not in self.clauses]
        return found


def coverage(tests: Path) -> Coverage:
    """Every clause of the chapters, and every citation of one, from the tests in `tests`."""
    clauses = load_clauses()
    definitions = spec_definitions()
    return Coverage(clauses, (*reference_definitions(), *invariant_checks(clauses, definitions),
                              *harness_checks(clauses, definitions), *helper_checks(),
                              *test_citations(tests, clauses, definitions), *mutants(), *divergences()))


def default_tests_folder() -> Path | None:
    """The project's tests, in a checkout (an installed wheel has none)."""
    folder = SOURCE_ROOT / "tests"
    return folder if folder.is_dir() else None


def where(path: str | Path, name: str) -> str:
    path = Path(path).resolve()
    return f"{path.relative_to(SOURCE_ROOT) if path.is_relative_to(SOURCE_ROOT) else path}::{name}"


# -- what a function evaluates ---------------------------------------------------------------

@dataclass(frozen=True)
class SpecIndex:
    """The qualified names of every module of kvspec.spec and every documented definition
    in one, and how code reaches them: a module, class or function by identity, a
    constant by its bare name."""

    names: frozenset[str]
    by_identity: dict[int, str]
    constants: dict[str, str]


def spec_definitions() -> SpecIndex:
    found = {}
    for module in pkgutil.walk_packages(kvspec.spec.__path__, "kvspec.spec."):
        for name in documented_definitions(module.name):
            found[name] = resolve(name)
    is_object = {name: inspect.isroutine(obj) or inspect.isclass(obj) or inspect.ismodule(obj)
                 for name, obj in found.items()}
    return SpecIndex(frozenset(found), {id(obj): name for name, obj in found.items() if is_object[name]},
                     {name.rpartition(".")[2]: name for name in found if not is_object[name]})


def code_names(code: CodeType) -> set[str]:
    """Every global and attribute name a function's code, nested code included, reads."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= code_names(constant)
    return names


def evaluated_definitions(function: Callable, definitions: SpecIndex) -> set[str]:
    """The spec definitions `function` evaluates: itself if it is one, those its code
    names (as a global, or as an attribute of a module it names), theirs in turn, and the
    modules they live in."""
    by_identity, constants = definitions.by_identity, definitions.constants
    found = {by_identity[id(function)]} if id(function) in by_identity else set()
    pending, seen = [function], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        names, namespace = code_names(current.__code__), current.__globals__
        reachable = [namespace[n] for n in names if n in namespace]
        reachable += [getattr(m, n) for m in reachable if inspect.ismodule(m) for n in names if hasattr(m, n)]
        for obj in reachable:
            if id(obj) in by_identity:
                found.add(by_identity[id(obj)])
                if inspect.isfunction(obj):
                    pending.append(obj)
        found |= {constants[n] for n in names if n in constants and n in namespace}
    return found | {name.rsplit(".", depth)[0] for name in found for depth in (1, 2)} & definitions.names


def clauses_evaluated(evaluated: set[str], clauses: dict[str, Clause], verb: str = "evaluates") -> dict[str, str]:
    """The clauses one of whose definitions is in `evaluated`, each with the first such."""
    return {clause.id: f"{verb} `{cited[0]}`" for clause in clauses.values()
            if (cited := [name for name in clause.definitions if name in evaluated])}


# -- checks ------------------------------------------------------------------------------------

def enforced(evaluated: set[str], clauses: dict[str, Clause]) -> dict[str, str]:
    """The clauses a check enforces by evaluating their definitions: never an invariant
    (`I5`), which only the checks that report it enforce (I2's check evaluates the
    definition that I3 cites too)."""
    return {c: how for c, how in clauses_evaluated(evaluated, clauses).items() if not re.fullmatch(r"I\d+", c)}

def invariant_checks(clauses: dict[str, Clause], definitions: SpecIndex) -> Iterator[Citation]:
    """Every registered invariant (kvspec.spec.registry), at the clause it reports."""
    from kvspec.spec.invariants import INVARIANTS
    from kvspec.spec.invariants.allocator import AllocatorView
    for check in INVARIANTS:
        how = enforced(evaluated_definitions(check.function, definitions), clauses) | {check.clause: "reports"}
        tier = "allocator" if check.snapshot_type is AllocatorView else "engine"
        yield Citation("check", f"{tier} {check.name}",
                       where(inspect.getsourcefile(check.function), check.function.__qualname__), how)


def harness_functions() -> Iterator[Callable]:
    """Every function and method written in the harness modules (not generated ones, such
    as a dataclass's __init__)."""
    for module_name in HARNESS_MODULES:
        module = importlib.import_module(f"kvspec.conformance.harness.{module_name}")
        members = [obj for obj in vars(module).values() if getattr(obj, "__module__", None) == module.__name__]
        members += [member for cls in members if inspect.isclass(cls) for member in vars(cls).values()]
        yield from (obj for obj in members if inspect.isfunction(obj) and obj.__code__.co_filename == module.__file__)


def reported_clauses(function: Callable) -> set[str]:
    """Clause ids in the list literals a function passes to a step failure."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {element.value for call in ast.walk(tree)
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) in STEP_FAILURES
            for argument in call.args[1:] if isinstance(argument, ast.List)
            for element in argument.elts if isinstance(element, ast.Constant)}


def harness_checks(clauses: dict[str, Clause], definitions: SpecIndex) -> Iterator[Citation]:
    for function in harness_functions():
        how = {c: "reports" for c in sorted(reported_clauses(function))}
        how |= {c: "claims it in its docstring" for c in sorted(claims_in(inspect.getdoc(function)))}
        if how:
            how = enforced(evaluated_definitions(function, definitions), clauses) | how
            yield Citation("check", function.__qualname__,
                           where(inspect.getsourcefile(function), function.__qualname__), how)


def helper_checks() -> Iterator[Citation]:
    from .helper_pairs import spec_helpers
    for helper, function in spec_helpers().items():
        how = {c: f"compares an adapter's own `{helper}` with the spec's" for c in sorted(claims_in(function.__doc__))}
        if how:
            yield Citation("check", f"diff-helpers {helper}", where(inspect.getsourcefile(function), function.__name__),
                           how)


# -- tests -------------------------------------------------------------------------------------

def named_clause_ids(text: str, clauses: dict[str, Clause]) -> set[str]:
    """The clause-shaped ids in `text` of a family the chapters use (`ALLOC-9` is one, an
    unknown one; `SGL-6`, a divergence id, and `UTF-8` are not)."""
    families = {clause_id.rpartition("-")[0] for clause_id in clauses}
    return {token for token in re.findall(rf"\b(?:{CLAUSE_ID})\b", text) if token.rpartition("-")[0] in families}


def imported_names(tree: ast.Module) -> dict[str, str]:
    """What each name a module imports from kvspec.spec stands for, qualified."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvspec.spec"):
            found |= {alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.asname: alias.name for alias in node.names if alias.asname}
    return found


def called_definitions(node: ast.AST, imported: dict[str, str], definitions: SpecIndex) -> set[str]:
    """The spec definitions a test's code names: `ceil_page(...)` or `pages.ceil_page(...)`."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id in imported:
            found.add(imported[child.id])
        elif isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) and child.value.id in imported:
            found.add(f"{imported[child.value.id]}.{child.attr}")
    return found & definitions.names


def test_functions(tree: ast.Module) -> Iterator[tuple[ast.FunctionDef, str]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            yield node, node.name
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from ((m, f"{node.name}.{m.name}") for m in node.body
                        if isinstance(m, ast.FunctionDef) and m.name.startswith("test"))


def test_citations(tests: Path, clauses: dict[str, Clause], definitions: SpecIndex) -> Iterator[Citation]:
    for path in sorted(tests.glob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source)
        imported = imported_names(tree)
        constants = {target.id: ast.get_source_segment(source, node)
                     for node in tree.body if isinstance(node, ast.Assign)
                     for target in node.targets if isinstance(target, ast.Name)}
        for node, name in test_functions(tree):
            first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            text = "\n".join(lines[first - 1:node.end_lineno])
            used = {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}
            used |= {child.id for d in node.decorator_list for child in ast.walk(d) if isinstance(child, ast.Name)}
            text += "\n".join(constants[n] for n in sorted(used) if n in constants)
            how = clauses_evaluated(called_definitions(node, imported, definitions), clauses, "calls")
            how |= {c: "names it" for c in sorted(named_clause_ids(text, clauses))}
            if how:
                yield Citation("test", name, where(path, name), how)


# -- the reference -----------------------------------------------------------------------------

def reference_definitions() -> Iterator[Citation]:
    """Every function, method and class of reference/ whose docstring claims a clause, read
    from its source."""
    for path in sorted((SOURCE_ROOT / "reference").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, name in documented_nodes(tree.body, ""):
            if claimed := claims_in(ast.get_docstring(node) or ""):
                yield Citation("reference", f"{path.stem}.{name}", where(path, name),
                               {c: "implements it" for c in sorted(claimed)})


def documented_nodes(body: list[ast.stmt], prefix: str) -> Iterator[tuple[ast.AST, str]]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            yield node, prefix + node.name
            if isinstance(node, ast.ClassDef):
                yield from documented_nodes(node.body, f"{prefix}{node.name}.")


# -- mutants and divergences -------------------------------------------------------------------

def mutants() -> Iterator[Citation]:
    """The members of every registered family (kvspec.conformance.harness.families), where its
    engine is installed or not: a family's members are importable without it."""
    from ..harness.families import seeded_families
    for family in sorted(seeded_families(), key=lambda f: f.prefix):
        for slug, mutant in sorted(family.members().items()):
            yield Citation("mutant", f"{family.prefix}{slug}", where(inspect.getsourcefile(mutant), mutant.__name__),
                           {mutant.clause: f"breaks it ({mutant.invariant_class}) in {family.shown_as}, "
                                           f"exposed by {mutant.exposed_by.label}"})


def divergences() -> Iterator[Citation]:
    """The known divergences of every registered list (importing a list imports no engine)."""
    from ..harness.families import divergences as registered
    for _, module, known in registered():
        for divergence in known:
            yield Citation("divergence", divergence.id, where(module.__file__, "KNOWN_DIVERGENCES"),
                           {c: f"{' and '.join(divergence.adapters)}: {divergence.title}" for c in divergence.clauses})
