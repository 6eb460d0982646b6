"""The one-line swap stays exact when `generate` is not transformers' own, and a GRPO run says which GTPO settings
it ignores.

Invariants: the fast path replaces TRL's call of ``model.generate`` only where that call would reach transformers'
`GenerationMixin.generate` as defined (a patch on the class, as TRL's own `test_train_with_mask_truncated_completions`
makes with unittest.mock, sends generation to TRL's path, so the patched completions are the ones trained on);
PEFT's `PeftModelForCausalLM.generate` is looked through to its base model, so the default LoRA recipe keeps the
fast path; and with algorithm='grpo' every GTPO-only field set away from its default is named once in a warning,
while the defaults say nothing.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))  # trainer_helpers

GENERATE = "transformers.generation.utils.GenerationMixin.generate"


def test_transformers_own_generate_takes_the_fast_path_a_patched_one_does_not(tiny_model_path):
    from gtpo.models import load_model
    from gtpo.trainer.generation import generate_blocker

    model = load_model(tiny_model_path)
    assert generate_blocker(model) is None
    with patch(GENERATE, side_effect=lambda **kwargs: None):
        why = generate_blocker(model)
    assert why is not None and "not transformers' GenerationMixin.generate" in why
    assert generate_blocker(model) is None  # the patch undone, the fast path is back
    model.generate = lambda **kwargs: None  # a patch on the instance
    assert "patched on the instance" in generate_blocker(model)


def test_a_peft_policy_is_looked_through_to_its_base_models_generate(tiny_model_path):
    """The default LoRA recipe (a `PeftModelForCausalLM` around a transformers model) keeps the fast path; a patch
    on the base class is still seen through the wrapper."""
    from peft import LoraConfig, PeftModelForCausalLM, get_peft_model

    from gtpo.models import load_model
    from gtpo.trainer.generation import generate_blocker

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(load_model(tiny_model_path), lora)
    assert isinstance(model, PeftModelForCausalLM)
    assert generate_blocker(model) is None
    with patch(GENERATE, side_effect=lambda **kwargs: None):
        assert "not transformers' GenerationMixin.generate" in generate_blocker(model)
    with patch("peft.PeftModelForCausalLM.generate", side_effect=lambda **kwargs: None):
        assert "not PEFT's own" in generate_blocker(model)


def _trainer(tiny_model_path, output_dir, **overrides):
    from gtpo import GTPOConfig, GTPOTrainer
    from trainer_helpers import make_dataset, table_reward

    args = dict(
        output_dir=output_dir, per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=1, report_to=[], use_cpu=True, bf16=False, seed=0, disable_tqdm=True, initial_entropy=1.0,
        learning_rate=0.1, save_strategy="no",
    )  # fmt: skip
    args.update(overrides)
    return GTPOTrainer(
        model=tiny_model_path, reward_funcs=table_reward, args=GTPOConfig(**args), train_dataset=make_dataset(4)
    )


def test_patched_generate_gives_the_completions_trained_on(tiny_model_path, tmp_path, caplog):
    """As TRL's `test_train_with_mask_truncated_completions`: `generate` patched to return completions that end
    (EOS within max_completion_length), mask_truncated_completions=True. The completions the loss sees are the
    patched ones (cut after their EOS, as TRL cuts), none is masked as truncated, and the weights change."""
    trainer = _trainer(tiny_model_path, str(tmp_path / "out"), mask_truncated_completions=True)
    eos, pad = trainer.eos_token_ids[0], trainer._tokenizer.pad_token_id
    # Four completions of different lengths, each ending with EOS (then padding, as generate pads ended rows).
    planned = [[5, 6, eos], [7, 8, 9, 10, eos], [11, eos], [12, 13, 14, 15, 16, 17, eos]]
    width = 8

    def fake_generate(**kwargs):
        prompt = kwargs["input_ids"]
        rows = [planned[i % len(planned)] for i in range(prompt.shape[0])]
        tail = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=prompt.device)
        return torch.cat([prompt, tail], dim=1)

    seen = []
    original = trainer._compute_loss

    def spying(model, inputs):
        seen.append((inputs["completion_ids"].clone(), inputs["completion_mask"].clone()))
        return original(model, inputs)

    trainer._compute_loss = spying
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with (
        caplog.at_level(logging.INFO, logger="gtpo.trainer.generation"),
        patch(GENERATE, side_effect=fake_generate) as mocked,
    ):
        trainer.train()
    assert mocked.call_count >= 1
    assert any("TRL's path" in r.getMessage() and "generate" in r.getMessage() for r in caplog.records)
    assert seen
    for ids, mask in seen:
        for row, row_mask in zip(ids.tolist(), mask.tolist(), strict=True):
            kept = [t for t, m in zip(row, row_mask, strict=True) if m]
            assert kept in planned  # a planned completion, whole: not truncated, so not masked
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert "model.embed_tokens.weight" in changed


def test_the_default_lora_recipe_keeps_the_fast_path(tiny_model_path, tmp_path, monkeypatch):
    """A LoRA policy (peft_config) generates through `gtpo.decoding.sampling.decode`, not TRL's `generate`."""
    from peft import LoraConfig

    import gtpo.trainer.generation as generation
    from gtpo import GTPOConfig, GTPOTrainer
    from trainer_helpers import make_dataset, table_reward

    calls = []
    real = generation.decode
    monkeypatch.setattr(generation, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = GTPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=1, report_to=[], use_cpu=True, bf16=False, seed=0, disable_tqdm=True, initial_entropy=1.0,
        save_strategy="no",
    )  # fmt: skip
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = GTPOTrainer(
        model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset(4), peft_config=lora
    )
    from trl import GRPOTrainer

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", lambda *a, **k: pytest.fail("TRL's path ran for LoRA"))
    trainer.train()
    assert calls


def _config(**overrides):
    from gtpo import GTPOConfig

    return GTPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to=[], **overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(conflict_guard=True, entropy_gamma=0.5, entropy_filter="always"),
        dict(conflict_positive_weight=1.0),
        dict(entropy_threshold=0.5, initial_entropy=2.0, logprob_temperature="model"),
    ],
)
def test_grpo_names_the_gtpo_settings_it_ignores(overrides, caplog):
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.config"):
        _config(algorithm="grpo", **overrides)
    lines = [r.getMessage() for r in caplog.records if "ignores GTPO's settings" in r.getMessage()]
    assert len(lines) == 1
    for name, value in overrides.items():
        assert f"{name}={value!r}" in lines[0]


def test_grpo_with_gtpos_defaults_and_gtpo_itself_log_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.config"):
        _config(algorithm="grpo")
        _config(algorithm="gtpo", entropy_gamma=0.5)
    assert not [r for r in caplog.records if "ignores GTPO's settings" in r.getMessage()]


def test_the_ignored_list_is_every_gtpo_only_field():
    """Derived from the config: every field GTPOConfig adds to GRPOConfig is either GTPO-only (and named when set) or
    listed as acting under both algorithms."""
    from dataclasses import fields

    from trl import GRPOConfig

    from gtpo import GTPOConfig
    from gtpo.trainer.config_checks import BOTH_ALGORITHMS, gtpo_only_fields

    own = {f.name for f in fields(GTPOConfig)} - {f.name for f in fields(GRPOConfig)}
    only = {f.name for f in gtpo_only_fields(GTPOConfig)}
    assert only == own - BOTH_ALGORITHMS and own >= BOTH_ALGORITHMS
    assert {"conflict_guard", "entropy_gamma", "entropy_filter", "conflict_positive_weight"} <= only
