"""The docs a user reads stay readable: benchmarks.md is results, not a notebook
(at most 800 lines), every line of settings.md fits a screen (at most 700
characters, so no table cell grows into an essay), no page names the history of
its findings (stops, issues, who found what: that is the git log's), and every
relative link of README.md and docs/*.md leads to a file that exists.

Cheap and deterministic: reads files only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]

PROVENANCE = re.compile(r"stop [0-9]|issue [0-9]|found by|independent attacker", re.I)
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose_lines(path: Path):
    """(line number, text) of the lines outside fenced code blocks, inline code removed."""
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, INLINE_CODE.sub("", line)


def test_benchmarks_page_is_at_most_800_lines():
    lines = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 800


def test_every_line_of_the_settings_reference_fits_a_screen():
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    long = [(n, len(line)) for n, line in enumerate(text.splitlines(), 1) if len(line) > 700]
    assert long == [], f"lines over 700 characters (line, length): {long}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_tells_the_history_of_its_findings(page):
    found = [
        (n, line.strip()[:80])
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if PROVENANCE.search(line)
    ]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(page):
    broken = []
    for number, line in _prose_lines(page):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                continue  # a URL (https:, mailto:) or an anchor on the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append((number, target))
    assert broken == [], f"links to nothing (line, target): {broken}"


def test_the_link_check_sees_links():
    """Guards the pattern itself: the README links to every page of docs/."""
    targets = {t for _, line in _prose_lines(ROOT / "README.md") for t in LINK.findall(line)}
    assert {f"docs/{p.name}" for p in DOCS} <= targets
