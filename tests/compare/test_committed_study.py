"""A study committed with its raw runs (issue 18) continues and re-aggregates on a fresh clone.

tests/fixtures/tiny-study is such a study, made by `gtpo compare` with the tiny model (2 arms x 2 seeds, 2 steps,
held-out evaluation) and committed as a study under studies/ is: compare.json, each run's run.json, metrics.jsonl
and eval/, and summary.md / summary.json; no weights, no checkpoints, no logs, no figures.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from cli_helpers import run_gtpo

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-study"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_committed_study_holds_small_files_and_no_machine_paths():
    files = _files(FIXTURE)
    assert not any("/model/" in f or "checkpoint-" in f or f.endswith(".log") for f in files)
    for name in (
        "compare.json",
        "summary.md",
        "summary.json",
        "runs/gtpo/seed0/run.json",
        "runs/grpo/seed1/metrics.jsonl",
        "runs/grpo/seed1/eval/synthetic/results.json",
    ):
        assert name in files, name
    home, temp = str(Path.home()), tempfile.gettempdir()
    for name, data in files.items():
        text = data.decode("utf-8")
        assert str(ROOT) not in text and temp + "/" not in text and home + "/" not in text, name
    record = json.loads(files["runs/gtpo/seed0/run.json"])
    assert record["status"] == "finished" and len(record["code"]["git_commit"]) == 40


@pytest.mark.slow
def test_aggregate_only_regenerates_the_committed_summary(tmp_path):
    study = tmp_path / "study"
    shutil.copytree(FIXTURE, study)
    result = run_gtpo(["compare", "--output-dir", str(study), "--aggregate-only"], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((study / "summary.json").read_text()) == json.loads((FIXTURE / "summary.json").read_text())
    assert (study / "summary.md").read_text() == (FIXTURE / "summary.md").read_text()
    assert (study / "figures" / "training_curves.png").is_file() and (study / "figures" / "stability.png").is_file()


@pytest.mark.slow
def test_continuing_runs_and_evaluates_only_the_missing_run(tmp_path):
    study = tmp_path / "study"
    shutil.copytree(FIXTURE, study)
    shutil.rmtree(study / "runs" / "grpo" / "seed1")  # as if the study had stopped before its last run
    kept = {k: v for k, v in _files(study).items() if k.startswith("runs/")}
    dry = run_gtpo(["compare", "--output-dir", str(study), "--dry-run"], cwd=ROOT)
    assert dry.returncode == 0, dry.stderr[-2000:]
    commands = [line for line in dry.stdout.splitlines() if line.startswith("gtpo train")]
    assert len(commands) == 1 and "--seed 1" in commands[0] and "runs/grpo/seed1" in commands[0]
    result = run_gtpo(["compare", "--output-dir", str(study)], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    after = _files(study)
    assert {k: after[k] for k in kept} == kept, "committed finished runs must be left as they were"
    new = study / "runs" / "grpo" / "seed1"
    assert json.loads((new / "run.json").read_text())["status"] == "finished"
    assert (new / "eval" / "synthetic" / "results.json").is_file(), "the study's evaluation runs for the new run"
    assert json.loads((study / "summary.json").read_text())["finished_runs"] == 4
