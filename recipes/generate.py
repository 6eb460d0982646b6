"""Write the paper's recipes (arXiv 2508.03772, Listing 1) as YAML files: `python recipes/generate.py`.

One file per setting: recipes/<model>/<task>/<method>.yaml, where method is gtpo-g8, gtpo-g12,
grpo-beta0-g8, grpo-beta0-g12, grpo-beta1e-6-g8, grpo-beta1e-6-g12 or sft; plus the offline CPU demo
recipes/smollm2/synthetic/{gtpo,grpo}.yaml (the first is what `gtpo train` runs without arguments) and the
two-step task's recipes/smollm2/two-step/{gtpo,grpo}.yaml.
How each Listing 1 line maps to TRL 1.16 is in docs/recipes.md. The YAML files are committed; this
script is how they were made, and tests/test_recipes.py checks that they are what it writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

MODELS = {
    # folder: (hub id, LoRA rank from Listing 1)
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B-Instruct", 64),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", 128),
}
TASKS = ("gsm8k", "math")
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Listing 1: adam_beta1/2 are 0.999999 for GTPO and 0.9/0.95 for GRPO and SFT.
ADAM_BETAS = {"gtpo": (0.999999, 0.999999), "grpo": (0.9, 0.95), "sft": (0.9, 0.95)}
# Listing 1 "beta: 0.0 - 0.04 - 10e-6 (for GRPO)"; the paper's runs compare 0 and 1e-6 (Sec. 6).
GRPO_BETAS = {"beta0": 0.0, "beta1e-6": 1.0e-6}
GROUP_SIZES = (8, 12)


def model_block(model: str) -> dict:
    hub_id, rank = MODELS[model]
    return {
        "model_name_or_path": hub_id,
        "dtype": "bfloat16",
        "load_in_4bit": True,
        "use_peft": True,
        "lora_r": rank,
        "lora_alpha": rank,  # not in Listing 1: alpha = rank, as in Unsloth's GRPO examples
        "lora_dropout": 0.0,  # not in Listing 1: Unsloth's default
        "lora_target_modules": TARGET_MODULES,
    }


def common_block(method: str) -> dict:
    beta1, beta2 = ADAM_BETAS[method]
    return {
        "learning_rate": 1.0e-6,
        "adam_beta1": beta1,
        "adam_beta2": beta2,
        "weight_decay": 0.1,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.005,  # Listing 1 warmup_ratio; transformers 5 reads a float < 1 as a ratio
        "optim": "paged_adamw_8bit",
        "max_grad_norm": 0.1,
        "gradient_accumulation_steps": 1,
        "num_train_epochs": 1,
        "seed": 3407,
        "logging_steps": 1,
        "save_steps": 500,
        "activation_checkpointing": True,
        "report_to": "none",  # the paper used wandb: --report_to wandb (or trackio, tensorboard)
    }


def rl_recipe(model: str, task: str, algorithm: str, group: int, beta: float) -> dict:
    return {
        **model_block(model),
        "task": task,
        "split": "train",
        "few_shot": 0,  # the paper's prompt: system prompt and question only (Sec. 16.1)
        "reward_funcs": ["format", "accuracy"],
        "algorithm": algorithm,
        "beta": beta,
        "num_generations": group,
        # Listing 1's per_device_train_batch_size 1 is one prompt; TRL counts completions, so one prompt's
        # group of G completions per device and step is per_device_train_batch_size = G.
        "per_device_train_batch_size": group,
        "num_iterations": 1,
        # Listing 1: max_seq_length 5500, max_prompt_length 4000 -> at most 1500 completion tokens.
        "max_completion_length": 1500,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.4,  # Listing 1; takes effect with --use_vllm true
        **common_block(algorithm),
    }


def sft_recipe(model: str, task: str) -> dict:
    return {
        **model_block(model),
        "task": task,
        "split": "train",
        "few_shot": 0,
        "per_device_train_batch_size": 1,
        "max_length": 5500,  # Listing 1 max_seq_length
        **common_block("sft"),
    }


# The offline CPU tasks and their few-shot counts: synthetic (one step, the default run's) and two-step (the task of
# study G, whose completions share right first steps; its two worked examples, gtpo.tasks.two_step).
SMOLLM2_TASKS = {"synthetic": 1, "two-step": 2}


def smollm2_recipe(algorithm: str, task: str = "synthetic") -> dict:
    """The offline CPU demo on ``task``; `gtpo train` without arguments runs the synthetic gtpo one
    (gtpo.cli.arguments.DEFAULT_TRAIN_RECIPE). The two-step recipes differ from it in the task and few_shot only."""
    from gtpo.cli.arguments import DEFAULT_TRAIN_RECIPE

    recipe = dict(DEFAULT_TRAIN_RECIPE)
    recipe["task"] = task
    recipe["few_shot"] = SMOLLM2_TASKS[task]
    recipe["algorithm"] = algorithm
    recipe["run_name"] = f"smollm2-{task}-{algorithm}"
    if algorithm == "grpo":
        recipe.pop("initial_entropy_prompts")  # GTPO's ⟨H⟩_ini; no meaning for GRPO
    return recipe


def all_recipes() -> dict[str, tuple[str, dict]]:
    """relative path -> (header comment, recipe)."""
    recipes = {}
    for model in MODELS:
        for task in TASKS:
            for group in GROUP_SIZES:
                name = f"{model}/{task}/gtpo-g{group}.yaml"
                recipe = {"run_name": f"{model}-{task}-gtpo-g{group}", **rl_recipe(model, task, "gtpo", group, 0.0)}
                recipes[name] = (f"GTPO, {MODELS[model][0]} on {task.upper()}, G = {group}", recipe)
                for tag, beta in GRPO_BETAS.items():
                    name = f"{model}/{task}/grpo-{tag}-g{group}.yaml"
                    recipe = {
                        "run_name": f"{model}-{task}-grpo-{tag}-g{group}",
                        **rl_recipe(model, task, "grpo", group, beta),
                    }
                    recipes[name] = (
                        f"GRPO (beta = {beta:g}), {MODELS[model][0]} on {task.upper()}, G = {group}",
                        recipe,
                    )
            recipes[f"{model}/{task}/sft.yaml"] = (
                f"SFT baseline, {MODELS[model][0]} on {task.upper()} gold solutions (run with `gtpo sft`)",
                {"run_name": f"{model}-{task}-sft", **sft_recipe(model, task)},
            )
    for algorithm in ("gtpo", "grpo"):
        recipes[f"smollm2/synthetic/{algorithm}.yaml"] = (
            f"Offline CPU demo: SmolLM2-135M-Instruct, synthetic arithmetic, {algorithm.upper()}, ~6.5 min on 2 cores"
            + (" (what `gtpo train` runs without arguments)" if algorithm == "gtpo" else ""),
            smollm2_recipe(algorithm),
        )
        recipes[f"smollm2/two-step/{algorithm}.yaml"] = (
            f"Offline CPU study task: SmolLM2-135M-Instruct, two-step arithmetic ('What is 7 + 5 - 3?'), "
            f"{algorithm.upper()}",
            smollm2_recipe(algorithm, "two-step"),
        )
    return recipes


def render(header: str, recipe: dict) -> str:
    command = "gtpo sft" if header.startswith("SFT") else "gtpo train"
    source = (
        "Settings measured on a 2-core CPU (README, 'The offline default run')"
        if recipe["model_name_or_path"] == "smollm2"
        else "Paper: arXiv 2508.03772, Listing 1; mapping to TRL 1.16 in docs/recipes.md"
    )
    lines = [
        f"# {header}.",
        f"# {source}. Written by recipes/generate.py.",
        f"# Run: {command} --config <this file> [--KEY VALUE ...]",
    ]
    body = yaml.safe_dump(recipe, sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(lines) + "\n" + body


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for relative, (header, recipe) in all_recipes().items():
        path = HERE / relative
        text = render(header, recipe)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(relative)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if stale:
        print("out of date (run python recipes/generate.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
