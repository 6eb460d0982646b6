"""Answer equivalence: the one grader behind the training rewards AND evaluation.

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
   verdict runs in a worker process that is killed at the deadline (`gtpo.grading.pool`), so it holds
   in any thread and through long C calls; math-verify's own `signal.alarm` timeouts are disabled.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict

from gtpo.grading.normalize import (
    _ARITHMETIC,
    _STATES_RESULT,
    _is_sentence,
    _last_number,
    _numbers_equal,
    _prepare,
)
from gtpo.grading.pool import NO_WORKER, get_pool
from gtpo.grading.symbolic import verify_symbolic

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1.0

# most n time-outs per problem, and a repeated pathological completion costs a reward step nothing.
_SLOW: OrderedDict[str, None] = OrderedDict()
_SLOW_MAX = 4_096


class _NoVerdict(Exception):
    """No worker was free before the deadline; raised so that `lru_cache` does not keep it."""


@functools.lru_cache(maxsize=16_384)
def _cached_verify(prediction: str, gold: str, timeout: float | None):
    if timeout is None or timeout <= 0:  # no deadline: in this process
        return verify_symbolic(prediction, gold)

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
        logger.warning(
            "no grading worker was free within %.1f s, scored as wrong: %.80r vs gold %.80r", timeout, prediction, gold
        )
        return False
    if result is True or result is False:
        return result
    _SLOW[prediction] = None
    while len(_SLOW) > _SLOW_MAX:
        _SLOW.popitem(last=False)
    logger.warning("grading timed out after %.1f s, scored as wrong: %.80r vs gold %.80r", timeout, prediction, gold)
    return False


def rules_before_symbolic(pred, ref, numbers_equal) -> bool | None:
    """Rules 1-5 of `is_equivalent` (and the safety pre-check) on two `_prepare`d answers: True or False, or None
    when math-verify decides. ``numbers_equal(a, b)`` compares two parsed numbers: the grader's exact rule, or
    `gtpo.grading.fingerprint`'s looser necessary condition, so that both walk the very same rules."""
    if pred is None or ref is None:
        return False
    if pred.key == ref.key:
        return True
    if pred.number is not None and ref.number is not None:
        return numbers_equal(pred.number, ref.number)
    if ref.number is not None and _ARITHMETIC.search(pred.key) and not _STATES_RESULT.search(pred.key):
        return False
    for number, other in ((ref.number, pred), (pred.number, ref)):
        if number is not None and other.number is None and _is_sentence(other.key):
            last = _last_number(other.key)
            return last is not None and numbers_equal(number, last)
    if pred.unsafe or ref.unsafe:
        logger.debug("not grading %.80r vs %.80r symbolically: %s", pred.latex, ref.latex, pred.unsafe or ref.unsafe)
        return False
    return None


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
    verdict = rules_before_symbolic(pred, ref, _numbers_equal)
    if verdict is not None:
        return verdict
    return _symbolic_equal(pred.latex, ref.latex, timeout)
