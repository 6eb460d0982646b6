"""The study document: docs/study-gtpo-vs-grpo.md, the index with the studies' table, and one page per study (and
per exploratory section) under docs/studies/, which the tests that check the studies' figures read."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "study-gtpo-vs-grpo.md"
PAGES = ROOT / "docs" / "studies"
# the pages in the order the one document held them
ORDER = (
    "method",
    "a",
    "b",
    "c",
    "d",
    "e",
    "mechanism",
    "stall-guard",
    "f",
    "two-step-pilot",
    "g",
    "lockin",
    "h",
    "partial-study",
)


def page(name: str) -> str:
    """docs/studies/<name>.md."""
    return (PAGES / f"{name}.md").read_text()


def all_text() -> str:
    """The index and every page, in the order the one document held them."""
    return "\n".join([INDEX.read_text(), *(page(name) for name in ORDER)])


def table_row(text: str, study: str) -> str:
    """The studies' table row of ``study`` ("A" to "G", "pilot") in ``text`` (the README or the index)."""
    rows = [line for line in text.splitlines() if line.startswith(f"| [{study}](")]
    assert len(rows) == 1, (study, rows)
    return rows[0]
