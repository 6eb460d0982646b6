"""The offline two-step task: "What is a + b - c?" answered in two steps, "a + b = x. x - c = y.".

Why it exists: the one-step `synthetic` task ("What is a op b?") has completions one step long, so the tokens a
group shares are the restated question and the format's tags. GTPO's conflict correction (paper Sec. 5.1, Eq. 5)
is argued for completions that share correct reasoning and part later: a wrong final answer after a right first
step should not push that step down. Here a completion can be right in its first step and wrong in its second,
which `first_step_correct` checks for analysis (the reward grades the final answer only, as in `synthetic`).

The split is decided by a hash of the question text, as in `synthetic` (`gtpo.tasks.synthetic.in_split`): the same
question falls in the same split under every setting. The task carries its own worked examples (`TWO_STEP_EXAMPLES`),
never asked in either split.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from gtpo.tasks.prompts import WorkedExample
from gtpo.tasks.synthetic import check_generator_options, in_split

__all__ = ["TWO_STEP_EXAMPLES", "first_step", "first_step_correct", "first_step_end", "two_step_rows"]

_OPS: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}

# The task's worked examples: a two-step solution, one equation per step, once with each operator first. Measured
# with SmolLM2-135M-Instruct (20 test questions x 8 samples, 96 tokens, temperature 1, float32, operands 1-9): with
# the first example alone 5 of 160 completions had the full tag format and none the right answer; with both, 52 had
# the format, 11 the right answer and 62 a right first step (54 of them a wrong answer after it).
TWO_STEP_EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample("What is 4 + 3 - 2?", "4 + 3 = 7. 7 - 2 = 5.", "5"),
    WorkedExample("What is 12 - 5 + 8?", "12 - 5 = 7. 7 + 8 = 15.", "15"),
)

_QUESTION = re.compile(r"What is (\d+) ([+-]) (\d+) ([+-]) (\d+)\?")
# The first equation written in a completion: "a op b = x" (spaces optional, x may be negative or wrong).
_EQUATION = re.compile(r"(\d+)\s*([+-])\s*(\d+)\s*=\s*(-?\d+)")


def two_step_rows(
    split: str,
    *,
    seed: int = 0,
    min_operand: int = 1,
    max_operand: int = 9,
    ops: str = "+-",
    test_fraction: float = 0.2,
) -> list[dict]:
    """Every question "What is a op1 b op2 c?" with operands in [min_operand, max_operand] and op1, op2 from `ops`
    that falls in `split`, in an order shuffled by `seed`. Both the intermediate ``a op1 b`` and the answer are
    never negative (a question whose step would be is left out).

    Args:
        split: "train" or "test".
        seed: the order of the rows.
        min_operand, max_operand: the operand range (inclusive).
        ops: the operators each of the two steps may use, from "+-".
        test_fraction: the share of questions in the test split.

    Returns:
        Rows with id, question, answer (the final value), solution ("a op1 b = x. x op2 c = y."), level (None) and
        subject ("arithmetic"). Default sizes: 1,898 questions, 1,530 train and 368 test.
    """
    check_generator_options("two-step", split, ops, min_operand, max_operand, test_fraction)
    shown = {example.question for example in TWO_STEP_EXAMPLES}  # never ask what the prompt answers
    operands = range(min_operand, max_operand + 1)
    rows = []
    for op1 in dict.fromkeys(ops):
        for op2 in dict.fromkeys(ops):
            for a in operands:
                for b in operands:
                    x = _OPS[op1](a, b)
                    if x < 0:
                        continue
                    for c in operands:
                        y = _OPS[op2](x, c)
                        if y < 0:
                            continue
                        question = f"What is {a} {op1} {b} {op2} {c}?"
                        if question in shown or not in_split(question, split, test_fraction):
                            continue
                        rows.append(
                            {
                                "id": f"two-step/{split}/{a}{op1}{b}{op2}{c}",
                                "question": question,
                                "answer": str(y),
                                "solution": f"{a} {op1} {b} = {x}. {x} {op2} {c} = {y}.",
                                "level": None,
                                "subject": "arithmetic",
                            }
                        )
    random.Random(seed).shuffle(rows)
    return rows


def first_step(question: str) -> tuple[int, str, int, int] | None:
    """The first step of a two-step question: (a, op1, b, a op1 b), or None for text that is not one.

    >>> first_step("What is 12 - 5 + 3?")
    (12, '-', 5, 7)
    """
    match = _QUESTION.fullmatch(question.strip())
    if match is None:
        return None
    a, op1, b = int(match[1]), match[2], int(match[3])
    return a, op1, b, _OPS[op1](a, b)


def first_step_correct(completion: str, question: str) -> bool:
    """Whether the first equation a completion writes is the question's first step, computed right ("a op1 b = x"
    with the question's a, op1, b and the true x). For analysis only: the reward grades the final answer.

    Only the first equation counts, wherever it stands (inside or outside the reasoning tags); a completion that
    writes none, or starts with another equation, has no correct first step.

    >>> first_step_correct("<reasoning>\\n12 - 5 = 7. 7 + 3 = 11.\\n</reasoning>", "What is 12 - 5 + 3?")
    True
    >>> first_step_correct("<reasoning>\\n12 - 5 = 8. 8 + 3 = 11.\\n</reasoning>", "What is 12 - 5 + 3?")
    False
    """
    return first_step_end(completion, question) is not None


def first_step_end(completion: str, question: str) -> int | None:
    """Where a completion's correct first step ends: the character offset just after "a op1 b = x" (x's last
    digit), or None when its first equation is not the question's first step computed right (`first_step_correct`).
    A prefix of the completion holds the whole correct step when it is at least this long: what the analysis of a
    conflict span (its leading tokens, joined) asks.

    >>> first_step_end("<reasoning>\\n12 - 5 = 7. 7 + 3 = 9.", "What is 12 - 5 + 3?")
    22
    """
    step = first_step(question)
    if step is None or not isinstance(completion, str):
        return None
    match = _EQUATION.search(completion)  # greedy digits: the match ends after the whole number
    if match is None or (int(match[1]), match[2], int(match[3]), int(match[4])) != step:
        return None
    return match.end()
