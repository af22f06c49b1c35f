"""The docs hold together: links resolve, the configuration reference is current, the README stays a front door,
and dated run-by-run provenance stays in ``benchmarks/history.md``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from geomx.config import reference

ROOT = Path(__file__).parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.md")])
# where dated provenance (commit hashes, UTC times) belongs
HISTORY = {ROOT / "benchmarks" / "history.md", ROOT / "docs" / "changelog.md"}
# the README's one footnote naming the commits, date and machine of its headline results
FOOTNOTE = "[^measured]:"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[(?:[^\]\n]|\][^(\n])*?\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")  # letters and digits: a commit
# digits alone look like a commit only beside the word (0789658 is a commit; 1048576 is a slice size)
DIGIT_HASH = re.compile(r"\b(?:commits?|clones?(?: of)?|at)\s+[0-9]{7,40}\b", re.I)


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links inside them are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub does (``-1``, ``-2`` ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` whose file, or whose ``#anchor`` in a Markdown file, does not exist."""
    broken = []
    for target in LINK.findall(_prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target} (no file {resolved.relative_to(ROOT) if ROOT in resolved.parents else resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading with anchor #{anchor} in {resolved.relative_to(ROOT)})")
    return broken


def test_the_pages_exist():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/configuration.md", "benchmarks/history.md"} <= names


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_slugs_follow_github():
    assert slug("Section `frontend`: the PyTorch wrapper and P3") == "section-frontend-the-pytorch-wrapper-and-p3"
    assert slug("MixedSync + DCASGD") == "mixedsync--dcasgd"
    assert slug("Bi-Sparse's momentum correction") == "bi-sparses-momentum-correction"


def test_the_configuration_reference_is_current():
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text() == reference.markdown(), (
        f"docs/configuration.md is stale: regenerate it with `{reference.COMMAND}`")


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/ (at most 250)"


def test_dated_provenance_lives_in_the_history():
    found = []
    for path in PAGES:
        if path in HISTORY:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if path.name == "README.md" and path.parent == ROOT and line.startswith(FOOTNOTE):
                continue  # the one footnote naming the headline results' commits, date and machine
            if re.search(r"\bUTC\b", line) or HASH.search(line) or DIGIT_HASH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == [], "commit hashes and UTC times belong in benchmarks/history.md:\n" + "\n".join(found)


def test_the_readme_has_exactly_one_footnote_of_provenance():
    text = (ROOT / "README.md").read_text()
    assert text.count(FOOTNOTE) == 1
