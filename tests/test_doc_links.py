"""Every link of the hand-written documents resolves: a relative link names a file or folder
of the repository, and a link to a heading (`#...`) names a heading of its page, as GitHub
makes its anchors. docs/spec.md is generated, and tests/test_spec_view.py checks its links."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted({ROOT / "README.md", ROOT / "vectors" / "INTERPRETING.md", *(ROOT / "docs").rglob("*.md")}
               - {ROOT / "docs" / "spec.md"})
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)
"""A fenced code block: neither its brackets nor its `#` lines are links or headings."""


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", FENCED.sub("", text))


def anchors(page: Path) -> set[str]:
    """The anchors of the page: those GitHub gives its headings (lower case, punctuation
    dropped, each space a hyphen, a repeated one numbered) and its own `<a id="...">`."""
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    found, seen = set(re.findall(r'<a id="([^"]+)"', text)), {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [target or image for target, image in LINK.findall(prose(page.read_text(encoding="utf-8")))]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_of_the_page_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no {path})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.relative_to(ROOT)})")
    assert not broken, broken


def test_the_pages_have_links():
    assert len(PAGES) > 10 and all(links(page) for page in (ROOT / "README.md", ROOT / "docs" / "checking.md"))
