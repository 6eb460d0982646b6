"""Answer fingerprints: which pairs of answers `is_equivalent` could possibly call equal, decided without comparing.

maj@k groups a problem's n answers into classes, each new answer joining the first earlier class whose
representative it is equivalent to (`gtpo.eval.metrics.group_answers`). Compared pairwise, that costs up to
w²/2 symbolic verdicts for w distinct answers, ~15 ms each on LaTeX (64 answers like ``3\\sqrt{47}+5``: 2,016
verdicts, 31 s). Here each distinct answer gets a fingerprint once, and :func:`may_be_equivalent` is a necessary
condition for `is_equivalent`: it mirrors the grader's rules in their order, and where the grader would reach
math-verify it compares the answers' symbolic fingerprints (:func:`gtpo.grading.symbolic.symbolic_fingerprint`):
their parsed strings, and each parsed expression's value at fixed probe points.

Why the condition is necessary (a pair it rejects is never equal, so the classes are exactly the pairwise ones):

- same normalised key: equal, kept. Two plain numbers: the grader's rule is exact or to 6 decimals, so equal
  numbers are within 10⁻⁶, far inside the tolerance below. A numeric gold against an unevaluated sum, an unsafe
  answer, an empty one: the grader says no, so does this. A number against a sentence: its last number decides.
- math-verify: an answer whose parse is unusable is equal to nothing (`verify_symbolic`). Strings are compared
  only with strings. Expressions are equal only by string, numeric equality (rounding to 6 decimals, or a
  difference that evaluates to 0 at 15 digits) or ``simplify(a - b) == 0``; each implies the same value at any
  point where both are defined, so values farther apart than :data:`TOLERANCE` cannot match. Everything else
  (sets, tuples, intervals, relations such as ``x = 5``, matrices, bare symbols, percentages, answers with no
  finite value at the probe points, fingerprints that timed out) is a wildcard: compared, as before.

Computing a symbolic fingerprint runs in the grading worker pool under the grader's deadline; it costs about one
parse, which the verdicts that follow reuse from the worker's cache.
"""

from __future__ import annotations

import functools
from fractions import Fraction

from gtpo.grading.equivalence import DEFAULT_TIMEOUT_S, rules_before_symbolic
from gtpo.grading.normalize import _Answer, _prepare
from gtpo.grading.pool import NO_WORKER, TIMED_OUT, get_pool
from gtpo.grading.symbolic import symbolic_fingerprint

# Values closer than this (relative to max(1, |a|, |b|)) may be equal. The grader's own tolerance is 10⁻⁶
# absolute (6 decimals) or 15 significant digits: this is 1,000 times looser, to cover float evaluation.
TOLERANCE = 1e-3


def _close(a: complex, b: complex) -> bool:
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def _close_numbers(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    try:
        return _close(float(a[0]), float(b[0]))
    except OverflowError:  # beyond floats: let the exact comparison decide
        return True


class Fingerprint:
    """One distinct answer's fingerprint: the grader's normalised form now, the symbolic part on first need."""

    __slots__ = ("prepared", "_symbolic", "_timeout")

    def __init__(self, answer: str | None, timeout: float | None = DEFAULT_TIMEOUT_S):
        self.prepared: _Answer | None = _prepare(answer) if isinstance(answer, str) else None
        self._symbolic = self
        self._timeout = timeout

    @property
    def symbolic(self) -> dict | None:
        """:func:`symbolic_fingerprint` of the answer (None when unknown: no worker, timed out, or an error)."""
        if self._symbolic is self:
            self._symbolic = _symbolic(self.prepared.latex, self._timeout)
        return self._symbolic


@functools.lru_cache(maxsize=16_384)
def _symbolic(latex: str, timeout: float | None) -> dict | None:
    if timeout is None or timeout <= 0:
        return symbolic_fingerprint(latex)
    result = get_pool().fingerprint(latex, timeout)
    return None if result in (TIMED_OUT, NO_WORKER) else result


def may_be_equivalent(prediction: Fingerprint, gold: Fingerprint) -> bool:
    """False only where ``is_equivalent(prediction, gold)`` is certainly False (see the module docstring).

    Walks `is_equivalent`'s own rules (`rules_before_symbolic`) with a looser number comparison, then compares
    symbolic fingerprints where the grader would call math-verify."""
    verdict = rules_before_symbolic(prediction.prepared, gold.prepared, _close_numbers)
    if verdict is not None:
        return verdict
    return _symbolic_may_match(prediction.symbolic, gold.symbolic)


def _symbolic_may_match(a: dict | None, b: dict | None) -> bool:
    if a is None or b is None:  # unknown: compare
        return True
    if not a["parsed"] or not b["parsed"]:
        return False
    if set(a["strings"]) & set(b["strings"]):
        return True
    return any(x is None or y is None or _close(complex(*x), complex(*y)) for x in a["values"] for y in b["values"])


class AnswerFingerprints:
    """Fingerprints of one evaluation's answers, each computed once: ``prefilter(answer, representative)`` for
    `gtpo.eval.metrics.group_answers`."""

    def __init__(self, timeout: float | None = DEFAULT_TIMEOUT_S):
        self._timeout = timeout
        self._cache: dict[str, Fingerprint] = {}

    def __getitem__(self, answer: str) -> Fingerprint:
        fingerprint = self._cache.get(answer)
        if fingerprint is None:
            fingerprint = self._cache[answer] = Fingerprint(answer, self._timeout)
        return fingerprint

    def __call__(self, prediction: str, gold: str) -> bool:
        return may_be_equivalent(self[prediction], self[gold])
