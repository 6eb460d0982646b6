"""Normalisation and the exact numeric path of the grader: what an answer's text becomes before comparison,
its number when it is one, and the cheap safety pre-checks that keep pathological text away from sympy."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

from gtpo.grading.extract import last_boxed

# Limits of the pre-checks. Measured on the 5,500 MATH test + MATH-500 gold answers: longest 81
# characters, bracket depth 3, largest exponent 2007 (`3^{2007}`, 958 digits), no factorial, sum,
# integral or limit. The limits leave a wide margin for real answers and none for pathological ones.
MAX_ANSWER_CHARS = 1_000
MAX_SYMBOLIC_CHARS = 400
MAX_NESTING = 12
MAX_EXPONENT = 10_000

# math-verify's default float comparison: decimals agree when rounded to 6 places (1/3 = 0.333333).
FLOAT_ROUNDING = 6

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
