"""Every commit the documents cite is in the history: the study document, docs/performance.md and a measurement's
commands.txt once cited 8b5f46a, a commit no clone has (issue 38, item 8; it was f83c8e0)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# An abbreviated hash: 7-12 hex digits with at least one letter and one digit (dates and words left out).
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_every_commit_cited_in_docs_exists():
    listed = _git("ls-files", "docs")
    if listed.returncode != 0 or _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("needs a full git checkout")
    cited = {}
    for name in listed.stdout.split():
        if name.endswith((".md", ".txt")):
            for found in HASH.findall((ROOT / name).read_text()):
                cited.setdefault(found, name)
    assert cited  # the documents do cite commits
    missing = {h: name for h, name in cited.items() if _git("cat-file", "-e", f"{h}^{{commit}}").returncode != 0}
    assert missing == {}
