"""Every link in the docs resolves: relative markdown links and their #anchors in README.md, docs/**/*.md and
research/**/*.md, and the `docs/<file>.md, "Section"` pointers in code comments, docstrings and the
Makefiles.

Anchors follow GitHub's rule: a heading's text, lowercased, with punctuation dropped (letters, digits,
spaces, hyphens and underscores kept) and spaces turned into hyphens; a repeated heading gets -1, -2, ...
Headings and links inside code (fenced blocks, `spans`) do not count.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "research").rglob("*.md")),
]
HERE = Path(__file__).resolve()  # its own pointers are examples, some broken on purpose
CODE = [
    *(
        path
        for folder in ("shared", "services", "research", "tests", "tools")
        for path in sorted((ROOT / folder).rglob("*.py"))
    ),
    ROOT / "Makefile",
    ROOT / "research" / "research.mk",
]
CODE.remove(HERE)

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\n\s*\n)[^`])+?\1")  # within a paragraph
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# docs/<name>.md or docs/<name>.md#anchor, then optionally `, "Section title"` (a comment may wrap it)
CODE_POINTER = re.compile(r'docs/([\w./-]+\.md)(?:#([\w-]+))?(?:,\s+"([^"]+)")?')


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def prose(text: str) -> str:
    """The text with fenced code blocks and code spans blanked out."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    return broken


def broken_pointers(path: Path) -> list[str]:
    # Join wrapped comment lines, so a title split over two lines reads as one.
    text = re.sub(r"\s*\n\s*(?:#+|//)?\s*", " ", path.read_text())
    broken = []
    for name, anchor, title in CODE_POINTER.findall(text):
        doc = ROOT / "docs" / name
        if not doc.exists():
            broken.append(f"docs/{name}: no such file")
            continue
        if anchor and anchor not in anchors(doc):
            broken.append(f"docs/{name}#{anchor}: no such heading")
        # a title may be shortened ("The training budget" for "The training budget, chosen on dev")
        if title and not any(a.startswith(slug(title)) for a in anchors(doc)):
            broken.append(f'docs/{name}, "{title}": no such heading')
    return broken


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("RetroPrompt's parts under the default budget", "retroprompts-parts-under-the-default-budget"),
        ("The demonstrations on `gemma3-270m`, by the rule", "the-demonstrations-on-gemma3-270m-by-the-rule"),
        ("Where the step-0 loss comes from (dev only)", "where-the-step-0-loss-comes-from-dev-only"),
        ("Pairs: RTE and QNLI, seeds 13 and 21", "pairs-rte-and-qnli-seeds-13-and-21"),
        ("See [the log](experiments/README.md)", "see-the-log"),
    ],
)
def test_slugs_follow_githubs_rule(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_and_code_are_handled(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    fenced = "```\n# no heading\n[x](#in-a-block)\n```"
    page.write_text(f"# Notes\n\n## Notes\n\n{fenced}\n\n[a](#notes-1) `[b](#in-a-span)`\n[c](#missing)\n")
    assert anchors(page) == {"notes", "notes-1"}
    assert broken_links(page) == ["#missing: no heading with anchor #missing"]


def test_a_missing_file_and_a_wrapped_code_pointer_are_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[a](gone.md) [b](page.md#page) ![c](gone.png)\n\n# Page\n")
    assert broken_links(page) == ["gone.md: no such file", "gone.png: no such file"]
    code = tmp_path / "code.py"
    code.write_text(
        '# as chosen (docs/results.md, "Where the accuracy\n# targets stand"), not (docs/results.md, "No")\n'
    )
    assert broken_pointers(code) == ['docs/results.md, "No": no such heading']


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_in_the_docs_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_every_docs_pointer_in_the_code_resolves() -> None:
    broken = {str(path.relative_to(ROOT)): b for path in CODE if (b := broken_pointers(path))}
    assert broken == {}
