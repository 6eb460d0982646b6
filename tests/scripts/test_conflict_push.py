"""scripts/conflict_push.py: the net push on the shared opening, from a hand-built record (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_helpers import load_script  # noqa: E402
from gtpo.runs import completions as records

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script("conflict_push")


def test_push_is_the_lambda_weighted_advantage_on_the_forward_spans(tmp_path, capsys):
    """Two completions share the 2-token opening 'a b': the positive (A' = +1) gets λ = 2 there, the negative
    (A' = -1) λ = 0. By hand: push = 2·2·(+1) + 0·2·(-1) = 4; plain (λ = 1) = 2·(+1) + 2·(-1) = 0."""
    columns = {
        "reward": [1.0, 0.0],
        "advantage": [1.0, -1.0],
        "advantage_used": [1.0, -1.0],
        "completion_tokens": [["a", " b", " c", "<eos>"], ["a", " b", " d", "<eos>"]],
        "forward_span": [2, 2],
        "backward_span": [1, 1],
        "lambda_positions": [[0, 1, 3], [0, 1, 3]],
        "lambda_values": [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]],
        "group": [0, 0],
    }
    meta = dict.fromkeys(records.METADATA_FIELDS)
    meta.update(lambda_applied=True, group_size=2)
    records.write_step(tmp_path, 1, columns, meta)
    summary = _script().step_summary(records.read_step(tmp_path, 1))
    assert summary["push"] == pytest.approx(4.0) and summary["plain"] == pytest.approx(0.0)
    assert summary["forward"] == "a b" and summary["backward"] == "<eos>"
    _script().main([str(tmp_path)])
    assert "push   +4.00 plain   +0.00  fw 'a b'  bw '<eos>'" in capsys.readouterr().out
