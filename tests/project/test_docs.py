"""Every relative link in README.md, docs/*.md and recipes/*.md resolves: the file (or folder) exists, and a
`#anchor` into a markdown file names one of its headings (GitHub's anchor rule). Links inside code blocks are
not links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "recipes").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def outside_fences(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", outside_fences(text))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped (a code span's text kept), spaces to hyphens."""
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", outside_fences(page.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I)]  # http:, https:, mailto: ...


def broken(page: Path) -> list[str]:
    bad = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            bad.append(f"{target} (no {resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved})")
        elif anchor and resolved.suffix == ".md" and anchor.lower() not in anchors(resolved):
            bad.append(f"{target} (no heading #{anchor} in {resolved.name})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert broken(page) == [], f"broken links in {page.relative_to(REPO)}"


def test_the_checker_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text("[ok](there.md) [ok](there.md#a-heading) [web](https://example.org/x) "
                    "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
                    "[gone](missing.md) [bad anchor](there.md#nope)\n")
    assert [b.split(" ")[0] for b in broken(page)] == ["missing.md", "there.md#nope"]


def test_the_docs_index_links_every_page():
    index = REPO / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p != index and p.resolve() not in linked]
    assert missing == [], f"docs/README.md does not link {missing}"
    assert "docs/README.md" in links(REPO / "README.md")


# ------------------------------------------------------------------ references from code
CODE = [p for d in ("prime_values", "bench", "tests", "recipes") for p in sorted((REPO / d).rglob("*.py"))
        if p != Path(__file__).resolve()]  # this file holds the checker's bad examples
DOC_REF = re.compile(r"\b((?:docs|recipes)/[\w./-]+?\.md)(?:\s*§\s*(\d+(?:\.\d+)?))?")


def sections(page: Path) -> set[str]:
    """The numbered sections of a page: '## 2. Title' -> '2', '### 2.1 Title' -> '2.1'."""
    return set(re.findall(r"^#{2,6}\s+(\d+(?:\.\d+)?)\.?\s", prose(page.read_text()), flags=re.M))


def code_references(path: Path) -> list[str]:
    """The doc references in a .py file that do not resolve: a missing page, a § section the page lacks, or a
    citation of a design file outside the repository."""
    bad = []
    text = path.read_text(errors="replace")
    if re.search(r"(?<![\w/])DESIGN(?:\.md)?\s*§", text):
        bad.append("DESIGN.md (not in the repository: cite docs/design.md)")
    for page, section in DOC_REF.findall(text):
        target = REPO / page
        if not target.is_file():
            bad.append(page)
        elif section and section not in sections(target):
            bad.append(f"{page} §{section}")
    return bad


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(REPO)))
def test_references_from_code_resolve(path):
    assert code_references(path) == [], f"unresolved doc references in {path.relative_to(REPO)}"


def test_the_code_reference_checker_catches_a_bad_one(tmp_path):
    code = tmp_path / "x.py"
    code.write_text('"""See docs/design.md §2 and docs/design.md §9, docs/nowhere.md, DESIGN.md §3."""\n')
    assert code_references(code) == ["DESIGN.md (not in the repository: cite docs/design.md)", "docs/design.md §9",
                                     "docs/nowhere.md"]
    assert {"1", "2", "2.1", "3", "3.1"} <= sections(REPO / "docs" / "design.md")


def test_anchors_are_githubs(tmp_path):
    """A heading's code span keeps its text in the anchor, as on GitHub; a heading inside a fence is none."""
    page = tmp_path / "page.md"
    page.write_text("# Top\n### Several nodes: `launcher.nodes`\n```\n# not a heading\n```\n## What it costs (s)\n")
    assert anchors(page) == {"top", "several-nodes-launchernodes", "what-it-costs-s"}
