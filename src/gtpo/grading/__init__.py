"""Grading: answer extraction, normalisation, symbolic equivalence, and the bounded worker pool behind it.

One grader for the training rewards and for evaluation (`is_equivalent`); model output is untrusted text, never
evaluated as code, and every symbolic verdict runs under a hard deadline in a worker process (`pool`).
"""

from gtpo.grading.equivalence import DEFAULT_TIMEOUT_S, is_equivalent
from gtpo.grading.extract import GOLD_EXTRACTORS, extract_answer, extract_gold, last_boxed

__all__ = ["DEFAULT_TIMEOUT_S", "GOLD_EXTRACTORS", "extract_answer", "extract_gold", "is_equivalent", "last_boxed"]
