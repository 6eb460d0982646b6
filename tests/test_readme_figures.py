"""The figures of the offline default run are the committed raw data's (issue 20): every table and number
studies/tools/readme_figures.py computes from studies/smollm2-synthetic-lr2e-4's seed-0 runs (metrics.jsonl,
eval/synthetic/results.json) is in docs/offline-default-run.md (the README's page for the run) verbatim. A rerun
that changes the files, or an edit of the page's numbers, fails here instead of going stale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import load_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


FIGURES = load_script("readme_figures")


@pytest.mark.parametrize("block", FIGURES.blocks(), ids=["training", "initial_entropy", "held_out"])
def test_readme_holds_the_figure_computed_from_the_committed_runs(block):
    page = ROOT / "docs" / "offline-default-run.md"
    assert block in page.read_text(), f"{page.name} lacks:\n{block}"


def test_the_figures_are_the_metrics_files_own_numbers():
    """Independent of the script: the first and last 10 logged rewards of GTPO's seed 0, by hand."""
    lines = (ROOT / FIGURES.RUNS["GTPO"] / "metrics.jsonl").read_text().splitlines()
    rewards = [row["reward"] for row in map(json.loads, lines) if "reward" in row]
    assert len(rewards) == 40
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert f"{first:.2f} → {last:.2f}" in FIGURES.training_table()


def test_the_make_train_figures_are_its_committed_metrics():
    """The `make train` row's newest figures (docs/offline-default-run.md, README) are the committed run's own: the
    first and last 10 steps' means of reward, format and accuracy, and the collapse warning off at every step."""
    run = ROOT / "docs" / "measurements" / "make-train-20261127-avx512f"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "reward" in row]
    assert len(steps) == 40
    page = (ROOT / "docs" / "offline-default-run.md").read_text()
    for key, name in (("reward", "reward"), ("rewards/format_reward/mean", "format"),
                      ("rewards/accuracy_reward/mean", "accuracy")):  # fmt: skip
        values = [row[key] for row in steps]
        figure = f"{name} {sum(values[:10]) / 10:.2f} → {sum(values[-10:]) / 10:.2f}"
        assert figure in page, figure
    assert {row["monitor/collapse_warning"] for row in steps} == {0}
    record = json.loads((run / "run.json").read_text())
    assert record["code"]["git_commit"].startswith("5773f05") and record["args"]["GTPOConfig"]["bf16"] is False
