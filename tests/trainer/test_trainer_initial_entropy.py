"""⟨H⟩_ini (Eq. 6) is measured the way training samples: TRL's generation entry point (here a `rollout_func`),
`mask_truncated_completions` applied, the model in eval mode and back in train mode after.

The rollout returns fixed completions, so the expected ⟨H⟩_ini is recomputed independently: a plain forward
of the model (full logits, temperature 1, eval mode) on the same ids, token-mean entropy per completion,
averaged over the completions that count.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from test_trainer import settings  # noqa: E402

from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402
from trainer_helpers import make_dataset, table_reward  # noqa: E402

# Completion texts by prompt index (mod 4): "!" endings are cut before EOS (truncated), the others end with EOS.
ENDINGS = ["The answer is four.", "We add", "It is seven.", "so the sum is"]


class CountingRollout:
    """A rollout_func (TRL's signature) that counts its calls and records the model's mode when called."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls, self.training_flags, self.rows, self.batch_sizes = tokenizer, 0, [], [], []

    def __call__(self, prompts, trainer):
        self.calls += 1
        self.batch_sizes.append(len(prompts))
        self.training_flags.append(trainer.model.training)
        prompt_ids, completion_ids = [], []
        for messages in prompts:
            index = int(messages[-1]["content"].split()[2])  # "What is {i} + ..."
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            text = ENDINGS[index % 4]
            completion = self.tokenizer.encode(text, add_special_tokens=False)
            if index % 2 == 0:  # even rows end with EOS, odd rows are truncated (no EOS)
                completion = completion + [self.tokenizer.eos_token_id]
            prompt_ids.append(list(ids))
            completion_ids.append(completion)
            self.rows.append((list(ids), completion, index % 2 == 0))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


@pytest.fixture(scope="module")
def sharp_model(tmp_path_factory, tiny_model_path) -> str:
    """The tiny model with a 20x LM head: far from uniform, so completions' entropies differ clearly."""
    path = tmp_path_factory.mktemp("sharp")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(path)
    return str(path)


def _plain_entropy(model_path, prompt_ids, completion_ids) -> float:
    """⟨H⟩_i from full logits of a plain forward in eval mode, temperature 1."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    ids = torch.tensor([prompt_ids + completion_ids])
    k = len(completion_ids)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -k - 1 : -1].double(), dim=-1)
    return (-(logp.exp() * logp).sum(-1)).mean().item()


def _measure(model_path, tmp_path, n=6, **overrides):
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rollout = CountingRollout(tokenizer)
    args = GTPOConfig(**settings(tmp_path, initial_entropy_prompts=n, per_device_train_batch_size=4, **overrides))
    trainer = GTPOTrainer(
        model=model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset(), rollout_func=rollout
    )
    trainer.model.train()  # as during training
    trainer._measure_initial_entropy()
    return trainer, rollout


def _expected(model_path, rollout, only_finished: bool, n: int = 6) -> float:
    """Over the first n rows: the n prompts measured; rows after them pad the last call (weight 0)."""
    rows = rollout.rows[:n]
    values = [_plain_entropy(model_path, p, c) for p, c, finished in rows if finished or not only_finished]
    return sum(values) / len(values)


def test_initial_entropy_goes_through_rollout_func_and_masks_truncated_completions(tmp_path, sharp_model):
    trainer, rollout = _measure(sharp_model, tmp_path, temperature=0.7, mask_truncated_completions=True)
    # 6 prompts, one completion each, in calls of 4 rows (a training generation batch: 4 x 1 step); the
    # second call is padded with prompts 0 and 1 again, which count for nothing.
    assert rollout.calls == 2 and rollout.batch_sizes == [4, 4] and len(rollout.rows) == 8
    assert sum(finished for *_, finished in rollout.rows[:6]) == 3
    masked = trainer.initial_entropy
    assert masked == pytest.approx(_expected(sharp_model, rollout, only_finished=True), abs=1e-4)
    assert trainer._metrics["eval"] == {} and trainer._metrics["train"] == {}  # generation metrics discarded
    assert trainer.num_generations == 4
    # The same rollout with mask_truncated_completions off: every completion counts, and the value differs.
    trainer.mask_truncated_completions, rollout.rows = False, []
    trainer._measure_initial_entropy()
    assert rollout.calls == 4
    assert trainer.initial_entropy == pytest.approx(_expected(sharp_model, rollout, only_finished=False), abs=1e-4)
    assert abs(trainer.initial_entropy - masked) > 1e-3


def test_initial_entropy_is_measured_in_eval_mode_without_dropout_and_train_mode_is_restored(tmp_path, sharp_model):
    dropout_model = tmp_path / "tiny-dropout"
    shutil.copytree(sharp_model, dropout_model)
    config = AutoConfig.from_pretrained(dropout_model)
    config.attention_dropout = 0.5
    config.save_pretrained(dropout_model)
    trainer, rollout = _measure(str(dropout_model), tmp_path)
    assert rollout.training_flags == [False, False]  # eval mode while sampling
    assert trainer.model.training  # and train mode again after
    # Deterministic: equal to the eval-mode plain forward (dropout 0.5 in train mode would change it).
    assert trainer.initial_entropy == pytest.approx(_expected(str(dropout_model), rollout, False), abs=1e-4)
    trainer.model.train()
    ids = torch.tensor([rollout.rows[0][0] + rollout.rows[0][1]])
    with torch.no_grad():  # the control: this model's dropout is live in train mode
        a, b = trainer.model(input_ids=ids).logits, trainer.model(input_ids=ids).logits
    assert (a - b).abs().max() > 1e-4


def test_all_completions_truncated_and_masked_falls_back_to_them_with_a_warning(tmp_path, sharp_model, caplog):
    class AllTruncated(CountingRollout):
        def __call__(self, prompts, trainer):
            output = super().__call__(prompts, trainer)
            eos = self.tokenizer.eos_token_id
            output["completion_ids"] = [[t for t in ids if t != eos] or [5] for ids in output["completion_ids"]]
            self.rows = [(p, [t for t in c if t != eos] or [5], False) for p, c, _ in self.rows]
            return output

    tokenizer = AutoTokenizer.from_pretrained(sharp_model)
    rollout = AllTruncated(tokenizer)
    args = GTPOConfig(
        **settings(tmp_path, initial_entropy_prompts=4, per_device_train_batch_size=4, mask_truncated_completions=True)
    )
    trainer = GTPOTrainer(
        model=sharp_model, reward_funcs=table_reward, args=args, train_dataset=make_dataset(), rollout_func=rollout
    )
    with caplog.at_level("WARNING", logger="gtpo.trainer.initial_entropy"):
        trainer._measure_initial_entropy()
    assert "every sampled completion was truncated" in caplog.text
    assert trainer.initial_entropy == pytest.approx(_expected(sharp_model, rollout, only_finished=False), abs=1e-4)
