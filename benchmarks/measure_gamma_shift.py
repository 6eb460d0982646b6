"""How often the default γ realization (A' = A − γ⟨H⟩_i, ⟨H⟩ detached) updates all-equal-reward groups
and flips a positive advantage negative, in a short real run.

    python benchmarks/measure_gamma_shift.py --model smollm2 --task synthetic --steps 8 --temperature 0.7

Trains GTPO with its defaults (filter `auto`, γ = 0.1, temperature-1 entropy) and records, for every
micro-batch the loss sees, each row's TRL advantage A, the advantage the loss uses A' (filter δ and shift),
and the group statistics of the generation batch. Prints one summary line per quantity.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 or tiny")
    parser.add_argument("--task", default="synthetic", help="synthetic (offline), or gsm8k with --source")
    parser.add_argument("--source", default=None, help="e.g. ../shared/data/gsm8k/train.jsonl")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--completion-length", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    options = parser.parse_args(argv)

    import torch

    from gtpo import GTPOConfig, GTPOTrainer, core
    from gtpo.models import load_model, load_tokenizer
    from gtpo.tasks.registry import load_task
    from gtpo.tasks.rewards import get_reward_funcs

    rows = {
        "equal_groups": 0,
        "groups": 0,
        "zero_rows": 0,
        "zero_rows_updated": 0,
        "positive": 0,
        "flipped": 0,
        "kept_nonzero": 0,
    }

    class Measuring(GTPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            signs = (
                core.advantage_signs(output["advantages"], self.num_generations)
                if hasattr(core, "advantage_signs")
                else torch.sign(output["advantages"])
            )
            groups = signs.reshape(-1, self.num_generations)
            rows["groups"] += groups.shape[0]
            rows["equal_groups"] += int((groups == 0).all(dim=1).sum())
            return output

        def _loss_advantages(self, advantages, entropies, mask):
            used = super()._loss_advantages(advantages, entropies, mask)
            zero = advantages.abs() <= 1e-6 * max(1.0, float(advantages.abs().max()))
            rows["zero_rows"] += int(zero.sum())
            rows["zero_rows_updated"] += int((zero & (used != 0)).sum())
            positive = (advantages > 0) & ~zero
            rows["positive"] += int(positive.sum())
            rows["flipped"] += int((positive & (used < 0)).sum())
            rows["kept_nonzero"] += int((~zero & (used != 0)).sum())
            return used

    model = load_model(options.model) if options.model != "tiny" else None
    tokenizer = load_tokenizer(options.model)
    if model is None:
        from gtpo.models import tiny_model_dir

        model = str(tiny_model_dir())
    dataset = load_task(options.task, "train", options.source, num_examples=options.prompts * options.steps + 16)
    peft_config = None
    if options.model == "smollm2":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=16,
            lora_alpha=32,
            task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
    args = GTPOConfig(
        output_dir=tempfile.mkdtemp(prefix="gamma-shift-"),
        per_device_train_batch_size=options.prompts * options.generations,
        num_generations=options.generations,
        max_completion_length=options.completion_length,
        temperature=options.temperature,
        max_steps=options.steps,
        learning_rate=2e-4,
        initial_entropy_prompts=16,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        disable_tqdm=True,
        use_cpu=True,
        gradient_checkpointing=False,
    )
    trainer = Measuring(
        model=model,
        reward_funcs=get_reward_funcs(("format", "accuracy")),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    print(
        f"model {options.model}, {options.task}, {options.steps} steps x {options.prompts} prompts x "
        f"G={options.generations}, temperature {options.temperature}, ⟨H⟩_ini {trainer.initial_entropy:.3f} nats"
    )
    print(f"groups with all-equal rewards: {rows['equal_groups']}/{rows['groups']}")
    print(f"rows with A=0 that the loss updates (A'≠0): {rows['zero_rows_updated']}/{rows['zero_rows']}")
    print(f"rows with A>0 whose A' < 0 (sign flipped): {rows['flipped']}/{rows['positive']}")
    logs = [log for log in trainer.state.log_history if "gtpo/mean_entropy" in log]
    print(
        "per step: reward "
        + " ".join(f"{log['reward']:.2f}" for log in logs)
        + "; frac_reward_zero_std "
        + " ".join(f"{log['frac_reward_zero_std']:.2f}" for log in logs)
        + "; gtpo/mean_entropy "
        + " ".join(f"{log['gtpo/mean_entropy']:.3f}" for log in logs)
        + "; entropy (sampling) "
        + " ".join(f"{log['entropy']:.3f}" for log in logs)
        + "; gtpo/sign_flipped_frac "
        + " ".join(f"{log.get('gtpo/sign_flipped_frac', float('nan')):.3f}" for log in logs)
    )


if __name__ == "__main__":
    main()
