"""`GTPOConfig(authors_code=True)`: the authors' released arithmetic, bugs included (issue 38, item 7).

Each of its three reproduced bugs against a hand-derived or brute-force value: the `reference` divisor
max(|M^fw|, |M^bw|) instead of the union's size, the entropy with p clamped at 1e-6 inside the log, and the loss's
log-probs at temperature 1 while sampling at 0.9. The rest of the preset is settings the config already had.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import settings  # noqa: E402
from test_trainer_entropy import _plain_forward, _recorded_step  # noqa: E402

from gtpo import GTPOConfig  # noqa: E402
from gtpo.trainer.config import AUTHORS_CODE  # noqa: E402
from loss_helpers import keyword_loss  # noqa: E402


def test_the_preset_sets_every_field_of_the_authors_code(tmp_path):
    """authors_code=True sets the released code's combination (GTPOConfig's docstring lists the settings part) and
    overrides what was passed; on-policy steps are required, since only the loss's log-probs move to temperature 1."""
    args = GTPOConfig(**settings(tmp_path, authors_code=True, conflict_combine="union", temperature=1.0))
    assert {name: getattr(args, name) for name in AUTHORS_CODE} == AUTHORS_CODE
    assert (args.conflict_count, args.entropy_clamp, args.logprob_temperature, args.temperature) == (
        "max",
        1e-6,
        "model",
        0.9,
    )
    assert "`authors_code=True`" in GTPOConfig.__doc__  # the config's docstring names the preset with its parts
    for bad, message in (
        (dict(num_iterations=2), "needs on-policy steps"),
        (dict(beta=0.04), "the reference log-probs would stay tempered"),
    ):
        with pytest.raises(ValueError, match=message):
            GTPOConfig(**settings(tmp_path, authors_code=True, **bad))


def test_max_conflict_count_divides_by_the_longer_span_not_the_union():
    """One completion (A = +1) of 8 tokens with a forward span of 3 and a disjoint backward span of 2: the union has 5
    positions, the authors' count max(3, 2) = 3. `reference` divides its token mean by that count, so the two
    losses differ by the factor 5/3 (λ is the same in both)."""
    mask = torch.ones(1, 8, dtype=torch.bool)
    fw = torch.zeros(1, 8, dtype=torch.bool)
    fw[0, :3] = True
    bw = torch.zeros(1, 8, dtype=torch.bool)
    bw[0, -2:] = True
    logps = torch.full((1, 8), -0.5)
    common = dict(forward_span=fw, backward_span=bw, gtpo_aggregation="reference", entropy_filter="never", gamma=0.0)
    union, _ = keyword_loss(logps, mask, torch.tensor([1.0]), **common)
    maximum, _ = keyword_loss(logps, mask, torch.tensor([1.0]), conflict_count="max", **common)
    assert union.item() != 0 and maximum.item() / union.item() == pytest.approx(5 / 3)


def test_clamped_entropy_of_the_lm_head_is_the_brute_force_sum():
    """lm_head.clamped_entropy (two passes over vocabulary tiles) against −Σ p ln max(p, 1e-6) on full float64 logits,
    over a vocabulary of several tiles (the clamped sum is below the exact H wherever tokens fall under the floor)."""
    from gtpo.forward import lm_head

    torch.manual_seed(0)
    hidden, weight = torch.randn(5, 16), torch.randn(300, 16) * 3
    clamped = lm_head.clamped_entropy(hidden, weight, None, 1e-6, chunk_size=64)
    logp = torch.log_softmax((hidden @ weight.t()).double(), dim=-1)
    p = logp.exp()
    brute = -(p * torch.log(p.clamp(min=1e-6))).sum(-1)
    exact = -(p * logp).sum(-1)
    torch.testing.assert_close(clamped.double(), brute, atol=1e-5, rtol=1e-5)
    # the control, in float64: every row has tokens under the floor, so the clamped sum is below the exact H
    assert bool((p < 1e-6).any(dim=-1).all()) and bool((brute < exact).all())


def test_the_preset_scores_at_temperature_one_with_the_clamped_entropy(tmp_path, tiny_model_path, monkeypatch):
    """A training step with authors_code=True samples at 0.9, but the loss receives log-probs at temperature 1 and the
    clamped temperature-1 entropy, each equal to a plain forward's; the control: the tempered log-probs differ."""
    seen, _ = _recorded_step(tmp_path, tiny_model_path, monkeypatch, authors_code=True)
    mask = seen["mask"].bool()
    _, logp_one = _plain_forward(tiny_model_path, seen, 1.0)
    _, logp_tempered = _plain_forward(tiny_model_path, seen, 0.9)
    torch.testing.assert_close(seen["logps"][mask].double(), logp_one[mask], atol=1e-4, rtol=1e-4)
    assert (logp_one - logp_tempered)[mask].abs().max() > 1e-2
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    ids = torch.cat([seen["prompt_ids"], seen["completion_ids"]], dim=1)
    attention = torch.cat([seen["prompt_mask"], seen["mask"]], dim=1)
    k = seen["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -k - 1 : -1].double()
    p = torch.softmax(logits, dim=-1)
    clamped = -(p * torch.log(p.clamp(min=1e-6))).sum(-1)  # (B, K)
    torch.testing.assert_close(seen["entropy"][mask].double(), clamped[mask], atol=1e-4, rtol=1e-4)
