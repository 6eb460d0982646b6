"""The SFT baseline: gold solutions in the tag format, and a short run with the tiny model."""

from __future__ import annotations

import json

import pytest

from gtpo import cli
from gtpo.tasks.registry import load_task
from gtpo.tasks.rewards import ACCURACY_REWARD, FORMAT_REWARD, accuracy_reward, format_reward
from gtpo.trainer.sft import sft_dataset, solution_reasoning


def test_gsm8k_reasoning_drops_the_final_line_and_calculator_annotations():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    assert solution_reasoning(solution) == "Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips."


@pytest.mark.parametrize(
    "task, split, path",
    [("gsm8k", "train", "gsm8k/train.jsonl"), ("math500", "test", "math500/test.jsonl"), ("synthetic", "train", None)],
)
def test_gold_completions_earn_the_full_format_and_accuracy_reward(task, split, path, shared_data):
    source = str(shared_data / path) if path else None
    rows = load_task(task, split, source=source, num_examples=40, few_shot=0)
    pairs = sft_dataset(rows)
    assert pairs.column_names == ["prompt", "completion"]
    assert pairs[0]["prompt"] == rows[0]["prompt"]
    completions = pairs["completion"]
    assert format_reward(completions) == [FORMAT_REWARD] * len(rows)
    assert accuracy_reward(completions, answer=rows["answer"]) == [ACCURACY_REWARD] * len(rows)


def test_sft_command_trains_and_saves_an_adapter(tmp_path, tiny_model_path, capsys):
    run_dir = tmp_path / "sft"
    status = cli.main([
        "sft", "--model_name_or_path", tiny_model_path, "--task", "synthetic", "--num_examples", "8",
        "--max_steps", "2", "--per_device_train_batch_size", "2", "--logging_steps", "1",
        "--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
        "--report_to", "none", "--save_strategy", "no", "--output_dir", str(run_dir),
    ])  # fmt: skip
    assert status == 0, capsys.readouterr().err[-2000:]
    assert (run_dir / "model" / "adapter_model.safetensors").stat().st_size > 0
    config = json.loads((run_dir / "model" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == tiny_model_path
    losses = [
        row["loss"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in row
    ]
    assert len(losses) == 2
