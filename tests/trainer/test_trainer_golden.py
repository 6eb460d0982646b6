"""Behaviour kept across refactors: a three-step GTPO run on the tiny model logs the numbers it logged before the
move into one package per layer (issue 19), recorded by tests/scripts/golden_run.py at commit round16~ (pre-move).

Tolerance 1e-4 relative: the same arithmetic on another CPU may round differently in its last bits (vector
widths), while any change of the loss, the weights λ, the γ term or the metrics moves these numbers by far more.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from golden_run import FIXTURE, golden_numbers  # noqa: E402

# Keys logged since the fixture was recorded, each with the value it must take on this run and why.
# gtpo/push_against_group: TABLE's groups hold each opening and the ending with as many positives as negatives of
# equal |A|, so every shared token has S = 0, never below 0: nothing is pushed up against the group.
ADDED_SINCE = {"gtpo/push_against_group": 0.0}


def test_three_step_run_logs_the_numbers_recorded_before_the_refactor(tmp_path, tiny_model_path):
    expected = json.loads(FIXTURE.read_text())
    got = golden_numbers(tiny_model_path, str(tmp_path / "out"))
    assert len(got["steps"]) == len(expected["steps"]) == 3
    for step, (row, want) in enumerate(zip(got["steps"], expected["steps"], strict=False), start=1):
        assert row.keys() == want.keys() | ADDED_SINCE.keys(), f"step {step}: logged keys changed"
        assert {key: row[key] for key in ADDED_SINCE} == ADDED_SINCE, f"step {step}"
        for key in want:
            assert row[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), f"step {step}: {key}"
    assert got["param_sum"] == pytest.approx(expected["param_sum"], rel=1e-5)
    assert got["param_sum_sq"] == pytest.approx(expected["param_sum_sq"], rel=1e-5)
