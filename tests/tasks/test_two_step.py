"""The two-step task (gtpo.tasks.two_step, issue 48 item 3): "What is a op1 b op2 c?" answered "a op1 b = x. x op2 c
= y.". Its generator is checked against an independent brute force over the operand range, its split against the
question-hash rule, its worked examples against the prompt, its grading against the shared reward functions, and
`first_step_correct` (used in analysis only) against hand-written completions."""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path

import pytest
import yaml

from gtpo.cli import arguments
from gtpo.cli.recipe import read_recipe
from gtpo.tasks import TASKS, WORKED_EXAMPLES, accuracy_reward, format_completion, format_reward, load_task
from gtpo.tasks.two_step import TWO_STEP_EXAMPLES, first_step, first_step_correct, first_step_end, two_step_rows

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _roles(prompt) -> list[str]:
    return [m["role"] for m in prompt]


def _brute_force(min_operand: int, max_operand: int, ops: str) -> dict[str, str]:
    """Every question the task may ask, with its answer, by plain enumeration (no split, no exclusion)."""
    apply = {"+": int.__add__, "-": int.__sub__}
    out = {}
    for op1, op2 in itertools.product(dict.fromkeys(ops), repeat=2):
        for a, b, c in itertools.product(range(min_operand, max_operand + 1), repeat=3):
            x = apply[op1](a, b)
            y = apply[op2](x, c)
            if x >= 0 and y >= 0:
                out[f"What is {a} {op1} {b} {op2} {c}?"] = str(y)
    return out


@pytest.mark.parametrize("options", [{}, {"max_operand": 5, "ops": "+"}, {"min_operand": 3, "max_operand": 12}])
def test_the_two_splits_are_every_valid_question_but_the_worked_examples_and_never_share_one(options):
    """Train + test = the brute-force set minus the task's worked examples; no question in both; every answer right
    and never negative (an intermediate below 0 is left out too)."""
    train = {r["question"]: r["answer"] for r in two_step_rows("train", **options)}
    test = {r["question"]: r["answer"] for r in two_step_rows("test", **options)}
    assert train and test and not train.keys() & test.keys()
    shown = {e.question for e in TWO_STEP_EXAMPLES}
    expected = {
        q: a
        for q, a in _brute_force(
            options.get("min_operand", 1), options.get("max_operand", 9), options.get("ops", "+-")
        ).items()
        if q not in shown
    }
    assert {**train, **test} == expected


def test_the_split_is_the_question_hash_so_no_setting_leaks_test_into_train():
    """A question's split depends on its text alone (sha256 < 20 % of the range: test): the same under every operand
    range and seed, so a wider train set never holds a default test question."""
    for row in two_step_rows("test"):
        digest = hashlib.sha256(row["question"].encode()).digest()
        assert int.from_bytes(digest[:8], "big") / 2**64 < 0.2
    wide_train = {r["question"] for r in two_step_rows("train", max_operand=15, seed=7)}
    assert not wide_train & {r["question"] for r in two_step_rows("test")}


def test_default_sizes_are_the_documented_ones():
    """The docstring's sizes: 1,530 train and 368 test questions (operands 1-9, both operators)."""
    assert (len(two_step_rows("train")), len(two_step_rows("test"))) == (1530, 368)
    assert "1,898 questions, 1,530 train and 368 test" in " ".join(two_step_rows.__doc__.split())


def test_rows_are_seeded_and_solutions_spell_both_steps():
    first, again, other = (two_step_rows("train", seed=s) for s in (3, 3, 4))
    assert first == again and [r["id"] for r in first] != [r["id"] for r in other]
    for row in first:
        a, op1, b, op2, c = re.fullmatch(r"What is (\d+) ([+-]) (\d+) ([+-]) (\d+)\?", row["question"]).groups()
        x = int(a) + int(b) if op1 == "+" else int(a) - int(b)
        y = x + int(c) if op2 == "+" else x - int(c)
        assert row["solution"] == f"{a} {op1} {b} = {x}. {x} {op2} {c} = {y}." and row["answer"] == str(y)
        assert row["id"] == f"two-step/train/{a}{op1}{b}{op2}{c}"


def test_the_task_carries_its_own_worked_examples_and_the_synthetic_prompt_is_unchanged():
    """Task.worked_examples: two-step prompts show its two two-step examples by default; synthetic still shows
    WORKED_EXAMPLES[0] (every existing run's prompt); a count beyond the task's examples is refused in one line."""
    row = load_task("two-step", "train", num_examples=1)[0]
    assert _roles(row["prompt"]) == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in row["prompt"][1:5]] == [
        m["content"] for example in TWO_STEP_EXAMPLES for m in example.messages()
    ]
    one = load_task("two-step", "test", num_examples=1, few_shot=1)[0]["prompt"]
    assert one[1]["content"] == "What is 4 + 3 - 2?" and len(one) == 4
    synthetic = load_task("synthetic", "train", num_examples=1)[0]["prompt"]
    assert synthetic[1]["content"] == WORKED_EXAMPLES[0].question == "What is 2 + 3?"
    with pytest.raises(ValueError, match=r"few_shot must be between 0 and 2 \(the two-step task's worked examples\)"):
        load_task("two-step", "test", few_shot=3)
    assert TASKS["synthetic"].worked_examples == WORKED_EXAMPLES  # the default every other task keeps


def test_reference_solutions_earn_the_maximum_reward_and_a_wrong_final_step_earns_format_only():
    """Graded by the final answer alone (gold 'synthetic'), with the shared rewards: a right first step does not earn
    accuracy when the second is wrong."""
    dataset = load_task("two-step", "test", num_examples=50)
    right = [format_completion(s, a) for s, a in zip(dataset["solution"], dataset["answer"], strict=True)]
    assert format_reward(right) == [10.0] * 50
    assert accuracy_reward(right, answer=dataset["answer"]) == [10.0] * 50
    wrong = format_completion("4 + 5 = 9. 9 - 2 = 6.", "6")  # right first step, wrong second
    assert accuracy_reward([wrong], answer=["7"]) == [0.0] and format_reward([wrong]) == [10.0]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<reasoning>\n12 - 5 = 7. 7 + 3 = 11.\n</reasoning>", True),  # both right
        ("<reasoning>\n12 - 5 = 7. 7 + 3 = 9.\n</reasoning>", True),  # first right, second wrong: still True
        ("12-5=7, then 10", True),  # spacing does not matter
        ("<reasoning>\n12 - 5 = 8. 8 + 3 = 11.\n</reasoning>", False),  # wrong value
        ("<reasoning>\n5 + 3 = 8. 12 - 5 = 7.\n</reasoning>", False),  # the first equation is another step
        ("<reasoning>\n12 + 5 = 17.\n</reasoning>", False),  # wrong operator
        ("The answer is 10.", False),  # no equation
        (None, False),
    ],
)
def test_first_step_correct_reads_the_first_equation_only(completion, expected):
    assert first_step_correct(completion, "What is 12 - 5 + 3?") is expected


def test_first_step_of_a_question_and_of_other_text():
    assert first_step("What is 9 + 8 - 3?") == (9, "+", 8, 17)
    assert first_step("What is 9 + 8?") is None and first_step_correct("9 + 8 = 17", "What is 9 + 8?") is False


@pytest.mark.parametrize(
    "options",
    [{"ops": "*"}, {"ops": ""}, {"min_operand": 5, "max_operand": 4}, {"test_fraction": 1.0}, {"test_fraction": 0}],
)
def test_bad_options_fail_loudly(options):
    with pytest.raises(ValueError):
        load_task("two-step", "train", **options)
    with pytest.raises(TypeError, match="unknown load_task option"):
        load_task("two-step", "train", max_operands=9)


@pytest.mark.parametrize("algorithm", ["gtpo", "grpo"])
def test_the_two_step_recipes_are_the_default_recipe_on_the_two_step_task(algorithm):
    """recipes/smollm2/two-step/ differ from the synthetic recipes in the task, its few-shot count and the run name
    only (so a two-step study changes one thing against studies D and F), and `gtpo train` reads them."""
    two_step = yaml.safe_load((RECIPES / f"smollm2/two-step/{algorithm}.yaml").read_text())
    synthetic = yaml.safe_load((RECIPES / f"smollm2/synthetic/{algorithm}.yaml").read_text())
    differing = {k for k in two_step.keys() | synthetic.keys() if two_step.get(k) != synthetic.get(k)}
    assert differing == {"task", "few_shot", "run_name"}
    assert (two_step["task"], two_step["few_shot"]) == ("two-step", TASKS["two-step"].default_few_shot)
    assert read_recipe(RECIPES / f"smollm2/two-step/{algorithm}.yaml")["task"] == "two-step"
    assert arguments.DEFAULT_TRAIN_RECIPE["task"] == "synthetic"  # the default run is unchanged


def test_first_step_end_is_just_after_the_whole_result():
    """A conflict span (a prefix of the completion) holds the correct first step when it reaches `first_step_end`:
    after the result's last digit, so a span that stops inside "17" does not count."""
    text = "<reasoning>\n9 + 8 = 17. 17 - 3 = 14.\n</reasoning>"
    end = first_step_end(text, "What is 9 + 8 - 3?")
    assert text[:end] == "<reasoning>\n9 + 8 = 17"
    assert first_step_end(text, "What is 9 + 8 + 3?") == end  # the second step plays no part
    assert first_step_end("9 + 8 = 18. 18 - 3 = 15.", "What is 9 + 8 - 3?") is None
