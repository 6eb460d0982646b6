"""maj@k without quadratic grading (issue 22): answer fingerprints decide which pairs the grader need not compare.

Invariants, each checked against the grader itself (the independent reference):
- soundness: wherever ``is_equivalent(a, b)`` is True, ``may_be_equivalent`` is True, so a pair it rejects never
  matches (on every hand-picked grading case, both orders, and on MATH-500's gold answers against each other);
- identical classes: ``group_answers`` with fingerprints gives exactly the classes of today's pairwise grouping,
  on hand-built answer sets (symbolic-only equality, intervals, sets, degrees, units, unparseable answers),
  on the grading cases grouped by gold, on MATH-500 golds and on a committed evaluation's recorded answers;
- cost: never more comparisons than pairwise, and none at all between answers of different values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gtpo.eval.metrics import group_answers
from gtpo.grading import extract_gold, is_equivalent
from gtpo.grading.fingerprint import AnswerFingerprints, Fingerprint, may_be_equivalent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading_cases import CASES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Counting:
    """is_equivalent, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, prediction, gold):
        self.calls += 1
        return is_equivalent(prediction, gold)


def both_ways(answers: list[str | None]):
    """(classes, comparisons) without and with the fingerprint prefilter; all answers marked wrong, as the eval
    runner's recorded verdicts make most answers (no gold comparisons counted)."""
    results = []
    for prefilter in (None, AnswerFingerprints()):
        counting = Counting()
        classes = group_answers(answers, equivalent=counting, correct=[False] * len(answers), prefilter=prefilter)
        results.append((classes, counting.calls))
    return results


ANSWER_SETS = {
    "symbolic-only equality": [r"x^2+2x+1", r"(x+1)^2", r"\frac{1}{3}", "0.333333", r"\sqrt{8}", r"2\sqrt{2}"],
    "intervals and sets": [r"[0,1)", r"[0, 1)", r"(0,1]", r"\{1,2\}", r"\{2,1\}", r"(1,2)", r"\{1, 2, 3\}"],
    "degrees and units": [r"30^\circ", "30", r"30 \text{ cm}", r"\frac{\pi}{6}", "30 degrees", r"5\text{ m}^2", "5"],
    "equations and symbols": ["x=5", "5", "y = 5", "e", r"\text{e}", "E", "abc", r"\text{abc}", r"\text{yes}", "yes"],
    "percentages": [r"9\%", "9", "0.09", r"50\%", r"\frac{1}{2}", "0.5"],
    "unparseable and unsafe": [r"\frac{", r"\left(", r"10^{10^{10}}", "(((((((((((((1)))))))))))))", "", "?", "1"],
    "sentences": ["James runs 220 meters.", "220", "220 meters", "He has 5 apples", "5", "The answer is 220"],
    "large and close numbers": [
        "123456789012345678901234567890",
        "1.23456789012345678901234567890e29",
        "1000000",
        "1000000.0000001",
        "0.1234564",
        "0.1234566",
        r"10^{6}",
    ],  # fmt: skip
    "complex": ["i", r"\sqrt{-1}", "1+i", "1 + i", "2i", r"-i"],
}


@pytest.mark.parametrize("name", sorted(ANSWER_SETS))
def test_classes_are_identical_to_pairwise_and_never_cost_more(name):
    (plain, plain_calls), (fast, fast_calls) = both_ways(ANSWER_SETS[name])
    assert fast == plain, name
    assert fast_calls <= plain_calls, (name, fast_calls, plain_calls)


def test_every_equal_grading_case_passes_the_fingerprint_check_in_both_orders():
    """Soundness on the hand-picked grading cases: is_equivalent True => may_be_equivalent True."""
    fingerprints = AnswerFingerprints()
    checked = 0
    for prediction, gold, _expected, _symmetric in CASES:
        for a, b in ((prediction, gold), (gold, prediction)):
            if is_equivalent(a, b):
                checked += 1
                assert may_be_equivalent(fingerprints[a], fingerprints[b]), (a, b)
    assert checked >= 150  # most cases are equal pairs: the check is not vacuous


def test_grading_cases_grouped_by_gold_give_the_pairwise_classes():
    by_gold: dict[str, list[str]] = {}
    for prediction, gold, _expected, _symmetric in CASES:
        by_gold.setdefault(gold, [gold]).append(prediction)
    sets = [answers for answers in by_gold.values() if len(set(answers)) > 2]
    assert len(sets) >= 10
    for answers in sets:
        (plain, plain_calls), (fast, fast_calls) = both_ways(answers)
        assert fast == plain and fast_calls <= plain_calls, answers


def test_math500_gold_answers_against_each_other(shared_data):
    """Real answers of every shape MATH has (intervals, sets, matrices, text, degrees, expressions): the first 24
    gold answers, brute force over every ordered pair, and grouped."""
    rows = [json.loads(line) for line in (shared_data / "math500" / "test.jsonl").read_text().splitlines()[:24]]
    golds = [extract_gold(row["answer"], "math") for row in rows]
    fingerprints = AnswerFingerprints()
    for a in golds:
        for b in golds:
            if is_equivalent(a, b):
                assert may_be_equivalent(fingerprints[a], fingerprints[b]), (a, b)
    (plain, plain_calls), (fast, fast_calls) = both_ways(golds + [g.replace(" ", "") for g in golds[:8]])
    assert fast == plain and fast_calls <= plain_calls


def test_recorded_answers_of_a_committed_evaluation_group_alike():
    """Study A's gtpo/seed0 held-out evaluation: 100 problems x 8 recorded answers, with their recorded verdicts."""
    path = ROOT / "studies/smollm2-synthetic-lr2e-4/runs/gtpo/seed0/eval/synthetic/samples.jsonl"
    problems: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        problems.setdefault(row["problem_id"], []).append(row)
    assert len(problems) == 100
    for rows in problems.values():
        answers, correct = [r["answer"] for r in rows], [bool(r["correct"]) for r in rows]
        plain = group_answers(answers, equivalent=is_equivalent, correct=correct, prefilter=None)
        assert group_answers(answers, equivalent=is_equivalent, correct=correct) == plain  # "auto": fingerprints


def test_sixty_four_distinct_surds_need_no_pairwise_comparison():
    """The issue's slow case: 64 distinct answers like 3\\sqrt{47}+5 took 2,016 verdicts (31 s). Their values
    differ, so with fingerprints only the few pairs whose values are within the tolerance are compared."""
    import math

    from gtpo.grading.fingerprint import TOLERANCE

    triples = [(a, b, c) for a in (2, 3, 5, 7) for b in (2, 3, 47, 11) for c in (1, 5, 9, 13)]
    answers = [rf"{a}\sqrt{{{b}}}+{c}" for a, b, c in triples]
    counting = Counting()
    classes = group_answers(answers, equivalent=counting, correct=[False] * 64, prefilter=AnswerFingerprints())
    assert len(classes.counts) == 64
    # Compared: exactly the pairs whose values (by hand, in floats) lie within the fingerprint's tolerance.
    values = [a * math.sqrt(b) + c for a, b, c in triples]
    close = sum(abs(x - y) <= TOLERANCE * max(1, x, y) for i, x in enumerate(values) for y in values[:i])
    assert counting.calls == close and close <= 5  # against 2,016 pairwise


def test_a_fingerprint_that_cannot_be_computed_is_a_wildcard(monkeypatch):
    """No worker in time (or a time-out): the pair is compared, as without fingerprints; never wrongly split."""
    import gtpo.grading.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "_symbolic", lambda latex, timeout: None)
    assert may_be_equivalent(Fingerprint(r"(x+1)^2"), Fingerprint(r"x^2+2x+1"))
    assert may_be_equivalent(Fingerprint(r"(x+1)^2"), Fingerprint(r"x^3"))  # unknown: compared
    assert not may_be_equivalent(Fingerprint("5"), Fingerprint("7"))  # numbers need no symbolic fingerprint
