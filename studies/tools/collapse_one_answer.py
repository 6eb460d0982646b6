"""The failure seen as "a collapse onto one wrong answer" (format 100 %, the eight completions one wrong sum), read from
the completion records step by step, against the GRPO run at the same seed (exploratory; issue 48, item 2).

Per recorded step of a run (one group of 8 in the studies) it reads each completion's final answer (inside
``<answer>``), whether it was graded correct, and whether it copies the result the completion's own reasoning wrote
(the number after the last ``=`` inside ``<reasoning>``); and what the loss did to the group:

- ``signal``: Σ_i |A_i|, the group-normalised advantages before Eq. 7's shift (0 when the eight rewards are equal);
- ``shift``: Σ_i |A'_i − A_i| = Σ_i γ⟨H⟩_i over the completions the loss kept (Eq. 7 in the authors'-code form,
  A' = A − γ⟨H⟩_i, from the record's ``advantage_used``); GRPO's runs have none;
- ``filtered``: the completions the δ filter (Eq. 6) dropped;
- on the tokens that write the sum (the reasoning's result after its last ``=`` and the final answer): how many
  were inside a conflict span, and how many of them the loss weighted λ = 0 (a negative's under Eq. 5, any
  sharer's under the guard), λ = 2 (a positive's under Eq. 5), from the record's λ (a GRPO run's record holds the
  λ the correction would have given; its loss applied none).

    .venv/bin/python studies/tools/collapse_one_answer.py studies/smollm2-synthetic-lr2e-4-f/runs/gtpo-guard/seed319
    .venv/bin/python studies/tools/collapse_one_answer.py --table \\
        studies/smollm2-synthetic-lr2e-4-f/runs/*/seed31[89] studies/smollm2-synthetic-lr2e-4-d-rerun/runs/gtpo/seed110

The held-out side (``heldout_agreement``) reads a run's ``eval/synthetic/samples.jsonl`` (8 samples per problem):
the problems whose 8 samples were one and the same wrong answer, and the mean share of the most common answer.
Reads the records only (no model).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gtpo.runs import completions as records  # noqa: E402

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)
REASONING = re.compile(r"<reasoning>(.*?)</reasoning>", re.S)
RESULT = re.compile(r"=\s*(-?\d[\d.]*)")
QUESTION = re.compile(r"What is (\d+) ([-+]) (\d+)\?")
LATE_FROM = 21  # the second half of a 40-step run, where the failures show in the training metrics


def final_answer(text: str) -> str | None:
    """The text between ``<answer>`` and ``</answer>``, stripped of whitespace and a trailing full stop (the grader
    reads "14." as 14); None without the tags."""
    match = ANSWER.search(text)
    return match[1].strip().rstrip(".").strip() if match else None


def reasoning_result(text: str) -> str | None:
    """The number after the last ``=`` inside ``<reasoning>`` (the sum the reasoning wrote), without a trailing full
    stop; None if there is none."""
    match = REASONING.search(text)
    numbers = RESULT.findall(match[1]) if match else []
    return numbers[-1].rstrip(".") if numbers else None


def gold_of(prompt: list[dict]) -> str | None:
    """The synthetic task's answer to the prompt's last question ("What is a + b?" or "a - b"), as text; None for
    another task's prompt."""
    questions = QUESTION.findall(prompt[-1]["content"])
    if not questions:
        return None
    a, op, b = questions[-1]
    return str(int(a) + int(b) if op == "+" else int(a) - int(b))


def _result_positions(tokens: list[str]) -> list[int]:
    """The positions of the tokens writing the reasoning's result (the number after its last ``=``)."""
    text = "".join(tokens)
    reasoning = REASONING.search(text)
    results = list(RESULT.finditer(reasoning[1])) if reasoning else []
    if not results:
        return []
    start, end = (reasoning.start(1) + x for x in results[-1].span(1))
    positions, offset = [], 0
    for position, token in enumerate(tokens):
        if offset < end and offset + len(token) > start:
            positions.append(position)
        offset += len(token)
    return positions


def _character_spans(text: str) -> list[tuple[int, int]]:
    """The character spans of the sum a completion states: the final answer (between ``<answer>`` and
    ``</answer>``, whitespace excluded) and the number after the last ``=`` of its reasoning."""
    spans = []
    answer = ANSWER.search(text)
    if answer and answer[1]:
        spans.append(answer.span(1))
    reasoning = REASONING.search(text)
    if reasoning:
        results = list(RESULT.finditer(reasoning[1]))
        if results:
            start, end = results[-1].span(1)
            spans.append((reasoning.start(1) + start, reasoning.start(1) + end))
    return spans


def sum_token_positions(tokens: list[str]) -> list[int]:
    """The positions of the tokens that write the sum: those overlapping the final answer's characters or the
    reasoning's result's (``_character_spans``), from the decoded tokens' concatenation.

    Args:
        tokens: the completion's decoded tokens, in order (the record's ``completion_tokens``).
    Returns:
        Token positions, ascending; empty where the completion states no sum."""
    spans = _character_spans("".join(tokens))
    positions, offset = [], 0
    for position, token in enumerate(tokens):
        if any(offset < end and offset + len(token) > start for start, end in spans):
            positions.append(position)
        offset += len(token)
    return positions


def step_row(step_record: dict) -> dict:
    """One recorded step: the group's answers and what the loss did to them (module docstring).

    Returns:
        {"step", "completions", "correct" (of the group), "distinct" answers, "modal" (count of the most common answer),
        "modal_answer", "one_wrong_answer" (every completion the same wrong answer), "copies" (answers equal to the
        reasoning's result), "signal", "shift", "filtered", "entropy" (mean ⟨H⟩_i), "sum_tokens", "sum_in_span",
        "sum_lambda_0", "sum_lambda_2"}."""
    c = step_record["columns"]
    texts = [completion[0]["content"] for completion in c["completion"]]
    answers = [final_answer(text) for text in texts]
    correct = [(reward or 0.0) > 0 for reward in c["accuracy_reward"]]
    modal_answer, modal = Counter(answers).most_common(1)[0]
    gold = gold_of(c["prompt"][0])
    right_reasoning = [gold is not None and reasoning_result(text) == gold for text in texts]
    row = {
        "step": int(c["step"][0]),
        "completions": len(texts),
        "lambda_applied": bool(step_record["metadata"].get("lambda_applied")),
        "correct": sum(correct),
        "distinct": len(set(answers)),
        "modal": modal,
        "modal_answer": modal_answer,
        "one_wrong_answer": modal == len(answers) and modal_answer is not None and not any(correct),
        "copies": sum(a is not None and a == reasoning_result(t) for a, t in zip(answers, texts, strict=True)),
        "signal": sum(abs(a) for a in c["advantage"]),
        "shift": sum(abs(u - a) for u, a in zip(c["advantage_used"], c["advantage"], strict=True) if u is not None),
        "filtered": sum(bool(f) for f in c["entropy_filtered"]),
        # the case Eq. 5 protects: the right sum in the reasoning, a wrong answer (a negative when others are right)
        "right_reasoning_wrong_answer": sum(r and not k for r, k in zip(right_reasoning, correct, strict=True)),
        "protected_reasoning": 0,
        "entropy": sum(c["mean_entropy"]) / len(texts),
        "sum_tokens": 0,
        "sum_in_span": 0,
        "sum_lambda_0": 0,
        "sum_lambda_2": 0,
    }
    for i, tokens in enumerate(c["completion_tokens"]):
        n, fw, bw = len(tokens), c["forward_span"][i], c["backward_span"][i]
        lam = records.lambda_row(c["lambda_positions"][i], c["lambda_values"][i], n)
        if right_reasoning[i] and not correct[i] and c["advantage"][i] < 0:
            result = _result_positions(tokens)  # the right sum, in a negative: λ 0 there is Eq. 5's protection
            row["protected_reasoning"] += bool(result) and all(t < fw and lam[t] == 0.0 for t in result)
        for t in sum_token_positions(tokens):
            row["sum_tokens"] += 1
            if t < fw or t >= n - bw:
                row["sum_in_span"] += 1
                row["sum_lambda_0"] += lam[t] == 0.0
                row["sum_lambda_2"] += lam[t] == 2.0
    return row


def run_rows(run: str | Path) -> list[dict]:
    """``step_row`` for every recorded step of a run, in step order."""
    return [step_row(records.read_step(run, t)) for t in records.recorded_steps(run)]


def summarize(rows: list[dict], first: int = LATE_FROM) -> dict:
    """Steps ``first``.. of a run: the mean per group of correct completions, distinct answers, the modal answer's
    count and answers copying the reasoning; the steps whose eight completions were one wrong answer; the summed
    signal and shift and the shift's share of their sum; the per-completion push of a step without signal (the shift
    alone) and of a step with signal (|A|); the groups' mean entropy; filtered completions; the tokens writing the
    sum (reasoning's result and final answer) inside a span and, of those, at λ 0 and λ 2 (summed over the steps)."""
    late = [row for row in rows if row["step"] >= first]
    if not late:
        raise ValueError(f"no recorded step from step {first} on: pass a run with a longer completion record")

    def mean(key: str) -> float:
        return sum(row[key] for row in late) / len(late)

    signal, shift = sum(row["signal"] for row in late), sum(row["shift"] for row in late)
    flat = [row for row in late if row["signal"] < 1e-6]
    signalled = [row for row in late if row["signal"] >= 1e-6]
    return {
        "steps": [late[0]["step"], late[-1]["step"]],
        "correct": mean("correct"),
        "distinct": mean("distinct"),
        "modal": mean("modal"),
        "copies": mean("copies"),
        "one_wrong_answer_steps": [row["step"] for row in late if row["one_wrong_answer"]],
        "steps_without_signal": len(flat),
        "entropy": mean("entropy"),
        # per completion: the push a step without signal gets (the shift alone) against a step with signal's |A|
        "shift_per_completion_without_signal": sum(r["shift"] for r in flat) / sum(r["completions"] for r in flat)
        if flat
        else None,
        "advantage_per_completion_with_signal": sum(r["signal"] for r in signalled)
        / sum(r["completions"] for r in signalled)
        if signalled
        else None,
        "signal": signal,
        "shift": shift,
        "shift_share": shift / (signal + shift) if signal + shift else 0.0,
        "filtered": sum(row["filtered"] for row in late),
        "lambda_applied": all(row["lambda_applied"] for row in late),
        "right_reasoning_wrong_answer": sum(row["right_reasoning_wrong_answer"] for row in late),
        "protected_reasoning": sum(row["protected_reasoning"] for row in late),
        "sum_tokens": sum(row["sum_tokens"] for row in late),
        "sum_in_span": sum(row["sum_in_span"] for row in late),
        "sum_lambda_0": sum(row["sum_lambda_0"] for row in late),
        "sum_lambda_2": sum(row["sum_lambda_2"] for row in late),
    }


def heldout_agreement(samples: Path) -> dict:
    """From an evaluation's ``samples.jsonl`` (k samples per problem): accuracy (%), the problems whose k samples
    were all one wrong answer, the mean share of a problem's most common answer, and the mean number of distinct
    answers per problem."""
    by_problem: dict[str, list[dict]] = {}
    for line in samples.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_problem.setdefault(row["problem_id"], []).append(row)
    if not by_problem:
        raise ValueError(f"{samples} holds no samples: pass an evaluation's samples.jsonl")
    one_wrong, modal_share, distinct, correct, total = 0, 0.0, 0, 0, 0
    for rows in by_problem.values():
        answers = [(row["answer"] or "").strip().rstrip(".").strip() for row in rows]
        _, modal = Counter(answers).most_common(1)[0]
        one_wrong += modal == len(rows) and not any(row["correct"] for row in rows)
        modal_share += modal / len(rows)
        distinct += len(set(answers))
        correct, total = correct + sum(bool(row["correct"]) for row in rows), total + len(rows)
    n = len(by_problem)
    return {
        "problems": n,
        "accuracy %": 100.0 * correct / total,
        "one wrong answer problems": one_wrong,
        "modal share": modal_share / n,
        "distinct": distinct / n,
    }


def _optional(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table(runs: list[str], first: int = LATE_FROM) -> list[str]:
    """One markdown row per run: ``summarize`` over steps ``first``.. of its record."""
    lines = [
        "| run | correct / 8 | distinct answers / 8 | most common answer / 8 | answer = reasoning's result / 8 | "
        "right sum, wrong answer (protected) | steps with one wrong answer | steps without signal | "
        "shift per completion there | abs A per completion with signal | shift's share | filtered | "
        "sum's tokens in a span (λ 0, λ 2) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = summarize(run_rows(run), first)
        one = ", ".join(map(str, s["one_wrong_answer_steps"])) or "–"
        lines.append(
            f"| {Path(run).parent.name}/{Path(run).name} | {s['correct']:.2f} | {s['distinct']:.2f} | {s['modal']:.2f} "
            f"| {s['copies']:.2f} | {s['right_reasoning_wrong_answer']} "
            + (f"({s['protected_reasoning']}) " if s["lambda_applied"] else "")
            + f"| {one} "
            f"| {s['steps_without_signal']} | {_optional(s['shift_per_completion_without_signal'], 4)} "
            f"| {_optional(s['advantage_per_completion_with_signal'], 2)} | {100 * s['shift_share']:.1f} % "
            f"| {s['filtered']} | {s['sum_in_span']} of {s['sum_tokens']} "
            + (f"({s['sum_lambda_0']}, {s['sum_lambda_2']}) |" if s["lambda_applied"] else "(no λ applied) |")
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders with a completions/ record")
    parser.add_argument("--table", action="store_true", help="one markdown row per run, steps --first on")
    parser.add_argument("--first", type=int, default=LATE_FROM, help="with --table: the first step summed")
    parser.add_argument("--heldout", action="store_true", help="each run's held-out agreement (eval/synthetic)")
    args = parser.parse_args(argv)
    for run in args.runs:
        if not records.recorded_steps(run) and not args.heldout:
            parser.error(f"{run} has no completion record (completions/): pass a run folder written by gtpo train")
    if args.heldout:
        for run in args.runs:
            print(run, json.dumps(heldout_agreement(Path(run) / "eval" / "synthetic" / "samples.jsonl")))
        return
    if args.table:
        print("\n".join(table(args.runs, args.first)))
        return
    for run in args.runs:
        print(f"== {run}")
        for row in run_rows(run):
            print(
                f"{row['step']:3d} correct {row['correct']} distinct {row['distinct']} modal {row['modal']} "
                f"{row['modal_answer']!r:8} copies {row['copies']} signal {row['signal']:5.2f} "
                f"shift {row['shift']:.3f} filtered {row['filtered']} sum tokens {row['sum_tokens']:2d}, "
                f"in a span {row['sum_in_span']} (λ0 {row['sum_lambda_0']}, λ2 {row['sum_lambda_2']})"
            )


if __name__ == "__main__":
    main()
