"""The docs show today's figures, not a run log (issue 27): each ``docs/*.md`` stays short
and no table is repeated for a second run. Older runs live in git history and in
``benchmarks/reference/``."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_DOC_LINES = 450  # the budget is about 400 lines per page; this is the hard ceiling
_RULE = re.compile(r"^\s*\|[\s:|-]+\|\s*$")


def doc_tables(text: str) -> list[tuple[int, str, str]]:
    """(line number, header row, first cell of the first body row) of every markdown table
    outside fenced blocks; whitespace in the header is normalised."""
    lines = text.splitlines()
    out, fenced, i = [], False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        if (not fenced and line.lstrip().startswith("|") and i + 2 < len(lines)
                and _RULE.match(lines[i + 1]) and lines[i + 2].lstrip().startswith("|")):
            first = lines[i + 2].strip().strip("|").split("|")[0].strip()
            out.append((i + 1, " ".join(line.split()), first))
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                i += 1
            continue
        i += 1
    return out


def repeated_tables(text: str) -> dict[tuple[str, str], list[int]]:
    """Tables whose header and first row label occur more than once: one table per run."""
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for line_no, header, first in doc_tables(text):
        seen[(header, first)].append(line_no)
    return {key: where for key, where in seen.items() if len(where) > 1}


def test_the_table_finder_sees_a_repeated_run_table() -> None:
    run = "| contender | items/s |\n|---|---|\n| depth | {} |\n"
    text = "## run 2\n\n" + run.format(5) + "\n## run 1\n\n" + run.format(4)
    assert list(repeated_tables(text).values()) == [[3, 9]]
    other = "| tree_lstm infer | items/s |\n|---|---|\n| depth | 4 |\n"
    assert repeated_tables(run.format(5) + "\n" + other) == {}
    assert doc_tables("```\n| a | b |\n|---|---|\n| c | d |\n```\n") == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_page_stays_short(path: Path) -> None:
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_DOC_LINES, (f"{path.name} has {n} lines (at most {MAX_DOC_LINES}): keep "
                                f"the current figures, drop superseded runs (git history "
                                f"keeps them) or split the page by topic")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_page_shows_each_table_once(path: Path) -> None:
    repeated = repeated_tables(path.read_text(encoding="utf-8"))
    assert not repeated, (f"{path.name}: the same table (header and first row) appears more "
                          f"than once, one per run? keep the latest run only: " + "; ".join(
                              f"{h[:60]!r} / {f[:30]!r} at lines {w}"
                              for (h, f), w in repeated.items()))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_doc_links_resolve() -> None:
    """A page that moves (a split, a renamed section) leaves no link behind: every relative
    link of README.md and docs/*.md names a file that exists and, for a page, a heading it has."""
    pages = [ROOT / "README.md", *DOCS]
    # prose only: code blocks hold Python (`experts[a](x)`), not links
    texts = {page: re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"),
                          flags=re.S | re.M) for page in pages}
    anchors = {page.resolve(): {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
               for page, text in texts.items()}
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", texts[page]):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page.resolve()
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors.get(dest, set()):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "broken links: " + "; ".join(broken)
