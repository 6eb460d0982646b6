"""Every recipe in recipes/ loads into its config classes (no training) and says what Listing 1 says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gtpo.cli import arguments
from gtpo.tasks.registry import TASKS
from gtpo.tasks.rewards import REWARD_FUNCS

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
ALL = sorted(RECIPES.rglob("*.yaml"))
PAPER = [p for p in ALL if "smollm2" not in p.parts]
RL = [p for p in PAPER if p.name != "sft.yaml"]
SFT = [p for p in PAPER if p.name == "sft.yaml"]


def rel(path: Path) -> str:
    return str(path.relative_to(RECIPES))


def load(path: Path):
    parser = arguments.sft_parser() if path.name == "sft.yaml" else arguments.train_parser()
    (script_args, training_args, model_args), _ = parser.parse(["--config", str(path)])
    return script_args, training_args, model_args


def test_the_paper_matrix_is_complete():
    names = {rel(p) for p in PAPER}
    for model in ("qwen2.5-3b", "llama-3.1-8b"):
        for task in ("gsm8k", "math"):
            assert f"{model}/{task}/sft.yaml" in names
            for group in (8, 12):
                for method in ("gtpo", "grpo-beta0", "grpo-beta1e-6"):
                    assert f"{model}/{task}/{method}-g{group}.yaml" in names
    assert len(PAPER) == 2 * 2 * (3 * 2 + 1)


def test_recipes_are_what_generate_writes():
    result = subprocess.run([sys.executable, str(RECIPES / "generate.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", RL, ids=rel)
def test_rl_recipe_loads_with_listing_1_settings(path):
    script_args, args, model_args = load(path)
    assert script_args.task in TASKS and script_args.split == "train" and script_args.few_shot == 0
    assert set(script_args.reward_funcs) <= set(REWARD_FUNCS)
    # Listing 1
    assert args.learning_rate == 1e-6 and args.lr_scheduler_type == "cosine" and args.warmup_steps == 0.005
    assert args.weight_decay == 0.1 and args.max_grad_norm == 0.1 and args.seed == 3407
    assert args.optim == "paged_adamw_8bit" and args.num_train_epochs == 1 and args.num_iterations == 1
    assert args.logging_steps == 1 and args.save_steps == 500 and args.gradient_accumulation_steps == 1
    assert args.max_completion_length == 1500 and args.vllm_gpu_memory_utilization == 0.4
    assert (
        model_args.load_in_4bit
        and model_args.use_peft
        and model_args.lora_r == (128 if "llama" in path.parts[-3] else 64)
    )
    assert set(model_args.lora_target_modules) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    # one prompt per device and step: per_device_train_batch_size counts completions in TRL
    assert args.num_generations == int(path.stem.rsplit("-g", 1)[1])
    assert args.per_device_train_batch_size == args.generation_batch_size == args.num_generations
    if path.stem.startswith("gtpo"):
        assert args.algorithm == "gtpo" and args.beta == 0.0
        assert (args.adam_beta1, args.adam_beta2) == (0.999999, 0.999999)
    else:
        assert args.algorithm == "grpo" and args.beta == (1e-6 if "beta1e-6" in path.stem else 0.0)
        assert (args.adam_beta1, args.adam_beta2) == (0.9, 0.95)


@pytest.mark.parametrize("path", SFT, ids=rel)
def test_sft_recipe_loads_with_listing_1_settings(path):
    script_args, args, model_args = load(path)
    assert script_args.task in TASKS
    assert args.learning_rate == 1e-6 and (args.adam_beta1, args.adam_beta2) == (0.9, 0.95)
    assert args.per_device_train_batch_size == 1 and args.max_length == 5500 and args.max_grad_norm == 0.1
    assert model_args.load_in_4bit and model_args.use_peft


def test_gtpo_and_grpo_recipes_differ_only_in_algorithm_keys():
    allowed = {"algorithm", "beta", "adam_beta1", "adam_beta2", "run_name"}  # Listing 1 sets Adam per method
    for gtpo in RECIPES.rglob("gtpo-g*.yaml"):
        base = yaml.safe_load(gtpo.read_text())
        for grpo in gtpo.parent.glob(f"grpo-*-{gtpo.stem.split('-')[-1]}.yaml"):
            other = yaml.safe_load(grpo.read_text())
            differing = {k for k in base.keys() | other.keys() if base.get(k) != other.get(k)}
            assert differing <= allowed, (rel(grpo), differing - allowed)


def test_the_offline_demo_recipe_is_the_no_argument_default():
    assert yaml.safe_load((RECIPES / "smollm2/synthetic/gtpo.yaml").read_text()) == arguments.DEFAULT_TRAIN_RECIPE
    _, args, _ = load(RECIPES / "smollm2/synthetic/grpo.yaml")
    assert args.algorithm == "grpo" and args.beta == 0.0
