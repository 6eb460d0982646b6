"""The paper's rewards (Sec. 16.1) as TRL reward functions, and a name registry.

Format (0, 1 or 10) plus accuracy (0 or 10): a completion earns at most 20. TRL calls each function
with the batch's completions and every dataset column as a keyword argument, and sums the results.
Accuracy is graded by `gtpo.grading`, the same grader as evaluation.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable

from gtpo.errors import InvalidInput, InvalidKey
from gtpo.grading import extract_answer, is_equivalent
from gtpo.tasks.prompts import ANSWER_TAGS, REASONING_TAGS

logger = logging.getLogger(__name__)

__all__ = [
    "ACCURACY_REWARD",
    "FORMAT_REWARD",
    "PARTIAL_FORMAT_REWARD",
    "REWARD_FUNCS",
    "accuracy_reward",
    "completion_text",
    "format_reward",
    "format_score",
    "get_reward_funcs",
]

# Paper Sec. 16.1: 10 for all the tags, 1 for only some, 0 for none; 10 for a correct answer.
FORMAT_REWARD = 10.0
PARTIAL_FORMAT_REWARD = 1.0
ACCURACY_REWARD = 10.0

_TAGS = (*REASONING_TAGS, *ANSWER_TAGS)
_WHITESPACE = re.compile(r"\s*")


def completion_text(completion) -> str:
    """The text of one completion: a string, or a conversational list of messages (assistant turns
    joined; content given as a string or as a list of text parts). Anything else gives ""."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return ""
    parts = []
    for message in completion:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, (list, tuple)):
            parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(parts)


def format_score(text: str) -> float:
    """Format reward of one completion text (paper Sec. 16.1). The exact rule:

    - 10 when the text contains ``<reasoning>``, then later ``</reasoning>``, then after nothing but
      whitespace ``<answer>``, then later ``</answer>``: a reasoning block directly followed by an answer
      block. Text before, inside and after the blocks is allowed.
    - 1 when at least one of the four tags appears but the above does not hold (a tag missing, blocks
      in the wrong order, or text between the blocks).
    - 0 when none of the four tags appears, or `text` is not a string.

    Tags are case-sensitive. Linear time in len(text), whatever the text.

    >>> format_score("<reasoning>2 + 3 = 5</reasoning>\\n<answer>5</answer>")
    10.0
    >>> format_score("The answer is <answer>5</answer>")
    1.0
    >>> format_score("The answer is 5")
    0.0
    """
    if not isinstance(text, str) or not any(tag in text for tag in _TAGS):
        return 0.0
    r_open, r_close = REASONING_TAGS
    a_open, a_close = ANSWER_TAGS
    last_answer_close = text.rfind(a_close)
    first_reasoning_open = text.find(r_open)
    if first_reasoning_open >= 0 and last_answer_close >= 0:
        close = text.find(r_close, first_reasoning_open + len(r_open))
        while close >= 0:  # each candidate </reasoning>; whitespace runs are disjoint, so linear overall
            after = _WHITESPACE.match(text, close + len(r_close)).end()
            if text.startswith(a_open, after) and last_answer_close >= after + len(a_open):
                return FORMAT_REWARD
            close = text.find(r_close, close + len(r_close))
    return PARTIAL_FORMAT_REWARD


def format_reward(completions, **kwargs) -> list[float]:
    """TRL reward function: `format_score` of each completion (string or conversational).

    >>> format_reward(["<reasoning>2 + 3 = 5</reasoning><answer>5</answer>", "<answer>5", "5", None])
    [10.0, 1.0, 0.0, 0.0]
    """
    return [format_score(completion_text(c)) for c in completions]


def _accuracy_score(completion, gold) -> float:
    try:
        if gold is None:
            return 0.0
        prediction = extract_answer(completion_text(completion))
        return ACCURACY_REWARD if is_equivalent(prediction, str(gold)) else 0.0
    except Exception:  # a reward must never stop training; grading bugs show in the log
        logger.warning("accuracy reward failed on one completion, scored 0", exc_info=True)
        return 0.0


def accuracy_reward(completions, answer=None, **kwargs) -> list[float]:
    """TRL reward function: 10 when the answer inside the completion's last ``<answer>...</answer>``
    is equivalent to the gold answer (`gtpo.grading.is_equivalent`), else 0.

    answer: the dataset's gold-answer column (one gold per completion, as TRL passes it).

    >>> accuracy_reward(["<answer>1,000</answer>", "<answer>$\\\\frac{1}{2}$</answer>", "1000"],
    ...                 answer=["1000", "0.5", "1000"])
    [10.0, 10.0, 0.0]
    """
    if answer is None:
        raise InvalidKey(
            "accuracy_reward needs the gold answers in a dataset column named 'answer' (see gtpo.tasks.registry); "
            f"columns passed: {sorted(kwargs)}"
        )
    if isinstance(answer, str) or len(answer) != len(completions):
        n = 1 if isinstance(answer, str) else len(answer)
        raise InvalidInput(f"accuracy_reward got {len(completions)} completions but {n} gold answers")
    return [_accuracy_score(c, g) for c, g in zip(completions, answer, strict=False)]


REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "format": format_reward,
    "accuracy": accuracy_reward,
}


def get_reward_funcs(names: str | Iterable[str] = ("format", "accuracy")) -> list[Callable[..., list[float]]]:
    """The reward functions for `names` (a list, or one string with comma-separated names), in order.

    >>> [f.__name__ for f in get_reward_funcs("format,accuracy")]
    ['format_reward', 'accuracy_reward']
    """
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = list(names)
    unknown = [n for n in names if n not in REWARD_FUNCS]
    if unknown or not names:
        raise InvalidKey(f"unknown reward name(s) {unknown or names}; valid: {sorted(REWARD_FUNCS)}")
    return [REWARD_FUNCS[n] for n in names]
