"""The studies committed under studies/ re-aggregate, on this checkout's code, to the tables committed beside them
(issue 18: "a fresh clone re-aggregates them to the same tables"). tests/compare/test_committed_study.py checks the
mechanism on a tiny fixture; this checks the real studies, whose summaries were written by the pinned code that ran
them (studies/NAME/code-commit), so a later change of the aggregation or of its reading fails here until the
committed summary is regenerated and the documents quoting it are checked again.

Only the files a clone has are copied (no checkpoints, weights or logs, which are never committed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_helpers import run_gtpo

ROOT = Path(__file__).resolve().parents[2]
STUDIES = sorted(p.parent for p in (ROOT / "studies").glob("*/compare.json"))


def test_there_are_committed_studies():
    # Studies A and B, complete; later ones (C, D) join as their first run is committed.
    assert {"smollm2-synthetic-lr1e-3", "smollm2-synthetic-lr2e-4"} <= {p.name for p in STUDIES}


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_aggregate_only_reproduces_the_committed_summary(study, tmp_path):
    copy = tmp_path / study.name
    shutil.copytree(study, copy, ignore=shutil.ignore_patterns("checkpoint-*", "model", "*.log", "figures"))
    # The compare.json of study A names its recipe relative to the repository root, so aggregate from there.
    result = run_gtpo(["compare", "--output-dir", str(copy), "--aggregate-only"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((copy / "summary.json").read_text()) == json.loads((study / "summary.json").read_text())
    assert (copy / "summary.md").read_text() == (study / "summary.md").read_text()
