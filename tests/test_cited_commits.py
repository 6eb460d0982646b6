"""Every commit the documents cite is in the history: the study document, docs/performance.md (whose log is now
docs/measurements/performance-history.md) and a measurement's commands.txt once cited 8b5f46a, a commit no clone
has (issue 38, item 8; it was f83c8e0). And every GPU figure the user's performance page quotes says at which
commit and on which date it was measured (issue 47, item 4: GPU figures that cannot be re-measured stay dated)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# An abbreviated hash: 7-12 hex digits with at least one letter and one digit (dates and words left out).
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b")
# A commit of another repository, written owner/name@hash (e.g. huggingface/trl@f2cd577, TRL's test file).
EXTERNAL = re.compile(r"\b[\w.-]+/[\w.-]+@[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
GPU = re.compile(r"\b(H100|H200|A100|L40S?|RTX \d+)\b")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_every_commit_cited_in_docs_exists():
    listed = _git("ls-files", "docs")
    if listed.returncode != 0 or _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("needs a full git checkout")
    cited = {}
    for name in listed.stdout.split():
        if name.endswith((".md", ".txt")):
            text = EXTERNAL.sub("", (ROOT / name).read_text())  # another repository's commit is not ours to find
            for found in HASH.findall(text):
                cited.setdefault(found, name)
    assert cited  # the documents do cite commits
    missing = {h: name for h, name in cited.items() if _git("cat-file", "-e", f"{h}^{{commit}}").returncode != 0}
    assert missing == {}


def test_another_repositorys_commit_is_told_apart_only_when_written_with_its_repository():
    """huggingface/trl@f2cd577 names TRL's commit (not looked up here); a bare hash is still one of ours."""
    assert HASH.findall(EXTERNAL.sub("", "TRL's file at huggingface/trl@f2cd577, ours at ca8ead9")) == ["ca8ead9"]
    assert HASH.findall(EXTERNAL.sub("", "commit f2cd577")) == ["f2cd577"]


def _units(markdown: str) -> list[str]:
    """The page's paragraphs, with each list item its own unit and each table one unit (its header names the
    commit and date of its columns)."""
    units = []
    for paragraph in re.split(r"\n\s*\n", markdown):
        if paragraph.lstrip().startswith("|"):
            units.append(paragraph)
        else:
            units.extend(item for item in re.split(r"\n(?=- )", paragraph) if item.strip())
    return units


def test_every_gpu_figure_on_the_performance_page_names_its_commit_and_date():
    page = (ROOT / "docs" / "performance.md").read_text()
    units = _units(page)
    gpu = [unit for unit in units if GPU.search(unit)]
    assert gpu  # the page does quote GPU figures
    undated = [unit[:100] for unit in gpu if not (HASH.search(unit) and DATE.search(unit))]
    assert undated == []
