"""The symbolic path of the grader: math-verify's LaTeX parser and sympy, with a bound on the digits any number
in a parsed answer could have (big-integer arithmetic runs in C and nothing can interrupt it). Runs in the
grading worker processes of :mod:`gtpo.grading.pool`, or in-process when no deadline is asked for."""

from __future__ import annotations

import functools
import logging
import math

from gtpo.grading.normalize import MAX_EXPONENT

logger = logging.getLogger(__name__)

MAX_DIGITS = 10_000
MAX_EXPANSION_TERMS = 2_000


def _silence_math_verify_timeout_warning() -> None:
    # We disable math-verify's signal.alarm timeouts on purpose (they fail outside the main thread and
    # have 1 s granularity); its one-time warning about that would only confuse users.
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


@functools.lru_cache(maxsize=1)
def warm_math_verify():
    """math-verify, imported and warmed up once per process, outside any deadline: importing it and
    sympy's lazily loaded simplification code takes seconds on a busy machine, which must not count
    against the first answer graded."""
    import math_verify

    _silence_math_verify_timeout_warning()
    config = [math_verify.LatexExtractionConfig()]
    warm = math_verify.parse("$x^2 + 2x + 1$", extraction_config=config, parsing_timeout=None)
    math_verify.verify(
        warm, math_verify.parse("$(x+1)^2$", extraction_config=config, parsing_timeout=None), timeout_seconds=None
    )
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
        # A power of a sum of symbols expands into C(power + terms - 1, terms - 1) terms under simplify.
        expands = isinstance(base, sympy.Add) and base.free_symbols and power > 1
        if expands and (
            power == math.inf or math.comb(int(power) + len(base.args) - 1, len(base.args) - 1) > MAX_EXPANSION_TERMS
        ):
            return math.inf
        return max(_digits_bound(base, depth + 1), 1.0) * power
    if isinstance(
        expr,
        (
            sympy.factorial,
            sympy.factorial2,
            sympy.binomial,
            sympy.subfactorial,
            sympy.gamma,
            sympy.RisingFactorial,
            sympy.FallingFactorial,
            sympy.fibonacci,
            sympy.lucas,
        ),
    ):
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
    mv = warm_math_verify()
    wrapped = latex if ("$" in latex or "\\(" in latex or "\\[" in latex) else f"${latex}$"
    parsed = mv.parse(wrapped, extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None)
    for item in parsed:
        if not isinstance(item, str) and _digits_bound(item) > MAX_DIGITS:
            logger.debug("not grading %r: a number in it would exceed %d digits", latex, MAX_DIGITS)
            return ()
    return tuple(parsed)


def verify_symbolic(prediction: str, gold: str) -> bool:
    """math-verify's verdict on two lightly normalised answers (no deadline: the caller bounds the time)."""
    gold_parsed, pred_parsed = _parse(gold), _parse(prediction)
    if not gold_parsed or not pred_parsed:
        return False
    mv = warm_math_verify()
    return bool(mv.verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))


# Answers (lightly normalized) whose verdict once timed out as the prediction: never sent to a worker
# again in this process. Each time-out blames a distinct answer, so grouping n answers for maj@k spends at


# Where a fingerprint evaluates an expression's free symbols: generic values (irrational-looking, distinct, away
# from the poles and branch cuts of the usual answers), so that two different expressions rarely coincide there.
_PROBE_POINTS = (0.5772156649, 1.2020569032, 0.9159655942, 1.6180339887, 2.6854520011, 0.3183098862, 1.4142135624)


def _probe_value(expr) -> list[float] | None:
    """[real, imaginary] of a sympy expression evaluated at :data:`_PROBE_POINTS`, or None (a wildcard) where the
    grader might call it equal to something of another value: not an expression (sets, relations, matrices,
    tuples), a bare symbol (matched by name), a percentage (``9%`` = 9 in math-verify), or no finite value."""
    import sympy

    if not isinstance(expr, sympy.Expr) or isinstance(expr, sympy.Symbol) or expr.has(sympy.UnevaluatedExpr):
        return None
    symbols = sorted(expr.free_symbols, key=str)
    if not all(isinstance(symbol, sympy.Symbol) for symbol in symbols):
        return None
    points = {s: _PROBE_POINTS[i % len(_PROBE_POINTS)] + i // len(_PROBE_POINTS) for i, s in enumerate(symbols)}
    try:
        value = complex(expr.evalf(20, subs=points))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, AttributeError):
        return None
    if not (math.isfinite(value.real) and math.isfinite(value.imag)):
        return None
    return [value.real, value.imag]


def symbolic_fingerprint(latex: str) -> dict:
    """What decides whether `latex` can be symbolically equal to another answer, computed once per answer, so that
    maj@k compares only answers whose fingerprints allow it (:mod:`gtpo.grading.fingerprint`).

    Returns {"parsed": bool, "strings": [...], "values": [...]}: whether math-verify's parse is usable (when it is
    not, :func:`verify_symbolic` is False against anything), the parse's strings (stripped; math-verify compares
    strings with strings), and one value per parsed expression (:func:`_probe_value`, None for a wildcard).
    """
    parsed = _parse(latex)
    strings = [item.strip() for item in parsed if isinstance(item, str) and item.strip()]
    values = [_probe_value(item) for item in parsed if not isinstance(item, str)]
    return {"parsed": bool(parsed), "strings": strings, "values": values}
