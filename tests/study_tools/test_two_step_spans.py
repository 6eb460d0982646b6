"""studies/tools/two_step_spans.py: the share of negative completions whose forward conflict span holds a correct first
step (study G's registered secondary outcome, issue 48), counted on a hand-made completion record whose answer is
known token by token."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("two_step_spans", ROOT / "studies" / "tools" / "two_step_spans.py")
spans = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spans)

PROMPT = [
    {"role": "system", "content": "system"},
    {"role": "user", "content": "What is 4 + 3 - 2?"},  # a worked example: never the question read
    {"role": "assistant", "content": "<reasoning>\n4 + 3 = 7. 7 - 2 = 5.\n</reasoning>"},
    {"role": "user", "content": "What is 9 + 8 - 3?"},
]
RIGHT = ["<", "reason", "ing", ">", "\n", "9", " +", " ", "8", " =", " ", "1", "7", ".", " ", "1", "7", " -", " 3"]
WRONG = ["<", "reason", "ing", ">", "\n", "9", " +", " ", "8", " =", " ", "1", "8", "."]


def _record(tmp_path: Path) -> Path:
    # (tokens, forward span, advantage): which negatives have the step, and which spans reach past "17"'s "7"
    rows = [
        (RIGHT, 13, -1.0),  # negative, span "<reasoning>\n9 + 8 = 17": holds the step
        (RIGHT, 12, -0.5),  # negative, span stops inside "17": the step, but not in the span
        (WRONG, 14, -1.0),  # negative, first step wrong
        (RIGHT, 13, 1.5),  # positive: never counted
        (WRONG, 0, 0.0),  # zero advantage: not negative
    ]
    run = tmp_path / "run"
    (run / "completions").mkdir(parents=True)
    frame = pd.DataFrame(
        {
            "prompt": [PROMPT] * len(rows),
            "completion_tokens": [tokens for tokens, _, _ in rows],
            "forward_span": [span for _, span, _ in rows],
            "advantage": [advantage for _, _, advantage in rows],
        }
    )
    frame.iloc[:3].to_parquet(run / "completions" / "completions_00001.parquet")
    frame.iloc[3:].to_parquet(run / "completions" / "completions_00002.parquet")
    return run


def test_counts_negatives_whose_span_holds_the_whole_correct_first_step(tmp_path):
    counts = spans.run_counts(_record(tmp_path))
    assert counts["completions"] == 5 and counts["negative"] == 3
    assert counts["negative, correct first step"] == 2
    assert counts["negative, span holds the correct first step"] == 1
    assert counts["share of negatives, %"] == 100 / 3
    assert counts["share of negatives with a correct first step, %"] == 50.0


def test_a_run_without_a_record_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no completion record"):
        spans.main([str(tmp_path)])
