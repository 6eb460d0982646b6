"""Study A's answer, as README.md and docs/study-gtpo-vs-grpo.md quote it, is the committed summary's (issue 18):
every per-arm interval and paired difference the two documents state is recomputed here from
studies/smollm2-synthetic-lr2e-4/summary.json, and the summary itself is checked against the committed
held-out results it aggregates. An edit of the numbers, or a rerun that changes the files, fails here instead
of going stale."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "smollm2-synthetic-lr2e-4"
SUMMARY = json.loads((STUDY / "summary.json").read_text())
PAIRS = {pair["metric"]: pair["diff"] for pair in SUMMARY["pairs"] if (pair["a"], pair["b"]) == ("gtpo", "grpo")}


def _num(x: float, digits: int, sign: bool = False) -> str:
    """The documents' number style: a real minus sign, '+' on differences; a nonzero value that rounds to 0
    keeps one significant digit (−0.002, not −0.00)."""
    text = f"{x:{'+' if sign else ''}.{digits}f}"
    if float(text) == 0 and x != 0:
        text = f"{x:{'+' if sign else ''}.{digits + 1}f}"
    return text.replace("-", "−")


def _interval(d: dict, digits: int, sign: bool = False) -> str:
    return f"{_num(d['mean'], digits, sign)} [{_num(d['low'], digits)}, {_num(d['high'], digits)}]"


def _flat(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text())


def test_study_a_is_complete_with_five_paired_seeds():
    """gtpo and grpo have all five seeds; the gtpo-filter arm, added after them, is counted in the totals."""
    arms = [arm["name"] for arm in json.loads((STUDY / "compare.json").read_text())["arms"]]
    assert arms[:2] == ["gtpo", "grpo"] and SUMMARY["total_runs"] == 5 * len(arms)
    finished = sum(len(SUMMARY["arms"][arm]["aggregated_seeds"]) for arm in arms if arm in SUMMARY["arms"])
    assert SUMMARY["finished_runs"] == finished >= 10
    for arm in ("gtpo", "grpo"):
        assert SUMMARY["arms"][arm]["aggregated_seeds"] == [0, 1, 2, 3, 4]
    assert all(d["n"] == 5 for d in PAIRS.values())


def test_summary_pass_at_1_is_the_mean_of_the_committed_results():
    """Independent of the aggregation code: the mean and the paired difference of pass@1 from the five
    results.json files of each arm, by hand."""
    per_arm = {
        arm: [
            100 * json.loads((STUDY / f"runs/{arm}/seed{s}/eval/synthetic/results.json").read_text())["pass@k"]["1"]
            for s in range(5)
        ]
        for arm in ("gtpo", "grpo")
    }
    for arm, values in per_arm.items():
        assert SUMMARY["arms"][arm]["metrics"]["pass@1 %"]["mean"] == pytest.approx(statistics.mean(values))
    diffs = [a - b for a, b in zip(per_arm["gtpo"], per_arm["grpo"], strict=True)]
    half = 2.776445105 * statistics.stdev(diffs) / 5**0.5  # t_{0.975, 4}
    assert PAIRS["pass@1 %"]["mean"] == pytest.approx(statistics.mean(diffs))
    # the summary's t table has 3 decimals (2.776): agreement to 1e-3 relative
    assert PAIRS["pass@1 %"]["high"] - PAIRS["pass@1 %"]["mean"] == pytest.approx(half, rel=1e-3)


def test_readme_states_the_summary_answer():
    readme = _flat(ROOT / "README.md")
    arms = {arm: SUMMARY["arms"][arm]["metrics"]["pass@1 %"] for arm in ("gtpo", "grpo")}
    gtpo, grpo = (
        f"{_num(d['mean'], 1)} % [{_num(d['low'], 1)}, {_num(d['high'], 1)}]" for d in (arms["gtpo"], arms["grpo"])
    )
    assert f"pass@1 GTPO {gtpo}, GRPO {grpo}" in readme
    diff = PAIRS["pass@1 %"]
    assert (
        f"paired difference {_num(diff['mean'], 1, True)} points [{_num(diff['low'], 1)}, {_num(diff['high'], 1)}]"
        in readme
    )
    assert f"maj@8 {_interval(PAIRS['maj@8 %'], 1, sign=True)}" in readme
    entropy = PAIRS["entropy"]
    assert f"({_num(entropy['mean'], 2)} nats [{_num(entropy['low'], 2)}, {_num(entropy['high'], 2)}])" in readme
    assert "No detectable difference" in readme


@pytest.mark.parametrize("metric", sorted(set(PAIRS) - {"maj@1 %"}))
def test_study_document_states_each_paired_difference(metric):
    doc = (ROOT / "docs" / "study-gtpo-vs-grpo.md").read_text()
    row = next((line for line in doc.splitlines() if line.startswith(f"| {metric.split(' ')[0]} ")), None)
    assert row is not None, f"docs/study-gtpo-vs-grpo.md has no paired-difference row for {metric}"
    assert _interval(PAIRS[metric], 2, sign=True) in row


@pytest.mark.parametrize("arm", ["gtpo", "grpo"])
def test_study_document_states_each_arm_mean(arm):
    doc = (ROOT / "docs" / "study-gtpo-vs-grpo.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith(f"| {arm} | 13."))
    metrics = SUMMARY["arms"][arm]["metrics"]
    for metric in ("reward", "format %", "accuracy %", "entropy", "pass@1 %", "pass@8 %", "maj@8 %"):
        assert f"| {_interval(metrics[metric], 2)} |" in row, metric
