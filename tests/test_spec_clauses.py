"""The chapters and the spec's definitions agree: every clause cites definitions that
exist and claim it, and every clause a definition claims has a heading."""

import pkgutil

import pytest

import kvspec.spec
from kvspec.spec import clauses
from kvspec.spec.clauses import Clause, citation_problems, claim_problems, claims_in, load_clauses

SPEC_MODULES = sorted(f"kvspec.spec.{module.name}" for module in pkgutil.iter_modules(kvspec.spec.__path__))

# Known gaps, each with its reason. The tests below require the gaps found to be exactly
# these, so closing one fails a test until its entry is removed here.
CLAUSES_WITHOUT_DEFINITION: dict[str, str] = {}
CLAIMS_WITHOUT_CHAPTER: dict[str, str] = {}


@pytest.fixture(scope="module")
def all_clauses() -> dict[str, Clause]:
    return load_clauses()


def test_chapters_are_found_and_parsed(all_clauses):
    chapters = {clause.chapter for clause in all_clauses.values()}
    assert {"01-model.md", "02-allocator.md", "03-mapping.md", "07-invariants.md"} <= chapters
    assert all(clause.title and clause.prose for clause in all_clauses.values())


def test_every_heading_id_is_unique():
    ids = [clause.id for clause in clauses.read_clauses()]
    assert sorted(ids) == sorted(set(ids)), f"duplicate clause headings: {sorted({i for i in ids if ids.count(i) > 1})}"


def test_every_clause_cites_existing_definitions_that_claim_it(all_clauses):
    problems = {(v.clause, v.message) for v in citation_problems(all_clauses)}
    assert problems == {(clause_id, "cites no definition") for clause_id in CLAUSES_WITHOUT_DEFINITION}


def test_every_claimed_clause_has_a_heading(all_clauses):
    problems = claim_problems(all_clauses, SPEC_MODULES)
    assert {v.clause for v in problems} == set(CLAIMS_WITHOUT_CHAPTER), "\n".join(map(str, problems))


def test_the_walk_sees_every_spec_module_and_constant():
    assert {"kvspec.spec.notation", "kvspec.spec.outcomes", "kvspec.spec.pages",
            "kvspec.spec.allocator", "kvspec.spec.accounting"} <= set(SPEC_MODULES)
    # Constants carry their clause in the string below them, which inspect alone misses.
    notation = clauses.documented_definitions("kvspec.spec.notation")
    assert claims_in(notation["kvspec.spec.notation.PADDING_PAGE"]) == {"MODEL-2"}


# -- the checks catch seeded bugs -------------------------------------------------------------


def seeded(clause_id: str, *definitions: str) -> dict[str, Clause]:
    return {clause_id: Clause(clause_id, "Seeded", "99-seeded.md", "A seeded clause.", definitions)}


def test_a_citation_of_a_missing_definition_is_reported():
    problems = citation_problems(seeded("PAGE-1", "kvspec.spec.pages.floor_page", "kvspec.spec.pages.no_such_function"))
    assert [str(v) for v in problems] == ["[PAGE-1] cites `kvspec.spec.pages.no_such_function`, which does not exist"]


def test_a_citation_of_a_definition_that_does_not_claim_the_clause_is_reported():
    problems = citation_problems(seeded("ALLOC-2", "kvspec.spec.pages.floor_page"))
    assert [v.clause for v in problems] == ["ALLOC-2"]
    assert "does not claim [ALLOC-2]" in problems[0].message


def test_a_claim_of_a_missing_clause_is_reported(all_clauses):
    without_page_1 = {clause_id: c for clause_id, c in all_clauses.items() if clause_id != "PAGE-1"}
    reported = {v.message for v in claim_problems(without_page_1, ["kvspec.spec.pages"]) if v.clause == "PAGE-1"}
    assert reported == {f"claimed by `kvspec.spec.pages.{name}`, but no chapter has a heading for it"
                        for name in ("floor_page", "ceil_page", "pages_for")}


def test_a_duplicate_heading_is_rejected(monkeypatch):
    real = clauses.read_clauses()
    duplicate = Clause("MAP-1", "Again", "99-seeded.md", "A seeded clause.", ())
    monkeypatch.setattr(clauses, "read_clauses", lambda: [*real, duplicate])
    with pytest.raises(ValueError, match="MAP-1 is a heading in both 03-mapping.md and 99-seeded.md"):
        clauses.load_clauses()


# -- the parser -------------------------------------------------------------------------------


@pytest.mark.parametrize("docstring, claimed", [
    ("[PAGE-1] The largest multiple", {"PAGE-1"}),
    ("[ALLOC-6, I6] Free a row segment", {"ALLOC-6", "I6"}),
    ("[I2 full pool, I3 SWA pool] Every page", {"I2", "I3"}),
    ("Accounting invariants [I1 .. I6].", set()),
    ("[ALLOC-1 .. ALLOC-6, MAP-1 .. MAP-3]", set()),
    ("frees `row[cursor : floor_page(x)]` and reads mapping[f]", set()),
    ("see (MAP-3) for why", set()),
    (None, set()),
])
def test_claims_in(docstring, claimed):
    assert claims_in(docstring) == claimed


def test_parse_chapter_reads_heading_prose_and_definitions():
    # DEMO is no family of the chapters; I7 is a real id, in the form an invariant's takes
    text = ("# 9. Seeded\n\nIntro.\n\n### DEMO-9 A title\n\nProse line.\n\n```\n# not a heading\n```\n\n"
            "#### Example\n\nMore.\n\nDefinitions: `a.b`, `c.d`\n\n## Group\n\n### I7 Other\n\nText.\n\nDefinitions: none yet.\n")
    first, second = clauses.parse_chapter("09-seeded.md", text)
    assert (first.id, first.title, first.chapter, first.definitions) == ("DEMO-9", "A title", "09-seeded.md", ("a.b", "c.d"))
    assert "# not a heading" in first.prose and "More." in first.prose and "Definitions" not in first.prose
    assert (second.id, second.definitions) == ("I7", ())


@pytest.mark.parametrize("text, error", [
    ("### DEMO-9 Title\n\nNo definitions line.\n", "needs exactly one line"),
    ("### Not a clause\n\nDefinitions: `a.b`\n", "is not `### CLAUSE-ID Title`"),
])
def test_parse_chapter_rejects_malformed_clauses(text, error):
    with pytest.raises(ValueError, match=error):
        clauses.parse_chapter("09-seeded.md", text)


def test_resolve():
    from kvspec.spec import notation, pages
    assert clauses.resolve("kvspec.spec.pages.floor_page") is pages.floor_page
    assert clauses.resolve("kvspec.spec.notation") is notation
    assert clauses.resolve("kvspec.spec.notation.NO_SWA_PEER") == 0
    assert clauses.resolve("kvspec.spec.pages.no_such_function") is None
    assert clauses.resolve("kvspec.spec.no_such_module.anything") is None
