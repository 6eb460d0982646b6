"""What studies C and D's summary.md showed before their last run, as the study document states it (issue 38, item
8: "no interim look" was not what the record shows): recomputed from every committed version of the summary."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from study_pages import page  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = " ".join((page("c") + page("d")).split())  # one space between words; the two studies' pages


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _versions(study: str, metric: str) -> list[tuple[int, str, str]]:
    """Per committed version of the summary, oldest first: (pairs, the difference cell, the reading)."""
    try:
        if _git("rev-parse", "--is-shallow-repository").strip() != "false":
            pytest.skip("needs the full history")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout")
    path = f"studies/{study}/summary.md"
    found = []
    for commit in _git("log", "--reverse", "--format=%H", "--", path).split():
        text = _git("show", f"{commit}:{path}")
        row = re.search(rf"^\| gtpo − grpo \| {re.escape(metric)} \| ([^|]+) \| (\d+) \| ([^|]+) \|$", text, re.M)
        found.append((int(row.group(2)), row.group(1).strip(), row.group(3).strip()) if row else (0, "", ""))
    return found


def test_study_d_showed_its_running_primary_estimate_after_every_run():
    versions = _versions("smollm2-synthetic-lr2e-4-d", "pass@1 %")
    assert len(versions) == 24 and "lr2e-4-d/summary.md`: 24 versions" in DOC
    assert versions[0] == (0, "", "") and versions[1][:2] == (1, "-23.62 (n=1)")
    before_last = {n: (cell, reading) for n, cell, reading in versions[:-1] if n >= 2}
    assert sorted(before_last) == list(range(2, 12))
    means = [float(cell.split()[0]) for cell, _ in before_last.values()]
    assert (max(means), min(means)) == (-6.72, -14.91) and "−6.72 to −14.91 over 2 to 11 pairs" in DOC
    assert {n for n, (_, reading) in before_last.items() if reading == "grpo higher"} == {8, 11}
    assert before_last[8][0] == "-14.91 [-28.46, -1.35]" and before_last[11][0] == "-12.77 [-25.08, -0.46]"
    assert "at 8 pairs (−14.91 [−28.46, −1.35]) and at 11 (−12.77 [−25.08, −0.46])" in DOC


def test_study_c_showed_paired_training_metrics_not_its_primary():
    versions = _versions("smollm2-synthetic-lr1e-3-c", "format %")
    assert len(versions) == 24 and "lr1e-3-c/summary.md`: 24 versions" in DOC
    assert versions[1][:2] == (1, "-85.75 (n=1)")
    assert {n for n, _, reading in versions if reading == "grpo higher"} == {9, 10, 11, 12}
    assert "clipped" not in (ROOT / "studies" / "smollm2-synthetic-lr1e-3-c" / "summary.md").read_text()
    assert "format % −85.75 at one pair; its interval excluded 0, GRPO higher, from 9 pairs on" in DOC
