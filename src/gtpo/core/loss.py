"""§7 of GTPO in the paper's order: the loss −J_GTPO (Eq. 7) and its aggregations, from §1–6.

N completions in right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g;
``A_i`` an advantage, ``o_i`` the valid tokens (``completion_mask``). No trainer, no logging.
Metrics: `gtpo.core.metrics`. docs/core.md gives every choice and formula.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gtpo.core.advantages import _signs
from gtpo.core.checks import (
    check_loss_inputs,
    check_loss_options,
    lookup,
)
from gtpo.core.entropy import ENTROPY_FILTERS, ENTROPY_TERMS, LN2, _keep, _mean_entropy, _shift
from gtpo.core.metrics import loss_metrics
from gtpo.core.spans import COMBINE_MODES

# 7. The loss (Eq. 7) and its aggregations ---------------------------------------------------------
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def _token_loss(
    logps, old_logps, valid, a_used, lam, eps_low, eps_high, importance_weights, *, delta=None, level="token",
    token_mask=None, ref_logps=None, beta=0.0, kl_bias_correction=False, surrogate="clip", sapo_temperatures=None,
    sequence_weights=None,
) -> Tensor:  # fmt: skip
    """ℓ_{i,t} = −λ·min(r·A', clip(r, 1−ε_low, 1+ε_high)·A') (times TRL's vLLM weight), 0 at padding; with the
    GRPOConfig options that compose (docs/core.md, "GTPO with more of GRPOConfig"):

    - ``delta``: the unclipped term's ratio is capped, min(r, δ)·A' (TRL's two-sided clipping);
    - ``level="sequence"``: r's value is the completion's s_i = exp(mean_t (logp − old)) (GSPO), its gradient the
      token's own, r_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)) (GSPO-token), so λ_{i,t} still weights token t;
    - ``token_mask``: ℓ times a 0/1 mask, (N, T) or (N, 1) (TRL's top-entropy tokens, off-policy sequences);
    - ``beta``: + β·KL_t, KL_t = exp(ref − logp) − (ref − logp) − 1 (TRL's k3), times r with
      ``kl_bias_correction``; added after the masks and the vLLM weight, as TRL does;
    - ``surrogate``: "clip" (Eq. 7's min(r·A', clip(r)·A')), "cispo" (−sg(min(r, ε_high))·A'·logp, TRL's CISPO)
      "sapo" (−σ(τ·(r − 1))·(4/τ)·A', τ by the sign of A', TRL's SAPO) or "vespo" (−φ_i·A'·logp with
      ``sequence_weights`` φ, TRL's VESPO gamma weights); λ multiplies each.
    """
    # Padding is zeroed before exp so that whatever it holds (inf, nan) gives neither value nor gradient.
    logp = torch.where(valid, logps.float(), 0.0)  # (N, T)
    a_tok = a_used.unsqueeze(-1)  # (N, 1)
    old = logp.detach() if old_logps is None else torch.where(valid, old_logps.detach().float(), 0.0)  # (N, T)
    log_ratio = logp - old  # (N, T)
    if level == "sequence":  # s_i's value, each token's own gradient (GSPO-token)
        mean_log_ratio = (log_ratio * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = mean_log_ratio.detach() + logp - logp.detach()  # (N, T)
    ratio = torch.exp(log_ratio)  # (N, T)
    if surrogate == "cispo":  # the clipped ratio is a detached weight on the token's log-probability
        objective = ratio.clamp(max=eps_high).detach() * a_tok * logp  # (N, T)
    elif surrogate == "vespo":  # a detached per-sequence weight φ_i on the token's log-probability
        objective = sequence_weights.detach().float().reshape(-1, 1) * a_tok * logp  # (N, T)
    elif surrogate == "sapo":  # a soft gate around r = 1, sharper for negative advantages
        positive, negative = sapo_temperatures
        tau = torch.where(a_tok > 0, positive, negative)  # (N, 1)
        objective = torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a_tok  # (N, T)
    elif old_logps is None and level == "token" and delta is None:
        objective = ratio * a_tok  # (N, T) ratio of value 1 carries the gradient; clipping never binds
    else:
        unclipped = ratio if delta is None else ratio.clamp(max=delta)  # (N, T)
        objective = torch.min(unclipped * a_tok, ratio.clamp(1 - eps_low, 1 + eps_high) * a_tok)  # (N, T)
    token_loss = -objective * lam  # (N, T)
    if token_mask is not None:
        token_loss = token_loss * token_mask.detach().float()  # (N, T) or (N, 1)
    if importance_weights is not None:
        token_loss = token_loss * importance_weights.detach().float()  # (N, T) vLLM sampling correction
    if beta:
        ref = torch.where(valid, ref_logps.detach().float(), 0.0)  # (N, T)
        kl = torch.exp(ref - logp) - (ref - logp) - 1  # (N, T) k3 estimator of KL(π_θ ‖ π_ref)
        token_loss = token_loss + beta * (kl * ratio if kl_bias_correction else kl)
    return torch.where(valid, token_loss, 0.0)  # (N, T)


# Aggregations: (token_loss (N, T) zero at padding, valid (N, T), n_conflict (N,), normalizer) -> ().
# Only the normalization differs (TRL 1.16's `_compute_loss` formulas); λ, δ and the shift are in ℓ.
def _aggregate_sequence(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # Eq. (7): token mean per completion, then mean over completions (= TRL's loss_type="grpo").
    per_completion = token_loss.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)
    return per_completion.sum() / max(per_completion.shape[0], 1)  # ()


def _aggregate_bnpo(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # TRL's "bnpo": token mean over the micro-batch's valid tokens.
    return token_loss.sum() / valid.sum().clamp(min=1)  # ()


def _aggregate_dr_grpo(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # TRL's "dr_grpo" (Dr. GRPO): a constant normalizer, rows × max_completion_length.
    return token_loss.sum() / (token_loss.shape[0] * normalizer)  # ()


def _aggregate_dapo(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # TRL's "dapo": token sum over the valid tokens of the whole global batch per rank (num_items_in_batch
    # / num_processes), so micro-batches and ranks add up to one token mean over the batch.
    return token_loss.sum() / normalizer  # ()


def _aggregate_luspo(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # TRL's "luspo": token sum per completion, then mean over completions (length-unbiased sequence loss).
    return token_loss.sum(dim=-1).sum() / max(token_loss.shape[0], 1)  # ()


def _aggregate_reference(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # Authors' code (Listing 3): each completion's token mean / max(#conflict positions, 1), summed.
    per_completion = token_loss.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)
    return (per_completion / n_conflict.clamp(min=1)).sum()  # ()


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, Tensor, object], Tensor]] = {
    "sequence": _aggregate_sequence,
    "grpo": _aggregate_sequence,
    "bnpo": _aggregate_bnpo,
    "dr_grpo": _aggregate_dr_grpo,
    "dapo": _aggregate_dapo,
    "cispo": _aggregate_dapo,  # TRL normalizes CISPO as DAPO: the batch's valid tokens per rank
    "sapo": _aggregate_sequence,  # TRL normalizes SAPO as GRPO
    "luspo": _aggregate_luspo,
    "vespo": _aggregate_dapo,  # TRL normalizes VESPO as DAPO
    "reference": _aggregate_reference,
}
"""Loss aggregation: ``sequence`` = ``grpo`` (Eq. 7), TRL 1.16's ``bnpo``, ``dr_grpo`` and ``dapo``
normalizations, or ``reference`` (authors' code). docs/core.md gives each formula."""


def gtpo_loss(
    per_token_logps: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    *,
    forward_span: Tensor | None = None,
    backward_span: Tensor | None = None,
    old_per_token_logps: Tensor | None = None,
    token_entropy: Tensor | None = None,
    positive_weight: float = 2.0,
    combine: str = "union",
    entropy_filter: str = "auto",
    entropy_threshold: float = LN2,
    initial_entropy: float | Tensor | None = None,
    gamma: float = 0.1,
    entropy_term: str = "advantage",
    aggregation: str = "sequence",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    importance_weights: Tensor | None = None,
    group_size: int = 1,
    max_completion_length: int | None = None,
    token_normalizer: Tensor | float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    token_mask: Tensor | None = None,
    ref_per_token_logps: Tensor | None = None,
    beta: float = 0.0,
    kl_bias_correction: bool = False,
    surrogate: str = "clip",
    sapo_temperatures: tuple[float, float] | None = None,
    sequence_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GTPO policy loss −J_GTPO of Eq. (7), with its metrics.

    Per valid token ℓ = −λ·min(r·A', clip(r, 1−ε_low, 1+ε_high)·A'), r = exp(logp − old.detach()); without
    ``old_per_token_logps`` r = exp(logp − logp.detach()) (value 1) and no clipping. λ from the spans and
    the *original* signs (Eq. 5; 1 without spans), δ from ⟨H⟩_i (Eq. 6), A' = δ·(A − γ⟨H⟩) for
    ``entropy_term="advantage"`` (else δ·A; ``"differentiable"`` adds +γ·mean_i ⟨H⟩_i). docs/core.md gives
    every argument, the aggregations and the metric formulas.

    Args:
        per_token_logps: (N, T) log-probabilities of the sampled tokens under the current policy.
        completion_mask: (N, T) bool or 0/1, True at valid tokens.
        advantages: (N,) A_i of Eq. (8).
        forward_span, backward_span: (N, T) bool spans from `conflict_spans`, or None (λ = 1).
        old_per_token_logps: (N, T) log-probabilities at sampling time, or None (on-policy, r = 1).
        token_entropy: (N, T) entropies in nats, for δ and γ; None when neither is on.
        positive_weight, combine: λ's settings (`conflict_weights`).
        entropy_filter, entropy_threshold, initial_entropy: δ's settings (`entropy_keep_mask`).
        gamma, entropy_term: the entropy penalty's weight γ and how it enters (`ENTROPY_TERMS`).
        aggregation: one of `AGGREGATIONS`.
        epsilon_low, epsilon_high: the clip range of r.
        importance_weights: (N, T) or (N, 1) TRL's vLLM importance-sampling weights, or None.
        group_size: G when rows are whole groups, for `advantage_signs` (1: each row alone, as in TRL's
            shuffled micro-batches).
        max_completion_length: ``dr_grpo`` only.
        token_normalizer: ``dapo`` only (TRL's num_items_in_batch / num_processes).
        delta: cap of the unclipped term's ratio (TRL's two-sided clipping, > 1 + ε_high), or None.
        importance_sampling_level: "token" (Eq. 7) or "sequence" (GSPO's s_i as the ratio's value, GSPO-token's
            per-token gradient, so λ keeps weighting each token).
        token_mask: (N, T) or (N, 1) 0/1 multiplier of ℓ (TRL's top-entropy or off-policy masks), or None.
        ref_per_token_logps: (N, T) reference-model log-probabilities, needed when ``beta`` > 0.
        beta: weight of TRL's per-token KL term (k3) to the reference model; 0 in the paper.
        kl_bias_correction: multiply the KL term by the ratio r (TRL's use_bias_correction_kl).
        surrogate: "clip" (Eq. 7), "cispo", "sapo" or "vespo" (TRL's loss types of those names; with the
            aggregations of the same names, which normalize as TRL's do).
        sapo_temperatures: (τ_pos, τ_neg) for ``surrogate="sapo"`` (TRL's sapo_temperature_pos/neg).
        sequence_weights: (N,) or (N, 1) φ_i for ``surrogate="vespo"`` (TRL's ``get_gamma_weights``), detached.

    Returns:
        (loss, metrics): a float32 scalar, and a dict of detached scalars (`gtpo.core.metrics.loss_metrics`).
    """
    lookup(ENTROPY_TERMS, entropy_term, "entropy_term")
    aggregate = lookup(AGGREGATIONS, aggregation, "aggregation")
    keep_mode = lookup(ENTROPY_FILTERS, entropy_filter, "entropy_filter mode")
    combine_fn = lookup(COMBINE_MODES, combine, "combine mode")
    shape = tuple(per_token_logps.shape) if isinstance(per_token_logps, Tensor) else (0, 0)
    check_loss_options(
        shape,
        delta,
        epsilon_high,
        importance_sampling_level,
        token_mask,
        ref_per_token_logps,
        beta,
        surrogate,
        sapo_temperatures,
        sequence_weights,
    )
    valid, normalizer = check_loss_inputs(  # (N, T) bool; the one host sync of the call
        per_token_logps,
        completion_mask,
        advantages,
        forward_span=forward_span,
        backward_span=backward_span,
        old_per_token_logps=old_per_token_logps,
        token_entropy=token_entropy,
        importance_weights=importance_weights,
        positive_weight=positive_weight,
        gamma=gamma,
        entropy_threshold=entropy_threshold,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        entropy_filter=entropy_filter,
        entropy_term=entropy_term,
        aggregation=aggregation,
        group_size=group_size,
        max_completion_length=max_completion_length,
        token_normalizer=token_normalizer,
    )

    a = advantages.float()  # (N,) original A_i: the conflict signs come from here
    signs = _signs(a, group_size).float()  # (N,) in {-1, 0, 1}
    fw = torch.zeros_like(valid) if forward_span is None else forward_span & valid  # (N, T) M^fw
    bw = torch.zeros_like(valid) if backward_span is None else backward_span & valid  # (N, T) M^bw
    lam = combine_fn(fw, bw, signs, float(positive_weight))  # (N, T) λ, Eq. 5; 1 everywhere without spans
    mean_h = None if token_entropy is None else _mean_entropy(token_entropy, valid)  # (N,) ⟨H⟩_i, differentiable
    keep = (
        torch.ones_like(a, dtype=torch.bool)
        if mean_h is None  # (N,) δ_i, Eq. 6 ("never" without entropy)
        else _keep(mean_h, signs, keep_mode, entropy_threshold, initial_entropy)
    )
    shifted = entropy_term == "advantage" and mean_h is not None
    a_used = _shift(a, mean_h, keep, gamma) if shifted else torch.where(keep, a, 0.0)  # (N,) A'_i, Eq. 7

    token_loss = _token_loss(
        per_token_logps,
        old_per_token_logps,
        valid,
        a_used,
        lam,
        epsilon_low,
        epsilon_high,
        importance_weights,
        delta=delta,
        level=importance_sampling_level,
        token_mask=token_mask,
        ref_logps=ref_per_token_logps,
        beta=beta,
        kl_bias_correction=kl_bias_correction,
        surrogate=surrogate,
        sapo_temperatures=sapo_temperatures,
        sequence_weights=sequence_weights,
    )  # (N, T)
    loss = aggregate(token_loss, valid, (fw | bw).sum(dim=-1), normalizer)  # ()
    if entropy_term == "differentiable" and mean_h is not None and gamma != 0:
        loss = loss + gamma * mean_h.sum() / max(valid.shape[0], 1)  # () minimizing ⟨H⟩ (Eq. 7's −γ⟨H⟩_i in J)
    return loss, loss_metrics(valid, signs, fw, bw, lam, keep, mean_h, a_used)
