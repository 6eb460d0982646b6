"""The studies committed under studies/ re-aggregate, on this checkout's code, to the tables committed beside them
(issue 18: "a fresh clone re-aggregates them to the same tables"). tests/compare/test_committed_study.py checks the
mechanism on a tiny fixture; this checks the real studies, whose summaries were written by the pinned code that ran
them (studies/NAME/code-commit), so a later change of the aggregation or of its reading fails here until the
committed summary is regenerated and the documents quoting it are checked again.

Only the files a clone has are copied (no checkpoints, weights or logs, which are never committed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_helpers import run_gtpo

ROOT = Path(__file__).resolve().parents[2]


def _committed_specs() -> list[Path]:
    """The studies whose compare.json git tracks (what a clone has: a study just started, its first run not yet
    committed, has an untracked compare.json and no committed summary to compare with); outside a git checkout, every
    compare.json."""
    found = sorted((ROOT / "studies").glob("*/compare.json"))
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "studies/*/compare.json"], cwd=ROOT, capture_output=True, check=False
    )
    if listed.returncode != 0:
        return found
    tracked = {ROOT / n for n in listed.stdout.decode().split("\0") if n}
    return [spec for spec in found if spec in tracked]


STUDIES = [spec.parent for spec in _committed_specs()]


def test_there_are_committed_studies():
    # Studies A and B, complete; later ones (C, D) join as their first run is committed.
    assert {"smollm2-synthetic-lr1e-3", "smollm2-synthetic-lr2e-4"} <= {p.name for p in STUDIES}


def _copy_committed_files(study: Path, copy: Path) -> None:
    """Copy the study's files git tracks (what a clone has), figures aside: a run still going beside the test, or
    finished but not yet committed by its hook, is not in the committed summary and must not be aggregated. Outside
    a git checkout (an unpacked archive), every file but checkpoints, weights, logs and figures."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", str(study.relative_to(ROOT))], cwd=ROOT, capture_output=True, check=False
    )
    names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else []
    if not names:
        shutil.copytree(study, copy, ignore=shutil.ignore_patterns("checkpoint-*", "model", "*.log", "figures"))
        return
    for name in names:
        relative = Path(name).relative_to(study.relative_to(ROOT))
        if relative.parts[0] == "figures":
            continue
        (copy / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / relative)


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_aggregate_only_reproduces_the_committed_summary(study, tmp_path):
    copy = tmp_path / study.name
    _copy_committed_files(study, copy)
    # The compare.json of study A names its recipe relative to the repository root, so aggregate from there.
    result = run_gtpo(["compare", "--output-dir", str(copy), "--aggregate-only"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((copy / "summary.json").read_text()) == json.loads((study / "summary.json").read_text())
    assert (copy / "summary.md").read_text() == (study / "summary.md").read_text()
