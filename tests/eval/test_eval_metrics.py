"""pass@k and maj@k against brute-force enumeration of k-subsets."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtpo.eval.metrics import (
    group_answers,
    maj_at_k,
    maj_at_k_from_classes,
    pass_at_k,
    powers_of_two_up_to,
)


def brute_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of k-subsets of n samples (the first c correct) that contain a correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(s < c for s in subset) for subset in subsets), len(subsets))


def brute_maj_at_k(labels, class_correct, k: int) -> Fraction:
    """Mean over k-subsets of the majority class's correctness; ties split, None never votes."""
    total, count = Fraction(0), 0
    for subset in itertools.combinations(range(len(labels)), k):
        count += 1
        votes = {}
        for s in subset:
            if labels[s] is not None:
                votes[labels[s]] = votes.get(labels[s], 0) + 1
        if not votes:
            continue
        top = max(votes.values())
        tied = [label for label, v in votes.items() if v == top]
        total += Fraction(sum(class_correct[label] for label in tied), len(tied))
    return total / count


def brute_maj_at_k_answers(answers, gold, k, equivalent) -> Fraction:
    """Brute force straight from answer strings: answers equivalent to gold are one class, wrong answers
    cluster by equivalence to the first member of a wrong class; then every k-subset votes."""
    reps, labels = [], []
    for a in answers:
        if a is None:
            labels.append(None)
        elif equivalent(a, gold):
            labels.append("correct")
        else:
            match = next((i for i, r in enumerate(reps) if equivalent(a, r)), None)
            if match is None:
                reps.append(a)
                match = len(reps) - 1
            labels.append(match)
    return brute_maj_at_k(labels, {"correct": True, **{i: False for i in range(len(reps))}}, k)


# ---------------------------------------------------------------- pass@k


def test_pass_at_k_equals_subset_enumeration_for_all_n_up_to_12():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(brute_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


@pytest.mark.parametrize("n,c,k", [(1000, 3, 1), (5000, 7, 64), (4096, 100, 1000), (3000, 1, 2999), (10000, 0, 5)])
def test_pass_at_k_is_exact_for_n_in_the_thousands(n, c, k):
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_pass_at_1_is_the_fraction_correct_and_pass_at_n_is_any_correct():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 0, 8) == 0.0


@pytest.mark.parametrize(
    "n,c,k,match",
    [
        (4, 1, 5, r"k=5 with n=4.*valid k are 1\.\.4"),
        (4, 1, 0, "valid k are 1..4"),
        (4, 5, 1, "num_correct"),
        (0, 0, 1, "num_samples"),
    ],
)
def test_pass_at_k_rejects_bad_input_naming_the_valid_range(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_reported_ks_are_powers_of_two_plus_n():
    assert powers_of_two_up_to(1) == [1]
    assert powers_of_two_up_to(4) == [1, 2, 4]
    assert powers_of_two_up_to(6) == [1, 2, 4, 6]
    assert powers_of_two_up_to(64) == [1, 2, 4, 8, 16, 32, 64]


# ---------------------------------------------------------------- maj@k from class counts


def _classes(labels):
    m = max((x for x in labels if x is not None), default=-1) + 1
    return [sum(1 for x in labels if x == i) for i in range(m)]


def test_maj_at_k_equals_subset_enumeration_on_all_small_vote_patterns():
    # Every labelling of n <= 7 samples with up to 3 classes and None, first class correct, all k.
    for n in range(1, 8):
        for labels in itertools.product([None, 0, 1, 2], repeat=n):
            if labels != tuple(sorted(labels, key=lambda x: -1 if x is None else x)):
                continue  # the estimator is symmetric in sample order: one labelling per multiset
            counts = _classes(labels)
            if not counts:
                assert maj_at_k_from_classes([], [], n, 1) == 0.0
                continue
            correct = [i == 0 for i in range(len(counts))]
            for k in range(1, n + 1):
                exact = brute_maj_at_k(list(labels), correct, k)
                assert maj_at_k_from_classes(counts, correct, n, k) == pytest.approx(float(exact), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=1, max_size=11),
    correct_bits=st.lists(st.booleans(), min_size=5, max_size=5),
    data=st.data(),
)
def test_maj_at_k_equals_subset_enumeration_on_random_votes(labels, correct_bits, data):
    # Relabel to 0..m-1 so that classes are dense; several correct classes are allowed too.
    seen = sorted({x for x in labels if x is not None})
    labels = [None if x is None else seen.index(x) for x in labels]
    counts = _classes(labels)
    correct = correct_bits[: len(counts)]
    k = data.draw(st.integers(1, len(labels)))
    exact = brute_maj_at_k(labels, correct, k)
    assert maj_at_k_from_classes(counts, correct, len(labels), k) == pytest.approx(float(exact), abs=1e-12)


def test_maj_at_k_two_way_tie_splits_credit():
    assert maj_at_k_from_classes([1, 1], [True, False], 2, 2) == pytest.approx(0.5)
    assert maj_at_k_from_classes([2, 2], [True, False], 5, 5) == pytest.approx(0.5)  # one None sample
    assert maj_at_k_from_classes([1, 1, 1], [True, False, False], 3, 3) == pytest.approx(1 / 3)


def test_maj_at_k_none_never_wins():
    # Subsets holding only unanswered samples score 0; with k=1: 1 answered (correct) of 4.
    assert maj_at_k_from_classes([1], [True], 4, 1) == pytest.approx(0.25)
    assert maj_at_k_from_classes([1], [True], 4, 4) == pytest.approx(1.0)


def monte_carlo_maj_at_k(counts, correct, num_samples, k, draws=40_000, seed=0):
    """maj@k by sampling k-subsets (vote counts drawn from the multivariate hypergeometric law)."""
    rng = np.random.default_rng(seed)
    colors = list(counts) + [num_samples - sum(counts)]  # last: samples without an answer
    votes = rng.multivariate_hypergeometric(colors, k, size=draws)[:, :-1]  # (draws, classes)
    top = votes.max(axis=1, keepdims=True)
    tied = (votes == top) & (top > 0)
    scores = (tied * np.array(correct)).sum(axis=1) / np.maximum(tied.sum(axis=1), 1)
    return scores.mean(), scores.std() / np.sqrt(draws)


@pytest.mark.parametrize(
    "counts,correct,n,k",
    [
        ([1200, 1100, 500, 200], [False, True, False, False], 3000, 256),  # n in the thousands
        ([100, 90, 40, 20], [False, True, False, False], 300, 16),
        ([5, 5, 5, 5, 4, 4], [False, False, True, False, False, False], 40, 6),
    ],  # many ties
)
def test_maj_at_k_matches_monte_carlo_beyond_enumeration(counts, correct, n, k):
    exact = maj_at_k_from_classes(counts, correct, n, k)
    estimate, stderr = monte_carlo_maj_at_k(counts, correct, n, k)
    assert 0.0 <= exact <= 1.0
    assert exact == pytest.approx(estimate, abs=4 * stderr + 1e-9)


def test_maj_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="valid k are 1..3"):
        maj_at_k_from_classes([2, 1], [True, False], 3, 4)
    with pytest.raises(ValueError, match="valid k are 1..2"):
        maj_at_k(["1", "2"], "1", 3, equivalent=str.__eq__)


# ---------------------------------------------------------------- maj@k with the project's grader


@pytest.fixture(scope="module")
def is_equivalent():
    from gtpo.grading.equivalence import is_equivalent

    return is_equivalent


def test_equivalent_answers_written_differently_pool_their_votes(is_equivalent):
    answers = ["1/2", "7", "0.5", "7", "\\frac{1}{2}", None]
    classes = group_answers(answers, "0.5", is_equivalent)
    assert classes.counts == (3, 2)
    assert classes.correct == (True, False)
    assert classes.labels == (0, 1, 0, 1, 0, None)
    # Voting by string, "7" (2 votes) would beat each spelling of one half (1 vote each).
    assert maj_at_k(answers, "0.5", 6, is_equivalent) == 1.0
    for k in range(1, 7):
        exact = brute_maj_at_k_answers(answers, "0.5", k, is_equivalent)
        assert maj_at_k(answers, "0.5", k, is_equivalent) == pytest.approx(float(exact), abs=1e-12)


def test_tie_between_equivalent_pooled_class_and_another_splits_credit(is_equivalent):
    answers = ["\\frac{3}{4}", "0.75", "12", "12.0"]
    assert group_answers(answers, "3/4", is_equivalent).counts == (2, 2)
    assert maj_at_k(answers, "3/4", 4, is_equivalent) == pytest.approx(0.5)
    for k in range(1, 5):
        exact = brute_maj_at_k_answers(answers, "3/4", k, is_equivalent)
        assert maj_at_k(answers, "3/4", k, is_equivalent) == pytest.approx(float(exact), abs=1e-12)


def test_all_unanswered_scores_zero(is_equivalent):
    assert maj_at_k([None, None, None], "4", 2, is_equivalent) == 0.0


def test_correct_answers_form_one_class_even_where_the_grader_is_asymmetric(is_equivalent):
    # The grader refuses an unevaluated expression for a numeric gold ("2 + 3" is not 5), but math-verify
    # accepts 5 against the reference "2 + 3". Voting must not let the wrong "2 + 3" absorb the right "5"s.
    assert not is_equivalent("2 + 3", "5") and is_equivalent("5", "2 + 3")
    answers = ["2 + 3", "5", "5", "4"]
    classes = group_answers(answers, "5", is_equivalent)
    assert classes.labels == (0, 1, 1, 2) and classes.correct == (False, True, False)
    assert maj_at_k(answers, "5", 1, is_equivalent) == pytest.approx(pass_at_k(4, 2, 1))
    assert maj_at_k(answers, "5", 4, is_equivalent) == 1.0


def test_recorded_verdicts_can_stand_in_for_the_gold_answer():
    equal = str.__eq__
    answers = ["a", "b", "a", None]
    by_gold = group_answers(answers, "a", equal)
    by_flags = group_answers(answers, None, equal, correct=[True, False, True, False])
    assert by_gold == by_flags
    with pytest.raises(ValueError, match="marked correct but has no answer"):
        group_answers(answers, None, equal, correct=[True, False, True, True])


@settings(max_examples=40, deadline=None)
@given(answers=st.lists(st.one_of(st.none(), st.sampled_from(["1", "2", "3", "4"])), min_size=1, max_size=10))
def test_maj_at_1_equals_pass_at_1(answers):
    # With a coarse equivalence (same parity) the correct class still holds exactly the correct samples.
    parity = lambda a, b: int(a) % 2 == int(b) % 2  # noqa: E731
    c = sum(a is not None and parity(a, "1") for a in answers)
    assert maj_at_k(answers, "1", 1, parity) == pytest.approx(pass_at_k(len(answers), c, 1))
    for k in range(1, len(answers) + 1):
        exact = brute_maj_at_k_answers(answers, "1", k, parity)
        assert maj_at_k(answers, "1", k, parity) == pytest.approx(float(exact), abs=1e-12)


def test_grouping_compares_each_distinct_answer_with_gold_once_and_wrong_answers_pairwise():
    calls = []

    def equivalent(a, b):
        calls.append((a, b))
        return a == b

    group_answers(["1", "2", "1", "2", "3"] * 10, "1", equivalent)
    # distinct answers 1, 2, 3: three gold comparisons; wrong answers 2, 3: one comparison between them.
    assert sorted(calls) == [("1", "1"), ("2", "1"), ("3", "1"), ("3", "2")]
