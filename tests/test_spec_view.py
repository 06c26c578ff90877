"""The reviewer's view: clause coverage (every clause has a check and a test, every cited
id is a clause) and the rendered spec (`kvspec spec`), with seeded gaps that must be
reported."""

import subprocess
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvspec.conformance.review import clause_coverage, spec_view
from kvspec.conformance.review.clause_coverage import Citation, Coverage, coverage
from kvspec.spec import window
from kvspec.spec.clauses import Clause, load_clauses

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture(scope="module")
def project() -> Coverage:
    return coverage(TESTS)


def test_every_clause_has_a_check_and_a_test_and_every_cited_id_is_a_clause(project):
    assert project.problems() == []


def test_the_coverage_reads_every_kind_of_citation(project):
    kinds = {c.kind for c in project.citations}
    assert kinds == {"reference", "check", "test", "mutant", "divergence"}
    assert {c.name for c in project.of("I9", "check")} == {"engine decode_window_bound_violations",
                                                         "engine chunk_window_bound_violations",
                                                         "engine extend_window_bound_violations"}
    assert "mutant-no-chunk-release" in {c.name for c in project.of("I9", "mutant")}
    assert "sglang-mutant-no-chunk-release" in {c.name for c in project.of("I9", "mutant")}
    assert {c.name for c in project.of("ALLOC-4", "divergence")} == {"SGL-6"}
    # the harness's own checks: one that raises with the clause, one that claims it
    assert "reports" == next(c for c in project.of("LIFE-1", "check") if c.name == "EngineDriver.refused").how["LIFE-1"]
    assert "WIN-1" in next(c for c in project.citations if c.name == "validate").how


def test_a_check_enforces_the_clauses_whose_definitions_it_evaluates_never_another_invariant(project):
    window_bound = next(c for c in project.citations if c.name == "engine decode_window_bound_violations")
    assert window_bound.how["I9"] == "reports"
    assert window_bound.how["WIN-5"].startswith("evaluates `kvspec.spec.window.")
    leak = next(c for c in project.citations if c.name == "allocator allocator_full_conservation_violations")
    assert "I3" not in leak.how  # it evaluates conservation_violations, which I3 cites too


def test_every_sglang_mutant_is_read_without_importing_sglang(project):
    """The SGLang family's members load through its entry point whether SGLang is installed or not."""
    mutants = [c for c in project.citations if c.name.startswith("sglang-mutant-")]
    assert len(mutants) == 23 and all(c.where.startswith("adapters/sglang/mutants.py::") for c in mutants)


# -- seeded gaps --------------------------------------------------------------------------------


def seeded_clause(clause_id: str) -> dict[str, Clause]:
    return {**load_clauses(), clause_id: Clause(clause_id, "Seeded", "99-seeded.md", "A seeded clause.", ())}


def test_a_clause_without_a_check_or_a_test_is_a_problem(project):
    problems = Coverage(seeded_clause("DEMO-1"), project.citations).problems()
    assert problems == [f"DEMO-1 has no {kind}: write one that names DEMO-1 (conformance/review/clause_coverage.py says "
                        f"what counts)" for kind in ("check", "test")]


@pytest.mark.parametrize("kind", ["check", "test", "mutant", "divergence"])
def test_a_citation_of_an_unknown_clause_is_a_problem(project, kind):
    # ids of families the chapters do not use, so that this file does not cite them itself
    typo = Citation(kind, "seeded", "somewhere.py::seeded", {"ALOC-2": "reports", "DEMO-1": "reports"})
    problems = Coverage(project.clauses, (*project.citations, typo)).problems()
    assert problems == [f"{kind} seeded (somewhere.py::seeded) cites {clause_id}, which no chapter has a heading for"
                        for clause_id in ("ALOC-2", "DEMO-1")]


def write_tests(folder: Path, source: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "test_seeded.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return folder


def test_what_counts_as_a_test_of_a_clause(tmp_path):
    tests = write_tests(tmp_path / "tests", '''
        import pytest
        from kvspec.spec import window
        from kvspec.spec.pages import ceil_page

        CASES = ["MAP-1"]

        def test_docstring():
            """[ALLOC-2] Named in the docstring."""

        def test_comment():
            pass  # see LIFE-4

        @pytest.mark.parametrize("case", CASES)
        def test_constant(case):
            pass

        def test_calls():
            assert ceil_page(3, 4) == 4 and window.retention("sglang-0.5.23", 8, 4) == 8

        def test_other_families():
            """SGL-6 is a divergence, UTF-8 an encoding, UNKNOWN no clause of the chapters."""

        def helper_naming_WIN_3():
            """WIN-3, but not a test."""
        '''.replace("UNKNOWN", "I" + "99"))  # spelled apart, so that this file cites no such id itself
    found = {c.name: c.how for c in clause_coverage.test_citations(tests, load_clauses(), clause_coverage.spec_definitions())}
    assert found == {"test_docstring": {"ALLOC-2": "names it"}, "test_comment": {"LIFE-4": "names it"},
                     "test_constant": {"MAP-1": "names it"},
                     "test_calls": {"PAGE-1": "calls `kvspec.spec.pages.ceil_page`",
                                    "WIN-2": "calls `kvspec.spec.window.retention`"},
                     "test_other_families": {"I" + "99": "names it"}}


def test_evaluated_definitions_follow_spec_functions():
    evaluated = clause_coverage.evaluated_definitions(lambda: window.eviction_frontier(9, 0, 0, 4, 2, "x"),
                                                      clause_coverage.spec_definitions())
    # eviction_frontier itself, retention and floor_page through it, and their modules
    assert {"kvspec.spec.window.eviction_frontier", "kvspec.spec.window.retention", "kvspec.spec.pages.floor_page",
            "kvspec.spec.window", "kvspec.spec.pages"} <= evaluated
    assert "kvspec.spec.window.decode_window_bound" not in evaluated


# -- the command ---------------------------------------------------------------------------------


def kvspec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["kvspec", *args], capture_output=True, text=True, cwd=cwd)


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.targets, self.files = set(), [], []

    def handle_starttag(self, tag, attributes):
        attributes = dict(attributes)
        if "id" in attributes:
            self.ids.add(attributes["id"])
        href = attributes.get("href") or "" if tag == "a" else ""
        if href.startswith("#"):
            self.targets.append(href[1:])
        elif href:
            self.files.append(href)


def links_of(html: str) -> Links:
    links = Links()
    links.feed(html)
    return links


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("spec")
    result = kvspec("spec", "--out", str(out), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrote {out / 'spec.html'}" in result.stdout and "clause coverage complete" in result.stdout
    return out


def test_the_rendered_spec_has_every_clause_its_definitions_and_internal_links_that_resolve(rendered):
    page = (rendered / "spec.html").read_text(encoding="utf-8")
    links = links_of(page)
    assert set(load_clauses()) <= links.ids and "coverage" in links.ids
    assert links.targets and set(links.targets) <= links.ids, set(links.targets) - links.ids
    assert links.files and all((rendered / target).is_file() for target in links.files)  # the sources cited
    assert page.count("<details>") >= sum(len(c.definitions) for c in load_clauses().values())
    assert '<span class="nf">eviction_frontier</span>' in page  # highlighted source
    assert "<link" not in page and "<script" not in page  # self-contained


def test_the_markdown_document_is_the_html_one(rendered):
    document = (rendered / "spec.md").read_text(encoding="utf-8")
    assert spec_view.render_html(document) == (rendered / "spec.html").read_text(encoding="utf-8")
    assert "| [I9](#I9) | Window bound | 3: engine decode_window_bound_violations, engine " in document


def test_the_committed_rendering_is_current(project):
    """docs/spec.md is what the README links; regenerate it with `kvspec spec --out docs`
    (docs/spec.html, written beside it, is ignored by git)."""
    assert (ROOT / "docs" / "spec.md").read_text(encoding="utf-8") == spec_view.markdown(project, ".."), \
        "docs/spec.md is stale: run `kvspec spec --out docs`"


def test_incomplete_coverage_exits_1_after_writing_and_a_missing_tests_folder_exits_2(tmp_path):
    typo = f"ALLOC-{99}"  # spelled so that this file does not cite it itself
    tests = write_tests(tmp_path / "tests", f'''
        def test_typo():
            """[{typo}] No such clause."""
        ''')
    result = kvspec("spec", "--out", str(tmp_path / "out"), "--tests", str(tests), cwd=tmp_path)
    assert result.returncode == 1 and (tmp_path / "out" / "spec.html").is_file()
    assert "coverage problem: test test_typo (" in result.stdout and f"cites {typo}" in result.stdout
    assert "## Coverage problems" in (tmp_path / "out" / "spec.md").read_text(encoding="utf-8")
    result = kvspec("spec", "--tests", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert result.returncode == 2 and "no tests folder at" in result.stderr and "Traceback" not in result.stderr


def test_a_link_to_no_element_is_found():
    links = links_of('<h4 id="here">x</h4><a href="#here">ok</a><a href="#nowhere">typo</a><a href="b.html#x">out</a>')
    assert set(links.targets) - links.ids == {"nowhere"}
