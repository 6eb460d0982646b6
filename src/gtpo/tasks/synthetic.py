"""The offline synthetic task: "What is a op b?" questions with a hash-decided train/test split."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from gtpo.errors import InvalidInput
from gtpo.tasks.prompts import WORKED_EXAMPLES

_OPS: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def in_split(question: str, split: str, test_fraction: float) -> bool:
    """Whether ``question`` belongs to ``split`` of a generated arithmetic task (`synthetic`, `two-step`).

    A hash of the question text, not the seed or the operand range, decides the split: the same question is in the
    same split under every setting, so train and test never overlap."""
    digest = hashlib.sha256(question.encode()).digest()
    return (int.from_bytes(digest[:8], "big") / 2**64 < test_fraction) == (split == "test")


def check_generator_options(task: str, split: str, ops: str, min_operand: int, max_operand: int, test_fraction: float):
    """The options of a generated arithmetic task, checked: one line naming what is wrong (InvalidInput)."""
    if split not in ("train", "test"):
        raise InvalidInput(f"{task} split must be 'train' or 'test', got {split!r}")
    unknown = sorted(set(ops) - set(_OPS))
    if unknown or not ops:
        raise InvalidInput(f"{task} ops must be a non-empty string of {sorted(_OPS)}, got {ops!r}")
    if not 0 <= min_operand <= max_operand:
        raise InvalidInput(f"need 0 <= min_operand <= max_operand, got {min_operand}, {max_operand}")
    if not 0 < test_fraction < 1:
        raise InvalidInput(f"test_fraction must be in (0, 1), got {test_fraction}")


def synthetic_rows(
    split: str,
    *,
    seed: int = 0,
    min_operand: int = 1,
    max_operand: int = 50,
    ops: str = "+-",
    test_fraction: float = 0.2,
) -> list[dict]:
    """Every question "What is a op b?" with operands in [min_operand, max_operand] that falls in
    `split`, in an order shuffled by `seed`. Subtractions keep a >= b so answers are never negative.

    Default sizes: 3,775 questions, about 3,020 train and 755 test. Harder: raise max_operand.
    """
    check_generator_options("synthetic", split, ops, min_operand, max_operand, test_fraction)
    shown = {example.question for example in WORKED_EXAMPLES}  # never ask what the prompt answers
    rows = []
    for op in dict.fromkeys(ops):
        for a in range(min_operand, max_operand + 1):
            for b in range(min_operand, max_operand + 1):
                if op == "-" and a < b:
                    continue
                question = f"What is {a} {op} {b}?"
                if question in shown or not in_split(question, split, test_fraction):
                    continue
                result = _OPS[op](a, b)
                rows.append(
                    {
                        "id": f"synthetic/{split}/{a}{op}{b}",
                        "question": question,
                        "answer": str(result),
                        "solution": f"{a} {op} {b} = {result}.",
                        "level": None,
                        "subject": "arithmetic",
                    }
                )
    random.Random(seed).shuffle(rows)
    return rows
