"""studies/tools/collapse_one_answer.py: a group's answers and what the loss did to the tokens writing its sum, from
hand-built records (no model); the held-out agreement from a hand-written samples file."""

from __future__ import annotations

import json

import pytest

from cli_helpers import load_script  # noqa: E402
from gtpo.runs import completions as records

PROMPT = [{"role": "user", "content": "What is 4 + 3?"}]


def _script():
    return load_script("collapse_one_answer")


def _tokens(result: str, answer: str) -> list[str]:
    """A synthetic completion in 10 tokens: the reasoning's result at position 6, the answer at position 8."""
    return ["<reasoning>\n", "4", " +", " 3", " =", " ", result, "\n</reasoning>\n<answer>\n", answer, "\n</answer>"]


def _write(run, step, rows, advantage, entropy, accuracy, spans, lam, gamma=0.1):
    """One recorded step; advantage_used = A − γ⟨H⟩_i (Eq. 7, the authors'-code form), no completion filtered."""
    tokens = [_tokens(r, a) for r, a in rows]
    columns = {
        "step": [step] * len(rows),
        "prompt": [PROMPT] * len(rows),
        "completion": [[{"role": "assistant", "content": "".join(t)}] for t in tokens],
        "accuracy_reward": accuracy,
        "advantage": advantage,
        "advantage_used": [a - gamma * h for a, h in zip(advantage, entropy, strict=True)],
        "mean_entropy": entropy,
        "entropy_filtered": [False] * len(rows),
        "completion_tokens": tokens,
        "completion_ids": [[hash(x) % 1000 for x in t] for t in tokens],
        "forward_span": [fw for fw, _ in spans],
        "backward_span": [bw for _, bw in spans],
        "lambda_positions": [list(range(10)) for _ in rows],
        "lambda_values": lam,
        "group": [0] * len(rows),
    }
    meta = dict.fromkeys(records.METADATA_FIELDS)
    meta.update(lambda_applied=True, group_size=len(rows))
    records.write_step(run, step, columns, meta)


def _eq5(fw: int, bw: int, weight: float) -> list[float]:
    """Eq. 5's λ over 10 tokens: ``weight`` inside the spans, 1 outside."""
    return [weight if t < fw or t >= 10 - bw else 1.0 for t in range(10)]


def test_parsers_read_the_answer_the_reasoning_the_gold_and_the_sum_tokens():
    script = _script()
    text = "<reasoning>\n9 + 50 = 14.\n</reasoning>\n<answer>\n14.\n</answer>"
    assert script.final_answer(text) == "14" and script.reasoning_result(text) == "14"
    assert script.final_answer("<reasoning>\n1 = 1\n</reasoning>") is None
    assert script.reasoning_result("<answer>\n3\n</answer>") is None
    assert script.gold_of([{"content": "x"}, {"content": "What is 9 + 50?"}]) == "59"
    assert script.gold_of([{"content": "What is 4 - 30?"}]) == "-26"
    assert script.gold_of([{"content": "Name a prime."}]) is None
    assert script.sum_token_positions(_tokens("7", "9")) == [6, 8]


def test_step_row_counts_the_protected_reasoning_and_the_lambda_on_the_sum(tmp_path):
    """Step 1, by hand. Row 0 (A +1) right: "= 7", answer 7; row 1 (A −0.5) the right sum but answer 9; row 2
    (A −0.5) "= 8", answer 8. Rows 0 and 1 share tokens 0-6 (fw 7, through the reasoning's '7'), row 2 shares 0-5
    (fw 6); all share the last token (bw 1). Eq. 5: row 0's span tokens λ 2, the others' λ 0. So: 1 correct,
    3 distinct answers, 2 answers copy their reasoning, 1 right-reasoning-wrong-answer row whose '7' is at λ 0
    (protected); of the 6 sum tokens 2 are in a span (row 0's '7' at λ 2, row 1's at λ 0); signal |1| + 2·|0.5| = 2,
    shift γ·Σ⟨H⟩ = 0.1·0.6 = 0.06; mean entropy 0.2."""
    _write(
        tmp_path, 1, [("7", "7"), ("7", "9"), ("8", "8")], [1.0, -0.5, -0.5], [0.1, 0.2, 0.3], [10.0, 0.0, 0.0],
        [(7, 1), (7, 1), (6, 1)], [_eq5(7, 1, 2.0), _eq5(7, 1, 0.0), _eq5(6, 1, 0.0)],
    )  # fmt: skip
    row = _script().step_row(records.read_step(tmp_path, 1))
    expected = {"step": 1, "completions": 3, "correct": 1, "distinct": 3, "modal": 1, "one_wrong_answer": False,
                "copies": 2, "right_reasoning_wrong_answer": 1, "protected_reasoning": 1, "filtered": 0,
                "sum_tokens": 6, "sum_in_span": 2, "sum_lambda_0": 1, "sum_lambda_2": 1}  # fmt: skip
    assert {k: row[k] for k in expected} == expected
    assert (row["signal"], row["shift"], row["entropy"]) == pytest.approx((2.0, 0.06, 0.2))


def test_a_group_of_one_wrong_answer_has_no_signal_and_only_the_shift(tmp_path):
    """Step 2: three completions "= 8", answer 8 (wrong), rewards equal, A = 0: one wrong answer, signal 0, and the
    shift γ⟨H⟩ = 0.1·0.05 per completion, 0.015 in all, no spans. Over steps 1-2 (summarize): 1 step without
    signal, the shift per completion there 0.005, |A| per completion at the step with signal 2 / 3."""
    _write(tmp_path, 1, [("7", "7"), ("7", "9"), ("8", "8")], [1.0, -0.5, -0.5], [0.1, 0.2, 0.3], [10.0, 0.0, 0.0],
           [(7, 1), (7, 1), (6, 1)], [_eq5(7, 1, 2.0), _eq5(7, 1, 0.0), _eq5(6, 1, 0.0)])  # fmt: skip
    _write(tmp_path, 2, [("8", "8")] * 3, [0.0] * 3, [0.05] * 3, [0.0] * 3, [(0, 0)] * 3, [[1.0] * 10] * 3)
    script = _script()
    rows = script.run_rows(tmp_path)
    assert rows[1]["one_wrong_answer"] and rows[1]["modal_answer"] == "8" and rows[1]["signal"] == 0
    assert rows[1]["shift"] == pytest.approx(0.015) and rows[1]["sum_in_span"] == 0
    summary = script.summarize(rows, first=1)
    assert summary["one_wrong_answer_steps"] == [2] and summary["steps_without_signal"] == 1
    assert summary["shift_per_completion_without_signal"] == pytest.approx(0.005)
    assert summary["advantage_per_completion_with_signal"] == pytest.approx(2 / 3)
    assert summary["shift_share"] == pytest.approx(0.075 / 2.075)
    with pytest.raises(ValueError, match="no recorded step from step 3 on"):
        script.summarize(rows, first=3)


def test_heldout_agreement_counts_the_problems_answered_with_one_wrong_answer(tmp_path):
    """Two problems, two samples each: problem a both "5" (wrong): one wrong answer, modal share 1, 1 distinct;
    problem b "7" (right) and "8." (wrong): modal share 0.5, 2 distinct. Accuracy 1 of 4."""
    samples = tmp_path / "samples.jsonl"
    rows = [("a", "5", False), ("a", "5", False), ("b", "7", True), ("b", "8.", False)]
    samples.write_text("".join(json.dumps({"problem_id": p, "answer": a, "correct": c}) + "\n" for p, a, c in rows))
    result = _script().heldout_agreement(samples)
    assert result == {"problems": 2, "accuracy %": 25.0, "one wrong answer problems": 1, "modal share": 0.75,
                      "distinct": 1.5}  # fmt: skip
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no samples"):
        _script().heldout_agreement(tmp_path / "empty.jsonl")
