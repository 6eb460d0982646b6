"""GRPOConfig's loss options composed with GTPO (issue 21): delta, importance_sampling_level="sequence", a token or
sequence mask (top_entropy_quantile, off_policy_mask_threshold), beta > 0.

Two independent references:
- with λ = 1, no filter and γ = 0, GTPO's loss with an option is TRL 1.16's own GRPO loss with that option, in
  value and gradient (TRL's `GRPOTrainer._compute_loss` run on a stub, as in test_core_aggregation.py);
- with λ from conflict spans, δ and the entropy shift on, the loss equals a brute-force per-token computation of
  the formula docs/core.md writes down ("GTPO with more of GRPOConfig"), in plain Python floats.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch

from gtpo.core import conflict_weights

sys.path.insert(0, str(Path(__file__).parent))
from test_core_aggregation import EPS_HIGH, EPS_LOW, trl_compute_loss  # noqa: E402
from test_core_loss import entropy_batch, leaf_logps  # noqa: E402

from loss_helpers import keyword_loss  # noqa: E402

LN2 = math.log(2)
SAPO = (1.0, 1.05)  # TRL's default temperatures (positive, negative)
VESPO = (2.0, 3.0, 3.0, 2.0)  # TRL's defaults: k_pos, lambda_pos, k_neg, lambda_neg


def old_and_ref(logps, seed):
    g = torch.Generator().manual_seed(seed)
    old = logps.detach() + 0.3 * torch.randn(logps.shape, generator=g)
    ref = logps.detach() + 0.2 * torch.randn(logps.shape, generator=g)
    return old, ref


def trl_with(option: dict, logps, old, mask, adv, ref=None, entropy=None, loss_type="grpo"):
    """TRL's own loss with `option` set on its stub (delta, importance_sampling_level, beta, masks)."""
    from trl.trainer import grpo_trainer

    original = grpo_trainer.GRPOTrainer._compute_loss

    def patched(stub, model, inputs):
        stub.args.delta = option.get("delta")
        stub.args.use_bias_correction_kl = option.get("use_bias_correction_kl", False)
        stub.importance_sampling_level = option.get("importance_sampling_level", "token")
        stub.beta = option.get("beta", 0.0)
        stub.off_policy_mask_threshold = option.get("off_policy_mask_threshold")
        stub.top_entropy_quantile = option.get("top_entropy_quantile", 1.0)
        stub.args.sapo_temperature_pos, stub.args.sapo_temperature_neg = SAPO
        stub.args.vespo_k_pos, stub.args.vespo_lambda_pos, stub.args.vespo_k_neg, stub.args.vespo_lambda_neg = VESPO
        stub.get_gamma_weights = grpo_trainer.GRPOTrainer.get_gamma_weights
        stub.get_off_policy_mask = grpo_trainer.GRPOTrainer.get_off_policy_mask
        stub.get_high_entropy_mask = lambda e, m, threshold: high_entropy_mask(e, m, threshold)
        if entropy is not None:
            stub._get_per_token_logps_and_entropies = lambda *a, **k: (logps_in[0], entropy, None)
        if ref is not None:
            inputs["ref_per_token_logps"] = ref
        return original(stub, model, inputs)

    logps_in = [logps]
    grpo_trainer.GRPOTrainer._compute_loss, saved = patched, original
    try:
        return trl_compute_loss(loss_type, logps, old, mask, adv)
    finally:
        grpo_trainer.GRPOTrainer._compute_loss = saved


def high_entropy_mask(entropies, mask, threshold):
    """TRL's get_high_entropy_mask on one process: tokens at or above the `threshold` quantile of valid entropies."""
    valid = entropies[mask.bool()].float()
    cutoff = torch.quantile(valid, threshold)
    return ((entropies >= cutoff) & mask.bool()).float()


OPTIONS = {
    "delta": dict(delta=1.5),
    "sequence": dict(importance_sampling_level="sequence"),
    "beta": dict(beta=0.04),
    "beta with bias correction": dict(beta=0.04, use_bias_correction_kl=True),
    "off-policy mask": dict(off_policy_mask_threshold=0.05),
    "top entropy": dict(top_entropy_quantile=0.4),
}


def core_kwargs(option: dict, logps, ref, mask, adv, old, entropy):
    kwargs = dict(
        delta=option.get("delta"),
        importance_sampling_level=option.get("importance_sampling_level", "token"),
        beta=option.get("beta", 0.0),
        kl_bias_correction=option.get("use_bias_correction_kl", False),
        ref_per_token_logps=ref if option.get("beta") else None,
    )
    masks = []
    if "top_entropy_quantile" in option:
        masks.append(high_entropy_mask(entropy, mask, 1 - option["top_entropy_quantile"]))
    if "off_policy_mask_threshold" in option:
        kl = ((old - logps.detach()) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
        masks.append(((adv.unsqueeze(1) >= 0) | (kl <= option["off_policy_mask_threshold"])).float())
    if masks:
        kwargs["token_mask"] = masks[0] if len(masks) == 1 else masks[0] * masks[1]
    return kwargs


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_with_unit_weights_each_option_is_trls_own_loss_in_value_and_gradient(name):
    option = OPTIONS[name]
    mask, adv, _, _, entropy = entropy_batch(seed=21)
    logps = leaf_logps(mask, seed=22)
    old, ref = old_and_ref(logps, seed=23)
    if "off_policy_mask_threshold" in option:
        kl = ((old - logps.detach()) * mask).sum(-1) / mask.sum(-1)
        dropped = (adv < 0) & (kl > option["off_policy_mask_threshold"])
        assert 0 < dropped.sum() < (adv < 0).sum(), "the batch must drop some negative sequences and keep others"
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        old_per_token_logps=old,
        entropy_filter="never",
        gamma=0.0,
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
        **core_kwargs(option, logps, ref, mask, adv, old, entropy),
    )
    loss = loss / 2  # TRL's accumulation scaling on the stub (2 steps)
    trl_logps = logps.detach().clone().requires_grad_()
    expected = trl_with(option, trl_logps, old, mask, adv, ref=ref, entropy=entropy)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(logps.grad, trl_logps.grad)


def brute_force(logps, old, mask, a_used, lam, *, delta=None, level="token", token_mask=None, ref=None, beta=0.0,
                bias=False, surrogate="clip", per_completion="mean", phi=None) -> float:  # fmt: skip
    """docs/core.md's per-token formula, written out with Python floats, aggregated as Eq. 7 (token mean per
    completion, then mean over completions)."""
    n, t = mask.shape
    total = 0.0
    for i in range(n):
        tokens = [j for j in range(t) if mask[i, j]]
        s_i = math.exp(sum(float(logps[i, j] - old[i, j]) for j in tokens) / max(len(tokens), 1))
        completion = 0.0
        for j in tokens:
            r = s_i if level == "sequence" else math.exp(float(logps[i, j] - old[i, j]))
            a = float(a_used[i])
            unclipped = min(r, delta) if delta is not None else r
            if surrogate == "cispo":
                objective = min(r, EPS_HIGH) * a * float(logps[i, j])
            elif surrogate == "vespo":
                objective = float(phi[i]) * a * float(logps[i, j])
            elif surrogate == "sapo":
                tau = SAPO[0] if a > 0 else SAPO[1]
                objective = 1 / (1 + math.exp(-tau * (r - 1))) * 4 / tau * a
            else:
                objective = min(unclipped * a, min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH) * a)
            loss = -float(lam[i, j]) * objective
            if token_mask is not None:
                loss *= float(token_mask[i, j] if token_mask.shape[1] > 1 else token_mask[i, 0])
            if beta:
                d = float(ref[i, j] - logps[i, j])
                kl = math.exp(d) - d - 1
                loss += beta * (kl * r if bias else kl)
            completion += loss
        total += completion / (max(len(tokens), 1) if per_completion == "mean" else 1)
    return total / n


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_with_gtpos_weights_each_option_is_the_documented_per_token_formula(name):
    """λ from conflict spans (original signs), δ ('always', some completions filtered) and A' = δ(A − γ⟨H⟩)."""
    option = OPTIONS[name]
    mask, adv, fw, bw, entropy = entropy_batch(seed=6)
    logps = leaf_logps(mask, seed=7)
    old, ref = old_and_ref(logps, seed=8)
    gamma = 0.3
    kwargs = core_kwargs(option, logps, ref, mask, adv, old, entropy)
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        old_per_token_logps=old,
        token_entropy=entropy,
        entropy_filter="always",
        gamma=gamma,
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
        **kwargs,
    )
    mean_h = (entropy * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    keep = mean_h <= LN2
    assert 0 < (~keep).sum() < keep.numel()
    a_used = torch.where(keep, adv - gamma * mean_h, 0.0)
    lam = conflict_weights(fw, bw, adv)
    assert (lam == 0).any() and (lam == 2).any()
    expected = brute_force(
        logps.detach(), old, mask, a_used, lam, delta=kwargs["delta"], level=kwargs["importance_sampling_level"],
        token_mask=kwargs.get("token_mask"), ref=ref, beta=kwargs["beta"], bias=kwargs["kl_bias_correction"],
    )  # fmt: skip
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_sequence_level_keeps_lambda_per_token_gspo_token():
    """GSPO-token: the ratio's value is the completion's s_i, each token's gradient its own, so a conflict token
    with λ = 0 gets no gradient under the sequence-level ratio either (with GSPO's s_i it would)."""
    mask, adv, fw, bw, _ = entropy_batch(seed=6)
    logps = leaf_logps(mask, seed=7)
    old, _ = old_and_ref(logps, seed=8)
    loss, _ = keyword_loss(
        logps, mask, adv, forward_span=fw, backward_span=bw, old_per_token_logps=old, entropy_filter="never",
        gamma=0.0, importance_sampling_level="sequence", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
    )  # fmt: skip
    loss.backward()
    lam = conflict_weights(fw, bw, adv)
    silenced = (lam == 0) & mask.bool()
    assert silenced.any() and (logps.grad[silenced] == 0).all()
    assert (logps.grad[(lam != 0) & mask.bool() & (adv.unsqueeze(1) != 0)] != 0).any()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(delta=1.1), "delta must exceed 1 + epsilon_high"),
        (dict(importance_sampling_level="sequence_token"), "importance_sampling_level must be"),
        (dict(beta=0.04), "beta > 0 needs ref_per_token_logps"),
        (dict(beta=-1.0), "beta must be a finite number >= 0"),
        (dict(token_mask=torch.ones(3, 2)), "token_mask must have shape"),
    ],
)
def test_bad_option_values_are_one_clear_error(kwargs, message):
    mask, adv, _, _, _ = entropy_batch(seed=2)
    with pytest.raises(ValueError, match=re.escape(message)):
        keyword_loss(leaf_logps(mask), mask, adv, entropy_filter="never", gamma=0.0, epsilon_high=EPS_HIGH, **kwargs)


LOSS_TYPES = {  # TRL loss type -> (core surrogate, the outer scaling TRL's stub applies: accumulation 2, 2 steps)
    "cispo": ("cispo", 1.0),
    "vespo": ("vespo", 1.0),
    "sapo": ("sapo", 2.0),
    "luspo": ("clip", 2.0),
}


def gamma_weights(logps, old, mask, advantages):
    """φ_i of VESPO, by TRL's own static method (the weights GTPO's VESPO composition takes from TRL)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    k_pos, l_pos, k_neg, l_neg = VESPO
    return GRPOTrainer.get_gamma_weights(
        advantages.reshape(-1, 1), logps.detach() - old, mask.float(), None, k_pos, l_pos, k_neg, l_neg
    )


def loss_type_kwargs(loss_type, mask, logps=None, old=None, a_used=None):
    surrogate, _ = LOSS_TYPES[loss_type]
    kwargs = dict(gtpo_aggregation=loss_type, surrogate=surrogate, sapo_temperatures=SAPO)
    if loss_type in ("cispo", "vespo"):
        kwargs["token_normalizer"] = mask.sum().float()
    if loss_type == "vespo":
        kwargs["sequence_weights"] = gamma_weights(logps, old, mask, a_used)
    return kwargs


@pytest.mark.parametrize("loss_type", sorted(LOSS_TYPES))
def test_with_unit_weights_trls_cispo_sapo_and_luspo_are_trls_own_loss(loss_type):
    mask, adv, _, _, _ = entropy_batch(seed=31)
    logps = leaf_logps(mask, seed=32)
    old, _ = old_and_ref(logps, seed=33)
    loss, _ = keyword_loss(
        logps, mask, adv, old_per_token_logps=old, entropy_filter="never", gamma=0.0, epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH, **loss_type_kwargs(loss_type, mask, logps, old, adv),
    )  # fmt: skip
    loss = loss / LOSS_TYPES[loss_type][1]
    trl_logps = logps.detach().clone().requires_grad_()
    expected = trl_with({}, trl_logps, old, mask, adv, loss_type=loss_type)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(logps.grad, trl_logps.grad)


@pytest.mark.parametrize("loss_type", sorted(LOSS_TYPES))
def test_with_gtpos_weights_cispo_sapo_and_luspo_are_the_documented_formula(loss_type):
    mask, adv, fw, bw, entropy = entropy_batch(seed=6)
    logps = leaf_logps(mask, seed=7)
    old, _ = old_and_ref(logps, seed=8)
    mean_h = (entropy * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    a_used = torch.where(mean_h <= LN2, adv - 0.3 * mean_h, 0.0)
    kwargs = loss_type_kwargs(loss_type, mask, logps, old, a_used)
    loss, _ = keyword_loss(
        logps, mask, adv, forward_span=fw, backward_span=bw, old_per_token_logps=old, token_entropy=entropy,
        entropy_filter="always", gamma=0.3, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, **kwargs,
    )  # fmt: skip
    lam = conflict_weights(fw, bw, adv)
    if loss_type in ("cispo", "vespo"):  # token sum over the batch's valid tokens: per-completion sums, n / tokens
        phi = kwargs.get("sequence_weights")
        total = brute_force(logps.detach(), old, mask, a_used, lam, surrogate=loss_type, per_completion="sum", phi=phi)
        expected = total * mask.shape[0] / float(mask.sum())
    else:
        expected = brute_force(logps.detach(), old, mask, a_used, lam, surrogate=kwargs["surrogate"],
                               per_completion="sum" if loss_type == "luspo" else "mean")  # fmt: skip
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
