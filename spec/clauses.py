"""The clause index: the chapters' clauses joined with the definitions they cite.

A chapter is a Markdown file `NN-name.md` beside this module. Every heading
`### ID Title` opens a clause; its text runs to the next heading of level 1 to 3, and
its line `Definitions: ...` cites qualified names in backticks. A definition claims a
clause by writing its id in square brackets in its docstring, alone or in a
comma-separated list, each id optionally followed by words (`[ID]`, `[ID, ID]`,
`[ID full pool, ID SWA pool]`). A range (`[ID .. ID]`) only says what a module is
about; it claims nothing. An id is `WORD-N` in capitals (`PAGE-1`) or `I` and a number.

Chapters are read with importlib.resources, so this works from an installed wheel.
"""

import ast
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass
from importlib.resources import files

from .notation import Violation

CLAUSE_ID = r"[A-Z]+-\d+|I\d+"
CHAPTER_NAME = re.compile(r"\d\d-[\w-]+\.md")
CLAUSE_HEADING = re.compile(rf"### ({CLAUSE_ID}) (\S.*)")
ANY_HEADING = re.compile(r"#{1,3} ")
BRACKETS = re.compile(r"\[([^\[\]]+)\]")
CLAIM_ITEM = re.compile(rf"\s*({CLAUSE_ID})(\s[^,]*)?")
DEFINITIONS_LINE = "Definitions:"


@dataclass(frozen=True)
class Clause:
    id: str
    title: str
    chapter: str
    prose: str
    definitions: tuple[str, ...]


# -- chapters ---------------------------------------------------------------------------

def chapter_names() -> list[str]:
    """The chapter files shipped with kvspec.spec, in reading order."""
    return sorted(entry.name for entry in files(__package__).iterdir() if CHAPTER_NAME.fullmatch(entry.name))


def parse_chapter(chapter: str, text: str) -> list[Clause]:
    """Every clause of one chapter, in order."""
    clauses = []
    heading, body, in_code = None, [], False
    for line in text.splitlines() + ["# end"]:
        if line.startswith("```"):
            in_code = not in_code
        if ANY_HEADING.match(line) and not in_code:
            if heading:
                clauses.append(make_clause(chapter, heading, body))
            heading, body = CLAUSE_HEADING.fullmatch(line.rstrip()), []
            # A level-3 heading that is not a clause would silently swallow the text after it.
            if line.startswith("### ") and not heading:
                raise ValueError(f"{chapter}: heading {line!r} is not `### CLAUSE-ID Title`")
        else:
            body.append(line)
    return clauses


def make_clause(chapter: str, heading: re.Match, body: list[str]) -> Clause:
    cited = [line for line in body if line.startswith(DEFINITIONS_LINE)]
    if len(cited) != 1:
        raise ValueError(f"{chapter}: clause {heading[1]} needs exactly one line starting with "
                         f"{DEFINITIONS_LINE!r} (found {len(cited)})")
    prose = "\n".join(line for line in body if not line.startswith(DEFINITIONS_LINE)).strip()
    return Clause(heading[1], heading[2].strip(), chapter, prose, tuple(re.findall(r"`([^`]+)`", cited[0])))


def read_clauses() -> list[Clause]:
    """Every clause of every chapter, duplicates included."""
    clauses = []
    for chapter in chapter_names():
        clauses.extend(parse_chapter(chapter, files(__package__).joinpath(chapter).read_text(encoding="utf-8")))
    return clauses


def load_clauses() -> dict[str, Clause]:
    """The clauses by id; an id with two headings is an error."""
    by_id: dict[str, Clause] = {}
    for clause in read_clauses():
        if clause.id in by_id:
            raise ValueError(f"clause {clause.id} is a heading in both {by_id[clause.id].chapter} and {clause.chapter}")
        by_id[clause.id] = clause
    return by_id


# -- definitions ------------------------------------------------------------------------

def resolve(qualified_name: str) -> object | None:
    """The module, class, function or constant a qualified name denotes; None if missing."""
    parts = qualified_name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only "this prefix is not a module" means: try a shorter one.
            if error.name and (module_name + ".").startswith(error.name + "."):
                continue
            raise
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
            if found is None:
                return None
        return found
    return None


def has_own_docstring(obj: object) -> bool:
    return inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj)


def attribute_docstrings(owner: object) -> dict[str, str]:
    """Docstrings written as a string right below an assignment (`NAME = ...` then
    `\"\"\"...\"\"\"`) in a module or class body, by attribute name."""
    return {name: docstring for name, (docstring, _) in documented_attributes(owner).items()}


def documented_attributes(owner: object) -> dict[str, tuple[str, str]]:
    """Per attribute with a docstring below its assignment (attribute_docstrings): the
    docstring, and the source of the assignment with the docstring."""
    source = textwrap.dedent(inspect.getsource(owner))
    tree = ast.parse(source)
    body = tree.body if inspect.ismodule(owner) else tree.body[0].body
    found = {}
    for statement, following in zip(body, body[1:]):
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
        elif isinstance(statement, ast.AnnAssign):
            target = statement.target
        else:
            continue
        if (isinstance(target, ast.Name) and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str)):
            found[target.id] = (inspect.cleandoc(following.value.value),
                                "\n".join(ast.get_source_segment(source, node) for node in (statement, following)))
    return found


def definition_docstring(qualified_name: str) -> str | None:
    """The docstring of a definition: its own, or for a constant the string below it."""
    found = resolve(qualified_name)
    if found is None:
        return None
    if has_own_docstring(found):
        return own_docstring(found)
    owner_name, _, attribute = qualified_name.rpartition(".")
    return attribute_docstrings(resolve(owner_name)).get(attribute)


def own_docstring(obj: object) -> str | None:
    """The docstring written on obj itself, not inherited from a base class."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return inspect.cleandoc(doc) if doc else None


def claims_in(docstring: str | None) -> set[str]:
    """The clause ids a docstring claims (see the module docstring for the forms)."""
    claimed = set()
    for group in BRACKETS.findall(docstring or ""):
        items = group.split(",")
        matches = [CLAIM_ITEM.fullmatch(item) for item in items]
        if all(matches):
            claimed.update(match[1] for match in matches if ".." not in match[0])
    return claimed


def claimed_clauses(obj: object) -> set[str]:
    """The clause ids a module, class or function claims in its own docstring."""
    return claims_in(own_docstring(obj)) if has_own_docstring(obj) else set()


def documented_definitions(module_name: str) -> dict[str, str]:
    """Every docstring of a module by qualified name: the module's own, its functions',
    classes' and their methods', and those of its constants and class fields."""
    module = importlib.import_module(module_name)
    found = {module_name: own_docstring(module)}
    for name, doc in attribute_docstrings(module).items():
        found[f"{module_name}.{name}"] = doc
    for name, obj in vars(module).items():
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or obj.__module__ != module_name:
            continue  # imported from elsewhere: documented where it is defined
        found[f"{module_name}.{name}"] = own_docstring(obj)
        if inspect.isclass(obj):
            for member_name, member in vars(obj).items():
                if inspect.isfunction(member):
                    found[f"{module_name}.{name}.{member_name}"] = own_docstring(member)
            for field, doc in attribute_docstrings(obj).items():
                found[f"{module_name}.{name}.{field}"] = doc
    return {name: doc for name, doc in found.items() if doc}


# -- checks -----------------------------------------------------------------------------

def citation_problems(clauses: dict[str, Clause]) -> list[Violation]:
    """Clauses that cite no definition, a name that does not resolve, or a definition
    whose docstring does not claim the clause."""
    found = []
    for clause in clauses.values():
        if not clause.definitions:
            found.append(Violation(clause.id, "cites no definition"))
        for name in clause.definitions:
            if resolve(name) is None:
                found.append(Violation(clause.id, f"cites `{name}`, which does not exist"))
            elif clause.id not in claims_in(definition_docstring(name)):
                found.append(Violation(clause.id, f"cites `{name}`, whose docstring does not claim [{clause.id}]"))
    return found


def claim_problems(clauses: dict[str, Clause], module_names: list[str]) -> list[Violation]:
    """Definitions that claim a clause id no chapter has a heading for."""
    found = []
    for module_name in module_names:
        for name, doc in documented_definitions(module_name).items():
            for clause_id in sorted(claims_in(doc) - set(clauses)):
                found.append(Violation(clause_id, f"claimed by `{name}`, but no chapter has a heading for it"))
    return found
