"""gtpo.tasks.rewards: the paper's format and accuracy rewards (Sec. 16.1) as TRL reward functions."""

import concurrent.futures
import json
import multiprocessing
import sys
import time
from pathlib import Path

import pytest

from gtpo.grading import extract_gold
from gtpo.tasks.prompts import format_completion
from gtpo.tasks.rewards import REWARD_FUNCS, accuracy_reward, format_reward, format_score, get_reward_funcs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
from grading_cases import ADVERSARIAL  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GOOD = "<reasoning>\n2 + 3 = 5\n</reasoning>\n<answer>\n5\n</answer>"


def _gsm8k(split: str) -> list[dict]:
    path = SHARED_DATA / "gsm8k" / f"{split}.jsonl"
    if not path.is_file():
        pytest.fail(f"real test data not found at {path}: clone the project with ../shared beside it")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _as_tagged_completion(solution: str, number: str) -> str:
    # The GSM8K reference solution as the reasoning, its final number as the answer.
    reasoning = solution.rsplit("####", 1)[0]
    return format_completion(reasoning, number)


# ------------------------------------------------------------------------------ real data


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gsm8k_solution_in_tag_format_earns_full_format_and_accuracy(split):
    rows = _gsm8k(split)
    assert len(rows) == {"train": 7473, "test": 1319}[split]
    golds = [extract_gold(row["answer"], "gsm8k") for row in rows]
    completions = [_as_tagged_completion(row["answer"], gold) for row, gold in zip(rows, golds, strict=False)]
    assert format_reward(completions) == [10.0] * len(rows)
    assert accuracy_reward(completions, answer=golds) == [10.0] * len(rows)


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gsm8k_solution_with_a_wrong_number_earns_no_accuracy(split):
    rows = _gsm8k(split)
    golds = [extract_gold(row["answer"], "gsm8k") for row in rows]
    wrong = [_as_tagged_completion(row["answer"], str(int(gold) + 1)) for row, gold in zip(rows, golds, strict=False)]
    assert accuracy_reward(wrong, answer=golds) == [0.0] * len(rows)
    assert format_reward(wrong) == [10.0] * len(rows)


def test_gsm8k_gold_written_with_thousands_commas_and_dollars_still_earns_accuracy():
    rows = [r for r in _gsm8k("test") if "," in r["answer"].rsplit("####", 1)[1]]
    assert rows, "GSM8K test has golds with thousands separators"
    golds = [extract_gold(row["answer"], "gsm8k") for row in rows]
    completions = [
        _as_tagged_completion(row["answer"], "$" + row["answer"].rsplit("####", 1)[1].strip()) for row in rows
    ]
    assert accuracy_reward(completions, answer=golds) == [10.0] * len(rows)


# ------------------------------------------------------------------------------ format rule


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, 10.0),
        ("<reasoning>r</reasoning><answer>5</answer>", 10.0),
        ("Sure! <reasoning>r</reasoning>\n\n <answer>5</answer> Hope this helps.", 10.0),  # text around: fine
        ("<reasoning></reasoning><answer></answer>", 10.0),
        ("<reasoning>a</reasoning> <reasoning>b</reasoning>\n<answer>5</answer>", 10.0),
        ("<reasoning>r</reasoning> so <answer>5</answer>", 1.0),  # text between the blocks
        ("<answer>5</answer><reasoning>r</reasoning>", 1.0),  # wrong order
        ("<reasoning>r</reasoning>", 1.0),
        ("<answer>5</answer>", 1.0),
        ("<reasoning>r<answer>5</answer>", 1.0),  # reasoning never closed
        ("<reasoning>r</reasoning><answer>5", 1.0),  # answer never closed (truncated)
        ("</answer>", 1.0),
        ("<Reasoning>r</Reasoning><Answer>5</Answer>", 0.0),  # tags are case-sensitive
        ("The answer is 5.", 0.0),
        ("", 0.0),
    ],
)
def test_format_score_follows_the_documented_rule(text, expected):
    assert format_score(text) == expected


def test_rewards_sum_to_at_most_20_as_in_the_paper():
    completions = [GOOD, "<answer>5</answer>", "5", "<reasoning>x</reasoning><answer>4</answer>"]
    rewards = zip(format_reward(completions), accuracy_reward(completions, answer=["5"] * 4), strict=False)
    totals = [f + a for f, a in rewards]
    assert totals == [20.0, 11.0, 0.0, 10.0]


def test_conversational_completions_are_graded_like_strings():
    conversational = [
        [{"role": "assistant", "content": GOOD}],
        [{"role": "assistant", "content": [{"type": "text", "text": GOOD}]}],
    ]
    assert format_reward(conversational) == [10.0, 10.0]
    assert accuracy_reward(conversational, answer=["5", "5"]) == [10.0, 10.0]


@pytest.mark.parametrize(
    "bad", [None, "", 5, 3.5, b"<answer>5</answer>", [], [None], [{"role": "assistant"}], {"x": 1}, object()]
)
def test_empty_none_or_non_string_completions_get_zero_not_an_exception(bad):
    assert format_reward([bad]) == [0.0]
    assert accuracy_reward([bad], answer=["5"]) == [0.0]


def test_missing_gold_for_a_row_gives_zero():
    assert accuracy_reward([GOOD, GOOD], answer=[None, 5]) == [0.0, 10.0]


def test_accuracy_without_an_answer_column_names_the_columns_present():
    with pytest.raises(KeyError, match=r"'answer'.*columns passed: \['prompts', 'solution'\]"):
        accuracy_reward([GOOD], prompts=["p"], solution=["s"])


def test_accuracy_with_mismatched_lengths_fails_loudly():
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        accuracy_reward([GOOD, GOOD], answer=["5"])


def test_rewards_accept_the_keyword_arguments_trl_passes():
    kwargs = dict(prompts=["p"], completion_ids=[[1, 2]], trainer_state=None, log_extra=None, log_metric=None, id=["x"])
    assert format_reward([GOOD], **kwargs) == [10.0]
    assert accuracy_reward([GOOD], answer=["5"], **kwargs) == [10.0]


# ------------------------------------------------------------------------------ registry


def test_registry_returns_the_paper_rewards_in_order():
    assert get_reward_funcs(["format", "accuracy"]) == [format_reward, accuracy_reward]
    assert get_reward_funcs("accuracy, format") == [accuracy_reward, format_reward]
    assert set(REWARD_FUNCS) >= {"format", "accuracy"}


@pytest.mark.parametrize("names", [["format", "acuracy"], "speed", [], ""])
def test_registry_fails_loudly_with_the_valid_names(names):
    with pytest.raises(KeyError, match=r"valid: \['accuracy', 'format'\]"):
        get_reward_funcs(names)


# ------------------------------------------------------------------------------ adversarial completions


def _adversarial_completions():
    return [f"<reasoning>x</reasoning><answer>{a}</answer>" for a in ADVERSARIAL.values()] + [
        "<reasoning>" * 200_000,  # format rule must stay linear
        "<reasoning>" + "</reasoning>  x" * 100_000 + "</answer>",
        "<answer>" * 200_000 + "</answer>",
    ]


def _time_rewards(completions):
    accuracy_reward([GOOD.replace("5", r"\sqrt{25}")], answer=["5"])  # import sympy first: a one-time cost
    results = []
    for completion in completions:
        start = time.perf_counter()
        format_reward([completion])
        reward = accuracy_reward([completion], answer=["5"])[0]
        results.append((time.perf_counter() - start, reward))
    return results


def _check(results, where):
    for seconds, reward in results:
        assert reward == 0.0, where
        assert seconds < 1.0, f"{seconds:.2f} s {where}"


def test_adversarial_completions_get_zero_within_a_second_in_the_main_thread():
    _check(_time_rewards(_adversarial_completions()), "in the main thread")


def test_adversarial_completions_get_zero_within_a_second_in_worker_threads():
    # TRL may compute rewards off the main thread, where signal-based timeouts cannot work.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.submit(_time_rewards, _adversarial_completions()).result(timeout=120)
    _check(results, "in a worker thread")


def test_adversarial_completions_get_zero_within_a_second_in_a_worker_process():
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        pool.submit(accuracy_reward, [GOOD.replace("5", r"\sqrt{25}")], answer=["5"]).result(
            timeout=120
        )  # warm imports
        start = time.perf_counter()
        rewards = pool.submit(
            accuracy_reward, _adversarial_completions(), answer=["5"] * len(_adversarial_completions())
        )
        assert rewards.result(timeout=120) == [0.0] * len(_adversarial_completions())
    # Per completion, including pickling megabytes to the worker and back.
    assert (time.perf_counter() - start) / len(_adversarial_completions()) < 1.0


def test_docstring_examples_hold():
    import doctest

    import gtpo.tasks.prompts
    import gtpo.tasks.rewards

    for module in (gtpo.tasks.rewards, gtpo.tasks.prompts):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
