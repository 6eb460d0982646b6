"""Smoke run on a real model: SmolLM2-135M-Instruct (offline GGUF) with LoRA, the paper's prompt and rewards."""

from __future__ import annotations

import math

import pytest
from transformers import TrainerCallback

from gtpo import GTPOConfig, GTPOTrainer


class LogCollector(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


@pytest.fixture
def one_thread():
    """On a shared 2-core machine two intra-op threads that wait on each other make generation ~20x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_smollm2_lora_two_steps_with_paper_prompt_and_rewards(tmp_path, one_thread):
    from peft import LoraConfig

    from gtpo.models import load_model, load_tokenizer
    from gtpo.tasks.prompts import SYSTEM_PROMPT
    from gtpo.tasks.registry import load_task
    from gtpo.tasks.rewards import get_reward_funcs

    dataset = load_task("synthetic", "train", num_examples=8)
    assert dataset[0]["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    model, tokenizer = load_model("smollm2"), load_tokenizer("smollm2")
    args = GTPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=32,
        max_steps=2,
        learning_rate=1e-4,
        initial_entropy_prompts=2,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        seed=3407,
        disable_tqdm=True,
    )
    peft_config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        task_type="CAUSAL_LM",
    )
    collector = LogCollector()
    trainer = GTPOTrainer(
        model=model,
        reward_funcs=get_reward_funcs(("format", "accuracy")),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[collector],
    )
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    lora_after = dict(trainer.model.named_parameters())

    assert trainer.state.global_step == 2 and trainer.ref_model is None
    assert any(not (lora_after[n] == p).all() for n, p in lora_before.items())  # the adapter moved
    logs = [log for log in collector.logs if "loss" in log]
    assert len(logs) == 2
    for log in logs:
        assert {
            "rewards/format_reward/mean",
            "rewards/accuracy_reward/mean",
            "gtpo/mean_lambda",
            "gtpo/filtered_frac",
            "gtpo/initial_entropy",
        } <= log.keys()
        assert math.isfinite(log["loss"])
    assert 0 < trainer.initial_entropy < math.log(len(tokenizer))
