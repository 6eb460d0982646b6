"""pass@k and maj@k for one problem, from its n sampled completions. Pure: no model, no files.

pass@k (Chen et al. 2021, Eq. 1): the probability that at least one of k completions, drawn without
replacement from the n sampled, is correct. Unbiased for the model's pass@k when n >= k:

    pass@k = 1 - C(n - c, k) / C(n, k),   c = number of correct completions.

maj@k (Wang et al. 2023, self-consistency): the k completions vote with their extracted answers; the
answer with the most votes is the prediction. We report the same kind of estimator as pass@k, the
expectation over all C(n, k) subsets of k completions of the n sampled (not just the first k), so the
curve is smooth in k and uses every sample:

    maj@k = E_{S ⊂ [n], |S| = k} [ score(S) ]

- Votes are counted per *answer class*: extracted answers grouped by mathematical equivalence with the
  project's grader (``gtpo.grading.is_equivalent``), so "1/2", "0.5" and "\\frac{1}{2}" pool their votes.
  Every answer equivalent to the gold answer (a correct sample, by the same verdict as pass@k) is in
  the one correct class. Wrong answers are grouped among themselves greedily, in order of first
  appearance: each distinct wrong answer joins the first wrong class whose representative (its first
  member) it is equivalent to. So maj@1 = pass@1, and an order-dependent or non-transitive verdict
  (``is_equivalent("5", "2+3")`` is true, ``is_equivalent("2+3", "5")`` false) can never move a
  correct sample into a wrong class.
- Completions without an extracted answer (None) never win and never vote; a subset with no answer
  at all scores 0.
- Ties: when t classes share the maximum vote count, score(S) = (number of correct classes among the t)
  / t, i.e. the expected correctness under a uniform random tie-break.

The expectation is computed exactly, with hypergeometric probabilities over class counts rather than by
enumerating subsets (see :func:`maj_at_k_from_classes`): polynomial in k, not C(n, k). About 10 ms per
problem for n = 64 and every reported k; 0.4 s for n = 3000, k = 256 (the cost grows like k³ for
fixed vote shares, so k in the thousands takes tens of seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

Equivalent = Callable[[str, str], bool]


def _check_k(num_samples: int, k: int, what: str) -> None:
    for name, value in (("num_samples", num_samples), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if not 1 <= k <= num_samples:
        raise ValueError(
            f"{what} needs 1 <= k <= n, got k={k} with n={num_samples} samples per problem; "
            f"valid k are 1..{num_samples} (sample more completions for larger k)"
        )


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms a binomial coefficient and so
    stays exact to float precision for n in the thousands.

    >>> round(pass_at_k(10, 1, 1), 6)
    0.1
    >>> round(pass_at_k(4, 2, 2), 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    0.833333
    """
    _check_k(num_samples, k, "pass@k")
    if isinstance(num_correct, bool) or not isinstance(num_correct, (int, np.integer)):
        raise TypeError(f"num_correct must be an integer, got {num_correct!r}")
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct must be in 0..{num_samples} (num_samples), got {num_correct}")
    if num_samples - num_correct < k:  # every k-subset contains a correct sample
        return 1.0
    i = np.arange(num_samples - num_correct + 1, num_samples + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def powers_of_two_up_to(n: int) -> list[int]:
    """The k values reported: 1, 2, 4, ... <= n, and n itself when it is not a power of two."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ks = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
    return ks if ks[-1] == n else ks + [n]


@dataclass(frozen=True)
class AnswerClasses:
    """The votes of one problem: answers grouped by equivalence.

    counts[i]: number of samples in class i (classes in order of first appearance);
    correct[i]: whether class i is the class of correct answers (at most one is);
    labels[s]: class of sample s, or None when sample s has no extracted answer;
    num_samples: n, samples without an answer included.
    """

    counts: tuple[int, ...]
    correct: tuple[bool, ...]
    labels: tuple[int | None, ...]
    representatives: tuple[str, ...]

    @property
    def num_samples(self) -> int:
        return len(self.labels)


def _default_equivalent() -> Equivalent:
    from gtpo.grading import is_equivalent

    return is_equivalent


def _default_prefilter() -> Equivalent:
    from gtpo.grading.fingerprint import AnswerFingerprints

    return AnswerFingerprints()


def group_answers(
    answers: Sequence[str | None],
    gold: str | None = None,
    equivalent: Equivalent | None = None,
    *,
    correct: Sequence[bool] | None = None,
    prefilter: Equivalent | None | str = "auto",
) -> AnswerClasses:
    """Group extracted answers into answer classes for voting; see the module docstring for the rule.

    Every answer equivalent to ``gold`` goes into the one correct class; the others are grouped among
    themselves, each distinct string joining the first class whose representative it is equivalent to.
    ``equivalent(prediction, reference) -> bool`` defaults to ``gtpo.grading.is_equivalent``.
    ``correct``: per-sample verdicts already computed (e.g. the ``correct`` field of eval records), used
    instead of comparing with ``gold``, so that maj@k and pass@k rest on the same verdicts.
    ``prefilter(prediction, reference) -> bool``: a necessary condition for ``equivalent``, checked first, so
    that ``equivalent`` runs only on pairs that can match; the classes are the same as without it. "auto":
    the grader's answer fingerprints (:class:`gtpo.grading.fingerprint.AnswerFingerprints`) with the default
    ``equivalent`` (``is_equivalent``), none with another.
    Cost: one gold comparison per distinct answer; for w distinct wrong answers, w fingerprints and a comparison
    only where fingerprints allow (pairwise, O(w²), without a prefilter). With the default grader at most one
    comparison per distinct answer can hit the 1 s time-out (an answer that timed out is never parsed again).

    >>> same = lambda a, b: a.strip("0.") == b.strip("0.")
    >>> group_answers(["5", "7", "5.0", None, "7"], "5", same).counts
    (2, 2)
    """
    if correct is not None and len(correct) != len(answers):
        raise ValueError(f"got {len(correct)} correct flags for {len(answers)} answers")
    if correct is None and gold is None:
        raise ValueError("group_answers needs the gold answer or the per-sample correct flags")
    default = _default_equivalent()
    if prefilter == "auto":
        prefilter = _default_prefilter() if equivalent in (None, default) else None
    equivalent = equivalent or default
    representatives: list[str] = []
    class_correct: list[bool] = []
    class_of: dict[str, int] = {}
    correct_class: int | None = None
    labels: list[int | None] = []
    for index, answer in enumerate(answers):
        if answer is None:
            if correct is not None and correct[index]:
                raise ValueError(f"sample {index} is marked correct but has no answer")
            labels.append(None)
            continue
        if answer not in class_of:
            is_right = bool(correct[index]) if correct is not None else bool(equivalent(answer, gold))
            if is_right:
                match = correct_class
            else:  # wrong answers pool with wrong answers only: the grader need not be transitive
                match = next(
                    (
                        i
                        for i, rep in enumerate(representatives)
                        if not class_correct[i]
                        and (prefilter is None or prefilter(answer, rep))
                        and equivalent(answer, rep)
                    ),
                    None,
                )
            if match is None:
                match = len(representatives)
                representatives.append(answer)
                class_correct.append(is_right)
                if is_right:
                    correct_class = match
            class_of[answer] = match
        labels.append(class_of[answer])
    counts = [0] * len(representatives)
    for label in labels:
        if label is not None:
            counts[label] += 1
    return AnswerClasses(tuple(counts), tuple(class_correct), tuple(labels), tuple(representatives))


def _log_comb_table(n: int) -> np.ndarray:
    return np.array([math.lgamma(i + 1) for i in range(n + 1)])  # log(i!) for i = 0..n


def _hypergeom(log_fact: np.ndarray, population: int, successes: int, draws: np.ndarray, hits: np.ndarray):
    """P(hits successes in draws, without replacement, from a population with that many successes).

    Broadcasts over ``draws`` and ``hits``; impossible combinations get probability 0.
    """
    failures = draws - hits
    valid = (hits >= 0) & (hits <= successes) & (failures >= 0) & (failures <= population - successes)
    valid &= draws <= population
    h = np.where(valid, hits, 0)
    f = np.where(valid, failures, 0)
    d = np.where(valid, draws, 0)
    log_p = (
        log_fact[successes]
        - log_fact[h]
        - log_fact[successes - h]
        + log_fact[population - successes]
        - log_fact[f]
        - log_fact[population - successes - f]
        - (log_fact[population] - log_fact[d] - log_fact[population - d])
    )
    return np.where(valid, np.exp(log_p), 0.0)


def _shifted_sum(a: np.ndarray) -> np.ndarray:
    """out[r, t] = sum_v a[r + v, t, v] (terms with r + v beyond the last row are 0).

    a[r, t, v] is the probability mass that, from r draws left, moves to r - v draws left; summing the
    diagonals through a strided view does the whole shift-and-add in one vectorized pass.
    """
    rows, ties, width = a.shape  # (R+1, T+1, x)
    padded = np.concatenate([a, np.zeros((width, ties, width))], axis=0)  # (R+1+x, T+1, x)
    s0, s1, s2 = padded.strides
    view = np.lib.stride_tricks.as_strided(
        padded, shape=(rows, ties, width), strides=(s0, s1, s0 + s2), writeable=False
    )
    return view.sum(axis=2)  # (R+1, T+1)


def maj_at_k_from_classes(counts: Sequence[int], correct: Sequence[bool], num_samples: int, k: int) -> float:
    """Exact maj@k (expectation over k-subsets, ties split) from class sizes; see the module docstring.

    counts: samples per answer class; correct: whether each class is the gold answer; num_samples: n,
    which may exceed sum(counts) by the samples that have no answer.

    Method: maj@k = sum over correct classes j and vote counts x >= 1 of
    P(X_j = x) · E[ 1{no other class has more than x votes} / (1 + #other classes with exactly x) | X_j = x ].
    Given X_j = x, the other k - x draws come from the remaining n - a_j samples; the classes that can
    reach x votes (size >= x) are drawn one after another, each with a hypergeometric law on what is
    left, while a dynamic program tracks (draws left, classes tied at x). Classes smaller than x and the
    no-answer samples only absorb the draws left over, so they need no state. All quantities are
    probabilities, so nothing overflows for large n.

    >>> round(maj_at_k_from_classes([2, 1], [True, False], 3, 1), 6)  # one random sample: right 2 times in 3
    0.666667
    """
    _check_k(num_samples, k, "maj@k")
    if len(counts) != len(correct):
        raise ValueError(f"counts and correct must have the same length, got {len(counts)} and {len(correct)}")
    counts = [int(a) for a in counts]
    if any(a < 0 for a in counts) or sum(counts) > num_samples:
        raise ValueError(f"class counts {counts} must be >= 0 and sum to at most num_samples={num_samples}")
    if not any(correct):
        return 0.0
    log_fact = _log_comb_table(num_samples)
    total = 0.0
    for j, (a_j, ok) in enumerate(zip(counts, correct, strict=False)):
        if not ok or a_j == 0:
            continue
        others = [a for i, a in enumerate(counts) if i != j]
        for x in range(1, min(a_j, k) + 1):
            p_x = float(_hypergeom(log_fact, num_samples, a_j, np.array(k), np.array(x)))
            if p_x == 0.0:
                continue
            rivals = [a for a in others if a >= x]  # classes that could tie with or beat x votes
            left = k - x
            max_ties = min(len(rivals), left // x)
            state = np.zeros((left + 1, max_ties + 1))  # (draws left, classes tied at x)
            state[left, 0] = 1.0
            pool = num_samples - a_j
            draws = np.arange(left + 1)[:, None]  # (R+1, 1)
            hits = np.arange(x + 1)[None, :]  # (1, x+1): a rival may take 0..x votes, never more
            for a in rivals:
                h = _hypergeom(log_fact, pool, a, draws, hits)  # (R+1, x+1)
                new = _shifted_sum(state[:, :, None] * h[:, None, :x])  # rival takes v < x votes
                if max_ties:  # exactly x votes: a tie
                    new[: left + 1 - x, 1:] += state[x:, :-1] * h[x:, x, None]
                state = new
                pool -= a
            ties = np.arange(max_ties + 1)
            total += p_x * float((state / (1.0 + ties)).sum())
    return float(min(max(total, 0.0), 1.0))


def maj_at_k(
    answers: Sequence[str | None],
    gold: str,
    k: int,
    equivalent: Equivalent | None = None,
) -> float:
    """maj@k of one problem from the extracted answers of its n samples (None: no answer).

    Expectation over all k-subsets of the n samples that the majority answer class is equivalent to
    ``gold``; votes pooled by equivalence; ties split credit among the tied classes. See module docs.

    >>> maj_at_k(["4", "4", "5", None], "4", 4, equivalent=lambda a, b: a == b)
    1.0
    """
    classes = group_answers(answers, gold, equivalent)
    return maj_at_k_from_classes(classes.counts, classes.correct, classes.num_samples, k)


def mean_over_problems(values: Iterable[float]) -> float:
    """Benchmark score: the plain mean over problems of the per-problem estimates."""
    values = list(values)
    if not values:
        raise ValueError("no problems to average over")
    return float(sum(values) / len(values))


def summarize_records(records: Iterable[dict], problems: Sequence, num_samples: int) -> dict:
    """pass@k and maj@k (means over problems) from records; only ``problems`` and sample indices
    < ``num_samples`` count, and each problem must have all of them."""
    from gtpo.grading import is_equivalent
    from gtpo.grading.fingerprint import AnswerFingerprints

    fingerprints = AnswerFingerprints()  # one per evaluation: each distinct answer is fingerprinted once
    wanted = {str(p.id): p for p in problems}
    by_problem: dict[str, dict[int, dict]] = {key: {} for key in wanted}
    for r in records:
        key, s = str(r["problem_id"]), int(r["sample_index"])
        if key in wanted and s < num_samples:
            by_problem[key].setdefault(s, r)  # the first record of a (problem, sample) wins
    incomplete = {k: len(v) for k, v in by_problem.items() if len(v) != num_samples}
    if incomplete:
        example = next(iter(incomplete.items()))
        raise ValueError(
            f"{len(incomplete)} problems lack samples (e.g. {example[0]!r} has {example[1]} of "
            f"{num_samples}); re-run the evaluation to finish them"
        )
    ks = powers_of_two_up_to(num_samples)
    pass_sum = dict.fromkeys(ks, 0.0)
    maj_sum = dict.fromkeys(ks, 0.0)
    answered = truncated = length = 0
    for key, samples in by_problem.items():
        rows = [samples[s] for s in range(num_samples)]
        num_correct = sum(bool(r["correct"]) for r in rows)
        # maj@k rests on the recorded verdicts, the same ones pass@k counts.
        answers, correct = [r["answer"] for r in rows], [bool(r["correct"]) for r in rows]
        classes = group_answers(answers, wanted[key].gold, is_equivalent, correct=correct, prefilter=fingerprints)
        for k in ks:
            pass_sum[k] += pass_at_k(num_samples, num_correct, k)
            maj_sum[k] += maj_at_k_from_classes(classes.counts, classes.correct, num_samples, k)
        answered += sum(r["answer"] is not None for r in rows)
        truncated += sum(bool(r["truncated"]) for r in rows)
        length += sum(int(r["length"]) for r in rows)
    num_problems, total = len(by_problem), len(by_problem) * num_samples
    return {
        "num_problems": num_problems,
        "ks": ks,
        "pass@k": {str(k): pass_sum[k] / num_problems for k in ks},
        "maj@k": {str(k): maj_sum[k] / num_problems for k in ks},
        "answered_frac": answered / total,
        "truncated_frac": truncated / total,
        "mean_length": length / total,
        "estimators": {
            "pass@k": "unbiased estimator of Chen et al. (2021) from n samples, mean over problems",
            "maj@k": "expectation over k-subsets of the n samples; answers pooled by gtpo.grading.is_equivalent; "
            "no-answer samples never win; ties split credit; mean over problems",
        },
    }
