"""GTPO algorithm in pure torch: conflict spans, token weights λ, entropy filter δ and the loss.

Reads in the paper's order (arXiv 2508.03772, Sec. 5 and App. 11): 1. advantages (Eq. 8) and their signs,
2. conflict spans (Sec. 5.1), 3. λ (Eq. 5/21), 4. entropy ⟨H⟩_i, 5. filter δ_i (Eq. 6), 6. shifted
advantages and 7. the loss (Eq. 7) with its aggregations. N completions in right-padded (N, T) tensors;
rows ``g*G .. g*G+G-1`` are the G completions of prompt g; ``A_i`` an advantage, ``o_i`` the valid tokens
(``completion_mask``), ``⟨H⟩_i`` their mean next-token entropy in nats. No trainer, no logging; inputs'
device and dtype. Checks: `gtpo.core.checks` (one host sync per call); conflict search:
`gtpo.core.conflicts`; metrics: `gtpo.core.metrics`. docs/core.md gives every choice and formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from gtpo.core.checks import (
    check_entropy_inputs,
    check_keep_inputs,
    check_loss_inputs,
    check_rewards,
    check_shift_inputs,
    check_signs_inputs,
    check_weights_inputs,
    initial_entropy_value,
    lookup,
    validate_group_batch,
)
from gtpo.core.conflicts import aligned_conflicts
from gtpo.core.metrics import loss_metrics

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "COMBINE_MODES",
    "ENTROPY_FILTERS",
    "ENTROPY_TERMS",
    "LN2",
    "ZERO_ADVANTAGE_RTOL",
    "advantage_signs",
    "conflict_spans",
    "conflict_weights",
    "entropy_keep_mask",
    "group_advantages",
    "gtpo_loss",
    "mean_completion_entropy",
    "shift_advantages",
    "token_entropy",
    "validate_group_batch",
]

LN2 = math.log(2.0)
"""ln 2 ≈ 0.693 nats: the entropy of an even choice between two tokens, Eq. (6)'s threshold."""
ZERO_ADVANTAGE_RTOL = 1e-6
"""|A_i| ≤ 1e-6·max(1, max_{j∈g} |A_j|) counts as A_i = 0 (`advantage_signs`): about 8 float32 ulps of 1."""


# 1. Advantages (Eq. 8) and their signs ------------------------------------------------------------
ADVANTAGE_SCALES = ("group", "none")
"""``group``: (R − mean)/(std + 1e-4) with torch.std's unbiased std, as TRL; ``none``: R − mean."""


def group_advantages(rewards: Tensor, group_size: int, *, scale: str = "group") -> Tensor:
    """Group-relative advantages Â_i = (R_i − mean_g R)/(std_g R + 1e-4), Eq. (8), for use without TRL.

    ``std`` is the unbiased group std of ``torch.std``, as TRL's ``scale_rewards="group"``;
    ``scale="none"`` returns R_i − mean_g R (the authors' code, TRL's ``scale_rewards="none"``).
    rewards: (N,) floats, rows g*G .. g*G+G-1 form group g. Returns (N,) in the rewards' dtype.

    >>> group_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, scale="none").tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    lookup(ADVANTAGE_SCALES, scale, "advantage scale")
    check_rewards(rewards, group_size, scale)
    grouped = rewards.view(-1, group_size)  # (n_groups, G)
    centered = grouped - grouped.mean(dim=-1, keepdim=True)  # (n_groups, G)
    if scale == "group":
        centered = centered / (grouped.std(dim=-1, keepdim=True) + 1e-4)  # (n_groups, G)
    return centered.reshape(-1)  # (N,)


def advantage_signs(advantages: Tensor, group_size: int) -> Tensor:
    """Sign of each advantage, 0 where it is zero up to float rounding; every sign test in GTPO uses it.

    A_i counts as 0 when |A_i| ≤ ZERO_ADVANTAGE_RTOL · max(1, max_{j∈g} |A_j|), in float32 or wider:
    (R − mean)/(std + 1e-4) leaves ±1e-7 where a reward equals its group's mean, and such a row must not
    take part in conflict detection (docs/core.md, "Advantages that are zero up to rounding").
    advantages: (N,) finite floats; group_size: G (1: each row alone). Returns (N,) int8 in {-1, 0, 1}.

    >>> advantage_signs(torch.tensor([1.5, -1.5, 1e-7, -2e-7]), 4).tolist()
    [1, -1, 0, 0]
    """
    check_signs_inputs(advantages, group_size)
    return _signs(advantages, group_size)  # (N,)


def _signs(advantages: Tensor, group_size: int) -> Tensor:
    a = advantages.detach().to(torch.promote_types(advantages.dtype, torch.float32))  # (N,)
    grouped = a.view(-1, group_size).abs()  # (n_groups, G)
    tol = ZERO_ADVANTAGE_RTOL * grouped.amax(dim=-1, keepdim=True).clamp(min=1.0)  # (n_groups, 1) tol_g
    zero = (grouped <= tol).view(-1)  # (N,)
    return torch.where(zero, 0.0, torch.sign(a)).to(torch.int8)  # (N,)


# 2. Conflict spans (Sec. 5.1) ---------------------------------------------------------------------
def conflict_spans(
    completion_ids: Tensor, completion_mask: Tensor, advantages: Tensor, group_size: int
) -> tuple[Tensor, Tensor]:
    """Forward (leading) and backward (trailing) conflict spans M^fw, M^bw of each completion, Sec. 5.1.

    Position p of completion i is a *forward conflict* when its token also appears at p in a completion
    with A>0 and in one with A<0 of the same group; a *backward conflict* counts offsets r from each
    completion's own last valid token (position ``|o_i| - 1 - r``). The forward span is the run of
    forward conflicts from the first valid token, the backward span the run ending at the last one.
    Rows with A=0 (`advantage_signs`), padding and empty completions are never in a span. Validity comes
    from ``completion_mask`` only, never from a pad id (often EOS, itself a genuine conflict token).

    completion_ids: (N, T) integer ids; completion_mask: (N, T) bool or 0/1, right-padded (as in TRL);
    advantages: (N,) floats, only their signs count; group_size: G. Returns two (N, T) bool tensors.

    >>> ids = torch.tensor([[5, 7, 9], [5, 8, 9]])
    >>> fw, bw = conflict_spans(ids, torch.ones(2, 3, dtype=torch.bool), torch.tensor([1.0, -1.0]), 2)
    >>> fw.int().tolist(), bw.int().tolist()
    ([[1, 0, 0], [1, 0, 0]], [[0, 0, 1], [0, 0, 1]])
    """
    valid = validate_group_batch(completion_ids, completion_mask, advantages, group_size)  # (N, T)
    t = completion_ids.shape[1]
    ids = completion_ids.long()  # (N, T)
    lengths = valid.sum(dim=-1)  # (N,) |o_i|

    # Keys 2v (A>0), 2v+1 (A<0), -1 (A=0 or padding): see core_conflicts.aligned_conflicts.
    signs = _signs(advantages, group_size)  # (N,) zero up to rounding -> 0, the one sign rule
    sign_bit = (signs < 0).long().unsqueeze(-1)  # (N, 1)
    takes_part = valid & (signs != 0).unsqueeze(-1)  # (N, T)
    fw_keys = torch.where(takes_part, 2 * ids + sign_bit, -1)  # (N, T)
    # Backward alignment: offset r reads position |o_i| - 1 - r. With right padding, offset r is valid
    # exactly where position r is, so `takes_part` masks both layouts.
    pos = torch.arange(t, device=completion_ids.device)  # (T,)
    from_end = (lengths.unsqueeze(-1) - 1 - pos).clamp_(min=0)  # (N, T)
    bw_keys = torch.where(takes_part, fw_keys.gather(1, from_end), -1)  # (N, T)

    hits = aligned_conflicts(torch.cat([fw_keys, bw_keys], dim=1), group_size)  # (N, 2T)
    # Span length = length of the leading run of conflicts (a running AND); padding stops it.
    fw_len = hits[:, :t].cummin(dim=-1).values.sum(dim=-1, keepdim=True)  # (N, 1)
    bw_len = hits[:, t:].cummin(dim=-1).values.sum(dim=-1, keepdim=True)  # (N, 1)
    forward = pos < fw_len  # (N, T)
    backward = (pos >= lengths.unsqueeze(-1) - bw_len) & valid  # (N, T)
    return forward, backward


# 3. Token weights λ (Eq. 5/21) --------------------------------------------------------------------
def _signed_weight(span: Tensor, signs: Tensor, positive_weight: float) -> Tensor:
    """Eq. (5) on one mask: 1 outside the span; inside 0 (A<0), positive_weight (A>0), 1 (A=0)."""
    a = signs.unsqueeze(-1)  # (N, 1) from `advantage_signs`, as floats
    one = torch.ones((), dtype=signs.dtype, device=signs.device)
    inside = torch.where(a > 0, positive_weight, torch.where(a < 0, 0.0, one))  # (N, 1)
    return torch.where(span, inside, one)  # (N, T)


def _combine_union(forward: Tensor, backward: Tensor, signs: Tensor, positive_weight: float) -> Tensor:
    # The paper's text: M_i = M_i^fw ∨ M_i^bw, then Eq. (5).
    return _signed_weight(forward | backward, signs, positive_weight)  # (N, T)


def _combine_product(forward: Tensor, backward: Tensor, signs: Tensor, positive_weight: float) -> Tensor:
    # The authors' code (Listing 2): final_mask = mask_fwd * mask_bw, so positive_weight² in overlaps.
    fw = _signed_weight(forward, signs, positive_weight)  # (N, T)
    return fw * _signed_weight(backward, signs, positive_weight)  # (N, T)


COMBINE_MODES: dict[str, Callable[[Tensor, Tensor, Tensor, float], Tensor]] = {
    "union": _combine_union,
    "product": _combine_product,
}
"""How forward and backward spans combine into λ: ``union`` (paper text), ``product`` (authors' code)."""


def conflict_weights(
    forward: Tensor,
    backward: Tensor,
    advantages: Tensor,
    positive_weight: float = 2.0,
    combine: str = "union",
    *,
    group_size: int = 1,
) -> Tensor:
    """Token weights λ_{i,t} of Eq. (5)/(21): 1 outside the spans; inside 0 (A<0), positive_weight (A>0).

    Rows with A_i=0 keep 1 (they have no spans from `conflict_spans`); padding is outside every span.
    forward, backward: (N, T) bool spans. advantages: (N,) floats *before* any entropy shift (the signs
    decide). combine: one of `COMBINE_MODES`. group_size: G for `advantage_signs` (1: each row alone).
    Returns (N, T) λ in the dtype of ``advantages``.

    >>> fw = torch.tensor([[True, True], [True, False]])
    >>> bw = torch.tensor([[False, True], [False, False]])
    >>> conflict_weights(fw, bw, torch.tensor([1.0, -1.0]), combine="product").tolist()
    [[2.0, 4.0], [0.0, 1.0]]
    """
    fn = lookup(COMBINE_MODES, combine, "combine mode")
    check_weights_inputs(forward, backward, advantages, positive_weight, group_size)
    signs = _signs(advantages, group_size).to(advantages.dtype)  # (N,)
    return fn(forward, backward, signs, float(positive_weight))  # (N, T)


# 4. Entropy H (Sec. 4.2) and ⟨H⟩_i ----------------------------------------------------------------
_ENTROPY_CHUNK_ELEMS = 1 << 26  # logits (float32) per chunk of `token_entropy`: 256 MiB per temporary


def token_entropy(logits: Tensor, *, chunk_rows: int | None = None) -> Tensor:
    """Entropy H = -Σ_v p_v ln p_v (nats) of each next-token distribution, (..., T, V) → (..., T) float32.

    Untempered logits give the paper's H (Sec. 4.2, the trainer's default); tempered ones the sampling
    distribution's. Float32 math over chunks of ``chunk_rows`` rows (default ≈2**26 logits, 256 MiB per
    temporary); -inf logits give 0. Differentiable: use ``torch.no_grad()`` unless a gradient is needed.

    >>> round(token_entropy(torch.zeros(1, 4))[0].item(), 4)  # uniform over 4 tokens: ln 4 nats
    1.3863
    """
    if not isinstance(logits, Tensor) or logits.dim() < 1 or not logits.is_floating_point():
        raise ValueError("logits must be a floating tensor of shape (..., V)")
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # (rows, V)
    if flat.shape[0] == 0 or vocab == 0:
        return torch.zeros(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    rows = chunk_rows if chunk_rows is not None else max(1, _ENTROPY_CHUNK_ELEMS // vocab)
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    parts = [_entropy_rows(chunk) for chunk in flat.split(rows)]  # [(rows,)]
    return torch.cat(parts).view(logits.shape[:-1])  # (..., T)


def _entropy_rows(logits: Tensor) -> Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)  # (rows, V)
    # clamp: a -inf logit has p=0 and must give 0·ln 0 = 0, not 0·(-inf) = nan (value or gradient).
    return -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(dim=-1)  # (rows,)


def mean_completion_entropy(token_entropy: Tensor, completion_mask: Tensor) -> Tensor:
    """⟨H⟩_i: (N, T) entropies, (N, T) mask → (N,) float32 mean over valid tokens (0 if empty).

    Values at padding are ignored, even if nan; differentiable with respect to ``token_entropy``."""
    valid = check_entropy_inputs(token_entropy, completion_mask)  # (N, T) bool
    return _mean_entropy(token_entropy, valid)  # (N,)


def _mean_entropy(token_entropy: Tensor, valid: Tensor) -> Tensor:
    h = torch.where(valid, token_entropy.float(), 0.0)  # (N, T) nan at padding stays out
    return h.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)


# 5. Completion filter δ_i (Eq. 6) -----------------------------------------------------------------
def _keep_auto(low: Tensor, signs: Tensor, initial_entropy) -> Tensor:
    # A mode maps low = (⟨H⟩_i ≤ threshold) (N,), signs (N,), ⟨H⟩_ini to δ_i (N,) bool.
    # Eq. (6): filter only when the model is a low-entropy one, ⟨H⟩_ini < ln 2 (strictly; at equality
    # the text's "if ⟨H⟩_ini < ln 2 ... we apply" does not apply, so nothing is filtered).
    h_ini = initial_entropy_value(initial_entropy, low.device)  # float, or () on the device (no sync)
    if isinstance(h_ini, Tensor):
        return low | ~(h_ini < LN2)  # (N,)
    return low if h_ini < LN2 else torch.ones_like(low)  # (N,)


ENTROPY_FILTERS: dict[str, Callable[[Tensor, Tensor, object], Tensor]] = {
    "auto": _keep_auto,
    "always": lambda low, signs, h_ini: low,  # authors' code: keep iff ⟨H⟩_i ≤ threshold
    "negative_only": lambda low, signs, h_ini: low | (signs >= 0),  # App. 13 "OnlyNeg": only A<0 filtered
    "never": lambda low, signs, h_ini: torch.ones_like(low),
}
"""Completion filter δ_i modes: ``auto`` (Eq. 6), ``always`` (authors' code), ``negative_only``
(App. 13 "OnlyNeg"), ``never``."""


def entropy_keep_mask(
    mean_entropy: Tensor,
    advantages: Tensor,
    *,
    mode: str,
    threshold: float = LN2,
    initial_entropy: float | Tensor | None = None,
    group_size: int = 1,
) -> Tensor:
    """The completion filter δ_i of Eq. (6): (N,) bool, True where a completion keeps its advantage.

    Low-entropy means ⟨H⟩_i ≤ threshold (equality keeps, Eq. 6 rows 2–3 and the authors' ``<=``).
    ``auto``: if ⟨H⟩_ini < ln 2 keep only low-entropy completions, else all (the gate is ln 2, not
    ``threshold``; needs ``initial_entropy``, float or 0-d tensor). ``always``: keep only low-entropy.
    ``negative_only``: drop only A<0 completions that are not low-entropy (App. 13). ``never``: keep all.
    mean_entropy: (N,) ⟨H⟩_i in nats. advantages: (N,) original (the sign decides ``negative_only``).
    threshold: nats (ln 2; the authors used 0.7, 1.02–1.05 for Qwen). group_size: for `advantage_signs`.
    """
    fn = lookup(ENTROPY_FILTERS, mode, "entropy_filter mode")
    check_keep_inputs(mean_entropy, advantages, threshold, group_size)
    return _keep(mean_entropy, _signs(advantages, group_size), fn, threshold, initial_entropy)  # (N,)


def _keep(mean_entropy: Tensor, signs: Tensor, mode_fn, threshold: float, initial_entropy) -> Tensor:
    low = mean_entropy.detach() <= threshold  # (N,) equality keeps (Eq. 6 row 3); nan is never low
    return mode_fn(low, signs, initial_entropy)  # (N,) δ_i


# 6. Shifted advantages A'_i (Eq. 7's δ and −γ⟨H⟩_i, as in the authors' code) ----------------------
ENTROPY_TERMS = ("advantage", "differentiable", "none")
"""How −γ⟨H⟩_i enters: advantage shift (authors' code), differentiable +γ·mean⟨H⟩ term, or not at all."""


def shift_advantages(advantages: Tensor, mean_entropy: Tensor, keep: Tensor, gamma: float) -> Tensor:
    """A'_i = δ_i · (A_i − γ·⟨H⟩_i) with ⟨H⟩_i detached: (N,) each → (N,) float32 or wider.

    Reweights each kept completion's policy gradient (A_i=0 included), no gradient through the entropy
    (docs/core.md, "What the default γ realization does"). keep: δ_i from `entropy_keep_mask`; gamma: 0.1.
    """
    check_shift_inputs(advantages, mean_entropy, keep, gamma)
    return _shift(advantages, mean_entropy, keep, gamma)  # (N,)


def _shift(advantages: Tensor, mean_entropy: Tensor, keep: Tensor, gamma: float) -> Tensor:
    dtype = torch.promote_types(advantages.dtype, torch.float32)
    shifted = advantages.to(dtype) - gamma * mean_entropy.detach().to(dtype)  # (N,)
    return torch.where(keep, shifted, 0.0)  # (N,)


# 7. The loss (Eq. 7) and its aggregations ---------------------------------------------------------
def _token_loss(logps, old_logps, valid, a_used, lam, eps_low, eps_high, importance_weights) -> Tensor:
    """ℓ_{i,t} = −λ·min(r·A', clip(r, 1−ε_low, 1+ε_high)·A') (times TRL's vLLM weight), 0 at padding."""
    # Padding is zeroed before exp so that whatever it holds (inf, nan) gives neither value nor gradient.
    logp = torch.where(valid, logps.float(), 0.0)  # (N, T)
    a_tok = a_used.unsqueeze(-1)  # (N, 1)
    if old_logps is None:
        surrogate = torch.exp(logp - logp.detach()) * a_tok  # (N, T) ratio of value 1 carries the gradient
    else:
        ratio = torch.exp(logp - torch.where(valid, old_logps.detach().float(), 0.0))  # (N, T)
        surrogate = torch.min(ratio * a_tok, ratio.clamp(1 - eps_low, 1 + eps_high) * a_tok)  # (N, T)
    token_loss = -surrogate * lam  # (N, T)
    if importance_weights is not None:
        token_loss = token_loss * importance_weights.detach().float()  # (N, T) vLLM sampling correction
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
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GTPO policy loss −J_GTPO of Eq. (7): ``(loss, metrics)``, a float32 scalar and detached scalars.

    Per valid token ℓ = −λ·min(r·A', clip(r, 1−ε_low, 1+ε_high)·A'), r = exp(logp − old.detach()); without
    ``old_per_token_logps`` r = exp(logp − logp.detach()) (value 1) and no clipping. λ from the spans and
    the *original* signs (1 without spans), δ from ⟨H⟩_i, A' = δ·(A − γ⟨H⟩) for ``entropy_term="advantage"``
    (else δ·A; ``"differentiable"`` adds +γ·mean_i ⟨H⟩_i). Tensors are (N, T) except advantages (N,) and
    importance_weights (N, T) or (N, 1). ``group_size``: G when rows are whole groups, for `advantage_signs`
    (1: each row alone, as in TRL's shuffled micro-batches). ``max_completion_length``: ``dr_grpo`` only;
    ``token_normalizer``: ``dapo`` only (TRL's num_items_in_batch / num_processes).
    docs/core.md gives every argument, the aggregations and the metric formulas.
    """
    lookup(ENTROPY_TERMS, entropy_term, "entropy_term")
    aggregate = lookup(AGGREGATIONS, aggregation, "aggregation")
    keep_mode = lookup(ENTROPY_FILTERS, entropy_filter, "entropy_filter mode")
    combine_fn = lookup(COMBINE_MODES, combine, "combine mode")
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
        per_token_logps, old_per_token_logps, valid, a_used, lam, epsilon_low, epsilon_high, importance_weights
    )  # (N, T)
    loss = aggregate(token_loss, valid, (fw | bw).sum(dim=-1), normalizer)  # ()
    if entropy_term == "differentiable" and mean_h is not None and gamma != 0:
        loss = loss + gamma * mean_h.sum() / max(valid.shape[0], 1)  # () minimizing ⟨H⟩ (Eq. 7's −γ⟨H⟩_i in J)
    return loss, loss_metrics(valid, signs, fw, bw, lam, keep, mean_h, a_used)
