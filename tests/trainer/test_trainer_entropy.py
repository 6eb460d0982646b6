"""Which entropy GTPO uses (Sec. 4.2): the model's own next-token distribution, whatever the sampling temperature.

Every check recomputes the entropy independently, from a plain forward of the model (full logits, no fused
head) on the very ids the trainer scored, and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from test_trainer import FixedGTPO, settings  # noqa: E402

from gtpo import GTPOConfig, core  # noqa: E402
from trainer_helpers import make_dataset, table_reward  # noqa: E402


def _recorded_step(tmp_path, tiny_model_path, monkeypatch, **overrides):
    """One training step; returns what `core.gtpo_loss` received, the scored ids, and the trainer's logs."""
    seen = {}
    original = core.gtpo_loss

    def recording(inputs, settings, **kwargs):  # the trainer calls gtpo_loss(LossInputs, LossSettings)
        seen.update(logps=inputs.per_token_logps.detach(), mask=inputs.completion_mask)
        seen.update(entropy=inputs.token_entropy.detach())
        return original(inputs, settings, **kwargs)

    class Recording(FixedGTPO):
        def _compute_loss(self, model, inputs):
            seen["prompt_ids"], seen["prompt_mask"] = inputs["prompt_ids"], inputs["prompt_mask"]
            seen["completion_ids"] = inputs["completion_ids"]
            return super()._compute_loss(model, inputs)

    monkeypatch.setattr(core, "gtpo_loss", recording)
    args = GTPOConfig(**settings(tmp_path, initial_entropy=1.0, learning_rate=0.0, **overrides))
    trainer = Recording(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset())
    trainer.train()
    return seen, trainer.state.log_history[0]


def _plain_forward(tiny_model_path, seen, temperature):
    """Entropy and sampled-token log-prob of the completion tokens from full logits / temperature."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    ids = torch.cat([seen["prompt_ids"], seen["completion_ids"]], dim=1)
    attention = torch.cat([seen["prompt_mask"], seen["mask"]], dim=1)
    k = seen["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -k - 1 : -1].double()  # (B, K, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)  # (B, K)
    token_logp = logp.gather(-1, seen["completion_ids"].unsqueeze(-1)).squeeze(-1)  # (B, K)
    return entropy, token_logp


def test_gtpo_entropy_is_the_temperature_one_entropy_while_logps_stay_tempered(tmp_path, tiny_model_path, monkeypatch):
    seen, log = _recorded_step(tmp_path, tiny_model_path, monkeypatch, temperature=0.7)
    mask = seen["mask"].bool()
    untempered, _ = _plain_forward(tiny_model_path, seen, 1.0)
    tempered, tempered_logp = _plain_forward(tiny_model_path, seen, 0.7)
    assert (untempered - tempered)[mask].abs().min() > 1e-2  # the control: the two entropies differ here
    torch.testing.assert_close(seen["entropy"][mask].double(), untempered[mask], atol=1e-4, rtol=1e-4)
    # Log-probs (and so importance ratios) are TRL's: those of the sampling distribution.
    torch.testing.assert_close(seen["logps"][mask].double(), tempered_logp[mask], atol=1e-4, rtol=1e-4)
    # gtpo/mean_entropy is the untempered ⟨H⟩ (Eq. 6), TRL's `entropy` the sampling distribution's token mean.
    per_row = (untempered * mask).sum(-1) / mask.sum(-1)
    assert log["gtpo/mean_entropy"] == pytest.approx(per_row.mean().item(), abs=1e-4)
    assert log["entropy"] == pytest.approx(tempered[mask].mean().item(), abs=1e-4)


def test_sampling_option_keeps_the_entropy_of_the_tempered_distribution(tmp_path, tiny_model_path, monkeypatch):
    seen, log = _recorded_step(tmp_path, tiny_model_path, monkeypatch, temperature=0.7, entropy_temperature="sampling")
    mask = seen["mask"].bool()
    tempered, _ = _plain_forward(tiny_model_path, seen, 0.7)
    torch.testing.assert_close(seen["entropy"][mask].double(), tempered[mask], atol=1e-4, rtol=1e-4)
    assert log["entropy"] == pytest.approx(tempered[mask].mean().item(), abs=1e-4)


def test_differentiable_entropy_term_gets_the_untempered_entropy_gradient(tiny_model_path):
    """entropy_term='differentiable': the gradient of Σ H flows through the temperature-1 pass of the LM head."""
    from trl.trainer.utils import add_fused_lm_head

    from gtpo.forward import untempered

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))  # as GRPOTrainer patches it
    ids = torch.tensor([[5, 9, 17, 33, 2, 40, 41]])
    labels = ids.clone()
    labels[:, :-3] = -100  # score the last 3 tokens, as TRL does for a completion
    with untempered.untempered_entropy(True, differentiable=True):
        entropy = model(input_ids=ids, labels=labels, fused_lm_head=True).entropy[:, -3:]
    entropy.sum().backward()
    fused = model.lm_head.weight.grad.clone()
    model.zero_grad()
    logits = model(input_ids=ids).logits[:, -4:-1]  # plain forward, temperature 1
    logp = torch.log_softmax(logits.double(), dim=-1)
    (-(logp.exp() * logp).sum()).backward()
    torch.testing.assert_close(fused.double(), model.lm_head.weight.grad.double(), atol=1e-5, rtol=1e-4)


def test_clip_ratios_count_by_the_sign_of_the_shifted_advantage_the_loss_uses(tmp_path):
    """A' = A − γ⟨H⟩ (Eq. 7, authors' realization): with γ=0.1 and ⟨H⟩=1, A=0.05 becomes A'=−0.05, so a ratio
    below 1−ε counts as a low clip (the loss clips it as a negative row) and one above 1+ε does not."""
    from collections import defaultdict
    from types import SimpleNamespace

    from gtpo import core
    from gtpo.trainer import loss_options
    from gtpo.trainer.trainer import GTPOTrainer

    args = GTPOConfig(**settings(tmp_path, initial_entropy=1.0, entropy_gamma=0.1))  # ⟨H⟩_ini ≥ ln 2: no filter
    trainer = SimpleNamespace(  # the attributes the two methods read, on one process
        args=args,
        initial_entropy=1.0,
        epsilon_low=0.2,
        epsilon_high=0.2,
        _metrics={"train": defaultdict(list)},
        accelerator=SimpleNamespace(reduce=lambda t, reduction: t, gather=lambda t: t),
    )
    trainer._log_metrics = GTPOTrainer._log_metrics.__get__(trainer)
    advantages = torch.tensor([0.05, 0.05, -1.0, 0.5])
    mask = torch.ones(4, 3, dtype=torch.long)
    entropies = torch.ones(4, 3)
    logps = torch.zeros(4, 3)
    old = torch.tensor([0.5, -0.5, 0.0, -0.5]).unsqueeze(-1).expand(4, 3)  # ratios e^-0.5, e^0.5, 1, e^0.5
    # The trainer's own computation of A' (compute_loss): core.advantage_terms with the trainer's settings.
    inputs = core.LossInputs(entropies, mask, advantages, token_entropy=entropies)
    used = core.advantage_terms(inputs, loss_options.loss_settings(trainer)).advantages
    torch.testing.assert_close(used, torch.tensor([-0.05, -0.05, -1.1, 0.4]))
    trainer._log_metrics("train", {}, logps, old, entropies, mask, used)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    # Row 0: r=0.61 < 0.8 with A'<0 -> low; row 1: r=1.65 with A'<0 -> neither; row 3: r=1.65, A'>0 -> high.
    assert logged["clip_ratio/low_mean"] == pytest.approx(3 / 12)
    assert logged["clip_ratio/high_mean"] == pytest.approx(3 / 12)
    assert logged["clip_ratio/region_mean"] == pytest.approx(6 / 12)


@pytest.mark.parametrize("on_policy", [True, False], ids=["on-policy", "off-policy"])
def test_logged_metrics_over_two_ranks_are_the_pooled_formulas(tmp_path, on_policy):
    """`loss_options.log_metrics` sends every metric through one gather: TRL's token means (`entropy`, `clip_ratio/*`)
    must be the pooled sums of both ranks over the pooled token count, GTPO's `gtpo/*` the mean of the ranks' values,
    and a plain number (⟨H⟩_ini) its float32 value. Two ranks simulated: the gather returns this rank's row and the
    other rank's, recorded from a call on the other rank's micro-batch. On-policy, the clip ratios are 0 exactly."""
    from collections import defaultdict
    from types import SimpleNamespace

    from gtpo.trainer import loss_options

    rows = []

    def trainer_with(gather):
        return SimpleNamespace(
            epsilon_low=0.2, epsilon_high=0.2, _metrics={"train": defaultdict(list)},
            accelerator=SimpleNamespace(gather=gather),
        )  # fmt: skip

    generator = torch.Generator().manual_seed(0)

    def rank_inputs(tokens):
        logps = -torch.rand(2, tokens, generator=generator)
        old = None if on_policy else logps + 0.4 * torch.randn(2, tokens, generator=generator)
        mask = torch.ones(2, tokens, dtype=torch.long)
        mask[1, -1] = 0
        entropies, advantages = torch.rand(2, tokens, generator=generator), torch.tensor([0.5, -0.5])
        return logps, old, entropies, mask, advantages

    other, mine = rank_inputs(5), rank_inputs(3)
    metrics_other = {"gtpo/mean_lambda": torch.tensor(2.0), "gtpo/initial_entropy": 0.1}
    metrics_mine = {"gtpo/mean_lambda": torch.tensor(1.0), "gtpo/initial_entropy": 0.1}
    loss_options.log_metrics(trainer_with(lambda t: rows.append(t) or t), "train", metrics_other, *other)
    trainer = trainer_with(lambda t: torch.cat([t, rows[0]]))
    loss_options.log_metrics(trainer, "train", metrics_mine, *mine)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    def pooled(select):  # Σ over both ranks' valid tokens of select(...) / Σ valid tokens
        num = den = 0.0
        for logps, old, entropies, mask, advantages in (mine, other):
            ratio = torch.ones_like(logps) if old is None else torch.exp(logps - old)
            num += float((select(ratio, advantages[:, None], entropies) * mask).sum())
            den += float(mask.sum())
        return num / den

    assert logged["entropy"] == pytest.approx(pooled(lambda r, a, h: h), rel=1e-6)
    low = pooled(lambda r, a, h: ((r < 0.8) & (a < 0)).float())
    high = pooled(lambda r, a, h: ((r > 1.2) & (a > 0)).float())
    assert logged["clip_ratio/low_mean"] == pytest.approx(low, rel=1e-6)
    assert logged["clip_ratio/high_mean"] == pytest.approx(high, rel=1e-6)
    assert logged["clip_ratio/region_mean"] == pytest.approx(low + high, rel=1e-6)
    if on_policy:
        assert logged["clip_ratio/low_mean"] == logged["clip_ratio/high_mean"] == 0.0
    else:
        assert low > 0 or high > 0  # the off-policy case exercises the counts
    assert logged["gtpo/mean_lambda"] == 1.5  # the mean over ranks
    assert logged["gtpo/initial_entropy"] == float(torch.tensor(0.1, dtype=torch.float32))
