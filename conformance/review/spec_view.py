"""`kvspec spec [--out DIR]`: the specification as reviewers read it.

One Markdown document (`spec.md`) and the same rendered as one self-contained HTML page
(`spec.html`): every chapter in order; after each clause, the source of the definitions
it cites and what carries its id (clause_coverage.py: where the reference implements it,
the checks that enforce it, the tests that exercise it, the bug-zoo mutants that break
it, the known divergences of real SGLang and vLLM); and up front a coverage matrix with a row per clause. Clause ids in the prose
link to their clause.

The command exits 1 when the coverage is incomplete (a clause without a check or a test,
or an id that no chapter has), after writing the documents, which list the problems.
"""

import html
import inspect
import os
import re
import sys
from importlib.resources import files
from pathlib import Path

from kvspec.spec.clauses import (
    CLAUSE_HEADING,
    CLAUSE_ID,
    DEFINITIONS_LINE,
    chapter_names,
    documented_attributes,
    resolve,
)

from ..harness.outputs import output_directory, write_text
from .clause_coverage import KINDS, SOURCE_ROOT, Citation, Coverage, coverage, default_tests_folder

TITLE = "kvspec: the specification"
"""The index chapter's title (spec/00-index.md)."""
KIND_HEADINGS = {"reference": "Implemented in the reference by", "check": "Checked by", "test": "Tested by",
                 "mutant": "Broken by (bug zoo)", "divergence": "Diverged from by"}
CITED_ID = re.compile(rf"`({CLAUSE_ID})`")
CODE_FENCE = "```"


# -- Markdown ------------------------------------------------------------------------------------

def markdown(cov: Coverage, root: str) -> str:
    """The whole document: title, problems if any, matrix, then every chapter. `root` is
    the repository root relative to where the document is written (for links to sources)."""
    index, *chapters = [(name, files("kvspec.spec").joinpath(name).read_text(encoding="utf-8"))
                        for name in chapter_names()]
    parts = [f"# {TITLE}\n",
             ("Rendered by `kvspec spec` from the chapters in `spec/`, the definitions they cite and the code "
              "that names each clause (`conformance/review/clause_coverage.py` says what counts as a check, a test, a "
              "mutant or a divergence).\n"),
             chapter(*index, cov, root, title=False),  # the preamble: its title is the document's
             "## Contents\n",
             *(f"- [{chapter_title(text)}](#{chapter_anchor(name)})" for name, text in chapters),
             "- [Clause coverage](#coverage)\n"]
    if problems := cov.problems():
        parts += ["## Coverage problems\n", *(f"- {problem}" for problem in problems), ""]
    parts += [coverage_matrix(cov)]
    parts += [chapter(name, text, cov, root) for name, text in chapters]
    return "\n".join(parts).rstrip() + "\n"


def chapter_title(text: str) -> str:
    return text.splitlines()[0].lstrip("# ").strip()


def chapter_anchor(name: str) -> str:
    return "chapter-" + name.removesuffix(".md")


def coverage_matrix(cov: Coverage) -> str:
    rows = ['<a id="coverage"></a>', "## Clause coverage\n",
            ("Per clause: the checks that enforce it, how many tests exercise it, the bugs of the zoo that break "
             "it, and the known divergences of real SGLang from it.\n"),
            "| clause | title | checks | tests | mutants | divergences |", "|---|---|---|---|---|---|"]
    for clause_id, clause in cov.clauses.items():
        checks = cov.of(clause_id, "check")
        reporting = [c.name for c in checks if c.how[clause_id] == "reports"]
        cells = [f"[{clause_id}](#{clause_id})", clause.title.replace("|", "\\|"),
                 f"{len(checks)}" + (f": {', '.join(reporting)}" if reporting else ""),
                 str(len(cov.of(clause_id, "test"))),
                 ", ".join(c.name.removeprefix("mutant-") for c in cov.of(clause_id, "mutant")),
                 ", ".join(c.name for c in cov.of(clause_id, "divergence"))]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def chapter(name: str, text: str, cov: Coverage, root: str, title: bool = True) -> str:
    """The chapter's own Markdown, one heading level down, with anchors, linked clause
    ids, and each clause's definitions and citations in place of its Definitions line."""
    out, clause_id, in_code = [], None, False
    for number, line in enumerate(text.splitlines()):
        if line.startswith(CODE_FENCE):
            in_code = not in_code
        if in_code or line.startswith(CODE_FENCE):
            out.append(line)
        elif number == 0:
            out += [f'<a id="{chapter_anchor(name)}"></a>', "", "#" + line] if title else []
        elif heading := CLAUSE_HEADING.fullmatch(line.rstrip()):
            clause_id = heading[1]
            out += [f'<a id="{clause_id}"></a>', "", f"#### {clause_id} {heading[2]}"]
        elif line.startswith("#"):
            out.append("#" + line)
        elif line.startswith(DEFINITIONS_LINE) and clause_id:
            out.append(clause_appendix(clause_id, cov, root))
        else:
            out.append(CITED_ID.sub(lambda m: link(m[1], cov), line))
    return "\n".join(out) + "\n"


def link(clause_id: str, cov: Coverage) -> str:
    return f"[`{clause_id}`](#{clause_id})" if clause_id in cov.clauses else f"`{clause_id}`"


def clause_appendix(clause_id: str, cov: Coverage, root: str) -> str:
    parts = ["**Definitions**\n"]
    for name in cov.clauses[clause_id].definitions:
        parts += [f"<details><summary><code>{name}</code></summary>\n", f"{CODE_FENCE}python",
                  definition_source(name).rstrip(), CODE_FENCE, "\n</details>\n"]
    for kind in KINDS:
        cited = cov.of(clause_id, kind)
        if cited:
            parts.append(f"**{KIND_HEADINGS[kind]}** ({len(cited)})\n")
            parts += [citation_line(c, clause_id, root) for c in cited] + [""]
    return "\n".join(parts)


def citation_line(citation: Citation, clause_id: str, root: str) -> str:
    path, _, name = citation.where.partition("::")
    source = f"[{path}]({Path(root, path).as_posix()}) `{name}`"  # Path() keeps an absolute path as it is
    if name == citation.name:  # a test: its file and name say it all
        return f"- {source}: {citation.how[clause_id]}"
    return f"- `{citation.name}`: {citation.how[clause_id]} ({source})"


def definition_source(qualified_name: str) -> str:
    """The source of a function or class; a module's docstring; a constant's assignment
    with the docstring below it."""
    found = resolve(qualified_name)
    if inspect.ismodule(found):
        return f'"""{inspect.getdoc(found)}"""\n# ... the whole module: {Path(inspect.getsourcefile(found)).name}'
    if inspect.isroutine(found) or inspect.isclass(found):
        return inspect.getsource(found)
    owner_name, _, attribute = qualified_name.rpartition(".")
    return documented_attributes(resolve(owner_name))[attribute][1]  # a cited constant claims its clause there


# -- HTML ----------------------------------------------------------------------------------------

STYLE = """
body { font: 16px/1.5 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #1b1f24; }
h1, h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .3rem; }
td:first-child { white-space: nowrap; }
h4 { font-size: 1.1rem; margin-top: 2rem; background: #f6f8fa; padding: .3rem .5rem; border-left: 4px solid #0969da; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .9rem; }
th, td { border: 1px solid #d0d7de; padding: .25rem .5rem; vertical-align: top; text-align: left; }
th { background: #f6f8fa; }
code { font: .85em ui-monospace, monospace; background: #f6f8fa; padding: .1em .3em; border-radius: 4px; }
pre { background: #f6f8fa; padding: .75rem; overflow-x: auto; border-radius: 6px; }
pre code { background: none; padding: 0; }
details { margin: .3rem 0; } summary { cursor: pointer; }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
"""


def render_html(document: str) -> str:
    """The Markdown document as one self-contained HTML page (no external resources)."""
    from markdown_it import MarkdownIt
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    def highlighted(code: str, language: str, attributes) -> str:
        try:
            lexer = get_lexer_by_name(language or "text")
        except ClassNotFound:
            return ""  # markdown-it escapes it as plain code
        return f'<pre class="highlight"><code>{highlight(code, lexer, HtmlFormatter(nowrap=True))}</code></pre>'

    body = MarkdownIt("commonmark", {"html": True, "highlight": highlighted}).enable("table").render(document)
    style = STYLE + HtmlFormatter().get_style_defs(".highlight")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(TITLE)}</title>\n'
            f"<style>{style}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")


# -- the command ---------------------------------------------------------------------------------

def write(out: Path, tests: Path) -> tuple[list[Path], list[str]]:
    """Write spec.md and spec.html into `out`; the paths and the coverage problems."""
    cov = coverage(tests)
    out.mkdir(parents=True, exist_ok=True)
    document = markdown(cov, os.path.relpath(SOURCE_ROOT, out.resolve()))
    written = [out / "spec.md", out / "spec.html"]
    write_text(written[0], document)
    write_text(written[1], render_html(document))
    return written, cov.problems()


def run(args) -> int:
    tests = Path(args.tests) if args.tests else default_tests_folder()
    if tests is None or not tests.is_dir():
        print(f"kvspec spec: no tests folder {'at ' + args.tests if args.tests else 'found'}: the coverage matrix "
              f"links clauses to the project's tests; run it in a kvspec checkout or pass --tests DIR",
              file=sys.stderr)
        return 2
    written, problems = write(Path(args.out), tests)
    for path in written:
        print(f"wrote {path}")
    for problem in problems:
        print(f"coverage problem: {problem}")
    print(f"{len(problems)} coverage problem(s)" if problems else "clause coverage complete: every clause has a "
          "check and a test, and every cited id is a clause")
    return 1 if problems else 0


def add_command(commands):
    parser = commands.add_parser("spec", help="render the spec with its clause coverage (HTML and Markdown)")
    parser.add_argument("--out", default="kvspec-spec", metavar="DIR", type=output_directory,
                        help="where to write spec.md and spec.html (default: kvspec-spec)")
    parser.add_argument("--tests", metavar="DIR", help="the project's tests folder (default: tests/ of the checkout)")
    parser.set_defaults(func=run)
    return parser
