"""studies/tools/conflict_push.py: the net push on the shared opening, from a hand-built record (no model)."""

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
        "completion_ids": [[1, 2, 3, 9], [1, 2, 4, 9]],
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
    assert summary["guard"] == pytest.approx(0.0)  # S = +1 - 1 = 0 on 'a b': not contested, λ = 1, as plain
    assert summary["forward"] == "a b" and summary["backward"] == "<eos>"
    _script().main([str(tmp_path)])
    assert "push   +4.00 plain   +0.00 guard   +0.00  fw 'a b'  bw '<eos>'" in capsys.readouterr().out


def test_guard_push_is_zero_on_an_opening_the_group_pushes_down(tmp_path):
    """Rows 0 (A = +1), 1 and 2 (A = -1) share 'a b'; row 3 (A = +1) opens 'x y'. By hand: S on 'a b' = 1 - 2 < 0, so
    the guard sets λ 0 there for all three: guard = 0; plain = 2·(1 - 1 - 1) = -2; Eq. 5: 2·2·(+1) = 4."""
    columns = {
        "reward": [1.0, 0.0, 0.0, 1.0],
        "advantage": [1.0, -1.0, -1.0, 1.0],
        "advantage_used": [1.0, -1.0, -1.0, 1.0],
        "completion_tokens": [["a", " b", " c"], ["a", " b", " d"], ["a", " b", " e"], ["x", " y", " z"]],
        "completion_ids": [[1, 2, 3], [1, 2, 4], [1, 2, 5], [6, 7, 8]],
        "forward_span": [2, 2, 2, 0],
        "backward_span": [0, 0, 0, 0],
        "lambda_positions": [[0, 1], [0, 1], [0, 1], []],
        "lambda_values": [[2.0, 2.0], [0.0, 0.0], [0.0, 0.0], []],
        "group": [0, 0, 0, 0],
    }
    meta = dict.fromkeys(records.METADATA_FIELDS)
    meta.update(lambda_applied=True, group_size=4)
    records.write_step(tmp_path, 1, columns, meta)
    summary = _script().step_summary(records.read_step(tmp_path, 1))
    assert summary["push"] == pytest.approx(4.0) and summary["plain"] == pytest.approx(-2.0)
    assert summary["guard"] == pytest.approx(0.0)


def test_table_row_sums_the_steps_before_the_group_went_flat_and_reads_the_stall_from_the_record(tmp_path):
    """Step 1: the first test's group (push 4, plain 0, guard 0), partial format credit only (1 and 0); step 2: both
    rewards equal (flat). By hand: stalled (no completion scored the full format, 10), first flat step 2, sums =
    step 1's."""
    base = {
        "advantage": [1.0, -1.0], "advantage_used": [1.0, -1.0],
        "completion_tokens": [["a", " b", " c", "<eos>"], ["a", " b", " d", "<eos>"]],
        "completion_ids": [[1, 2, 3, 9], [1, 2, 4, 9]], "forward_span": [2, 2], "backward_span": [1, 1],
        "lambda_positions": [[0, 1, 3], [0, 1, 3]], "lambda_values": [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]],
        "group": [0, 0],
    }  # fmt: skip
    meta = dict.fromkeys(records.METADATA_FIELDS)
    meta.update(lambda_applied=True, group_size=2)
    records.write_step(tmp_path, 1, {**base, "reward": [1.0, 0.0], "format_reward": [1.0, 0.0]}, meta)
    records.write_step(tmp_path, 2, {**base, "reward": [1.0, 1.0], "format_reward": [1.0, 1.0]}, meta)
    row = _script().run_row(tmp_path)
    assert row["stalled"] and row["first_full_format"] is None and row["first_flat_step"] == 2
    assert (row["push"], row["plain"], row["guard"]) == (pytest.approx(4.0), pytest.approx(0.0), pytest.approx(0.0))
    assert row["opening"] == "a b" and row["steps"] == 2
    assert "| yes | — | `a b` | 2 | +4.0 | +0.0 | +0.0 |" in _script().table([str(tmp_path)])[2]
    records.write_step(tmp_path, 3, {**base, "reward": [10.0, 0.0], "format_reward": [10.0, 0.0]}, meta)
    assert _script().run_row(tmp_path)["first_full_format"] == 3
