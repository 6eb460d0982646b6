"""§7 of GTPO in the paper's order: the loss −J_GTPO (Eq. 7) and its aggregations, from §1–6.

N completions in right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g;
``A_i`` an advantage, ``o_i`` the valid tokens (``completion_mask``). No trainer, no logging. The surrogates and
normalisers are entries of `gtpo.core.registry`; the inputs and settings are `gtpo.core.inputs`' dataclasses.
Metrics: `gtpo.core.metrics`. docs/core.md gives every choice and formula.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

from gtpo.core import registry
from gtpo.core.advantages import _signs
from gtpo.core.checks import lookup
from gtpo.core.entropy import ENTROPY_FILTERS, ENTROPY_TERMS, _keep, _mean_entropy, _shift
from gtpo.core.inputs import AdvantageTerms, LossInputs, LossSettings, check_loss_inputs, check_loss_options
from gtpo.core.metrics import loss_metrics
from gtpo.core.spans import COMBINE_MODES, CONFLICT_COUNTS, SPAN_SIDES, guarded_weights, leave_to_group

# 7. The loss (Eq. 7) and its aggregations ---------------------------------------------------------
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def _token_loss(inputs: LossInputs, settings: LossSettings, valid: Tensor, a_used: Tensor, lam: Tensor) -> Tensor:
    """ℓ_{i,t} = −λ·J_{i,t} (times TRL's vLLM weight), 0 at padding, J the registered surrogate (Eq. 7's
    min(r·A', clip(r, 1−ε_low, 1+ε_high)·A') for "clip"); with the GRPOConfig options that compose (docs/core.md):

    - ``importance_sampling_level="sequence"``: r's value is the completion's s_i = exp(mean_t (logp − old))
      (GSPO), its gradient the token's own, r_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)) (GSPO-token), so λ_{i,t}
      still weights token t;
    - ``token_mask``: ℓ times a 0/1 mask, (N, T) or (N, 1) (TRL's top-entropy tokens, off-policy sequences);
    - ``beta``: + β·KL_t, KL_t = exp(ref − logp) − (ref − logp) − 1 (TRL's k3), times r with
      ``kl_bias_correction``; added after the masks and the vLLM weight, as TRL does.
    """
    # Padding is zeroed before exp so that whatever it holds (inf, nan) gives neither value nor gradient.
    logp = torch.where(valid, inputs.per_token_logps.float(), 0.0)  # (N, T)
    a_tok = a_used.unsqueeze(-1)  # (N, 1)
    old_logps = inputs.old_per_token_logps
    old = logp.detach() if old_logps is None else torch.where(valid, old_logps.detach().float(), 0.0)  # (N, T)
    log_ratio = logp - old  # (N, T)
    if settings.importance_sampling_level == "sequence":  # s_i's value, each token's own gradient (GSPO-token)
        mean_log_ratio = (log_ratio * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = mean_log_ratio.detach() + logp - logp.detach()  # (N, T)
    ratio = torch.exp(log_ratio)  # (N, T)
    surrogate = registry.SURROGATES[settings.surrogate]
    token_loss = -surrogate.objective(ratio, logp, a_tok, inputs, settings) * lam  # (N, T)
    if inputs.token_mask is not None:
        token_loss = token_loss * inputs.token_mask.detach().float()  # (N, T) or (N, 1)
    if inputs.importance_weights is not None:
        token_loss = token_loss * inputs.importance_weights.detach().float()  # (N, T) vLLM sampling correction
    if settings.beta:
        ref = torch.where(valid, inputs.ref_per_token_logps.detach().float(), 0.0)  # (N, T)
        kl = torch.exp(ref - logp) - (ref - logp) - 1  # (N, T) k3 estimator of KL(π_θ ‖ π_ref)
        token_loss = token_loss + settings.beta * (kl * ratio if settings.kl_bias_correction else kl)
    return torch.where(valid, token_loss, 0.0)  # (N, T)


class _Aggregations(Mapping):
    """Every name ``gtpo_aggregation`` accepts (the registry's normalisers and loss types) -> its reduction."""

    def __getitem__(self, name: str):
        if name not in self:
            raise KeyError(name)
        return registry.normaliser_of(name).aggregate

    def __contains__(self, name) -> bool:
        return name in registry.NORMALISERS or name in registry.LOSS_TYPES

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(registry.NORMALISERS) | set(registry.LOSS_TYPES)))

    def __len__(self) -> int:
        return len(set(registry.NORMALISERS) | set(registry.LOSS_TYPES))


AGGREGATIONS: Mapping = _Aggregations()
"""Loss aggregation, read from `gtpo.core.registry`: ``sequence`` = ``grpo`` (Eq. 7), TRL 1.16's ``bnpo``,
``dr_grpo``, ``dapo`` (and the loss types normalised as those), or ``reference`` (authors' code). docs/core.md
gives each formula."""


def advantage_terms(inputs: LossInputs, settings: LossSettings, valid: Tensor | None = None) -> AdvantageTerms:
    """⟨H⟩_i, δ_i (Eq. 6) and A'_i (Eq. 7) of a micro-batch, without a host sync.

    Args:
        inputs: ``advantages`` (N,), ``completion_mask`` (N, T) and ``token_entropy`` (N, T) are read.
        settings: the entropy filter, γ, the entropy term and ``group_size``.
        valid: (N, T) bool mask when already computed (else ``completion_mask != 0``).

    Returns:
        AdvantageTerms; ``mean_entropy`` keeps the gradient of ``token_entropy``.
    """
    valid = inputs.completion_mask != 0 if valid is None else valid
    a = inputs.advantages.float()  # (N,) original A_i: the conflict signs come from here
    signs = _signs(a, settings.group_size)  # (N,) in {-1, 0, 1}
    token_entropy = inputs.token_entropy
    mean_h = None if token_entropy is None else _mean_entropy(token_entropy, valid)  # (N,) differentiable
    if mean_h is None:
        keep = torch.ones_like(a, dtype=torch.bool)  # (N,) δ_i ("never" without entropy)
    else:
        mode = ENTROPY_FILTERS[settings.entropy_filter]
        keep = _keep(mean_h, signs.float(), mode, settings.entropy_threshold, settings.initial_entropy)  # (N,) δ_i
    shifted = settings.entropy_term == "advantage" and mean_h is not None
    a_used = _shift(a, mean_h, keep, settings.gamma) if shifted else torch.where(keep, a, 0.0)  # (N,) A'_i
    return AdvantageTerms(signs=signs, mean_entropy=mean_h, keep=keep, advantages=a_used)


def gtpo_loss(
    inputs: LossInputs, settings: LossSettings | None = None, *, terms: AdvantageTerms | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GTPO policy loss −J_GTPO of Eq. (7), with its metrics; the one entry point of the loss.

    Per valid token ℓ = −λ·min(r·A', clip(r, 1−ε_low, 1+ε_high)·A'), r = exp(logp − old.detach()); without
    ``old_per_token_logps`` r = exp(logp − logp.detach()) (value 1) and no clipping. λ from the spans and
    the *original* signs (Eq. 5; 1 without spans), δ from ⟨H⟩_i (Eq. 6), A' = δ·(A − γ⟨H⟩) for
    ``entropy_term="advantage"`` (else δ·A; ``"differentiable"`` adds +γ·mean_i ⟨H⟩_i). docs/core.md gives
    every field, the aggregations and the metric formulas. Build the two dataclasses by keyword:
    ``gtpo_loss(LossInputs(per_token_logps=..., completion_mask=..., advantages=...), LossSettings(gamma=0.1))``.

    Args:
        inputs: the micro-batch's tensors (`LossInputs`).
        settings: the loss's settings (`LossSettings`; None: the paper's defaults).
        terms: ⟨H⟩_i, δ_i and A'_i from `advantage_terms` on the same inputs and settings, when the caller
            already computed them (the trainer does, once per micro-batch); None computes them here.

    Returns:
        (loss, metrics): a float32 scalar, and a dict of detached scalars (`gtpo.core.metrics.loss_metrics`).
    """
    if not isinstance(inputs, LossInputs) or not (settings is None or isinstance(settings, LossSettings)):
        raise TypeError(
            "gtpo_loss takes (LossInputs, LossSettings), built by keyword: gtpo_loss(LossInputs(per_token_logps=..., "
            "completion_mask=..., advantages=...), LossSettings(...)); its keyword form and policy_loss were removed "
            f"(got {type(inputs).__name__}, {type(settings).__name__})"
        )
    settings = LossSettings() if settings is None else settings
    lookup(ENTROPY_TERMS, settings.entropy_term, "entropy_term")
    lookup(ENTROPY_FILTERS, settings.entropy_filter, "entropy_filter mode")
    combine_fn = lookup(COMBINE_MODES, settings.combine, "combine mode")
    sides = lookup(SPAN_SIDES, settings.span_sides, "span_sides")
    count = lookup(CONFLICT_COUNTS, settings.conflict_count, "conflict_count")
    aggregate = lookup(AGGREGATIONS, settings.gtpo_aggregation, "gtpo_aggregation")
    check_loss_options(inputs, settings)
    valid, normalizer = check_loss_inputs(inputs, settings)  # (N, T) bool; the one host sync of the call

    terms = advantage_terms(inputs, settings, valid) if terms is None else terms
    fw = torch.zeros_like(valid) if inputs.forward_span is None else inputs.forward_span & valid  # (N, T) M^fw
    bw = torch.zeros_like(valid) if inputs.backward_span is None else inputs.backward_span & valid  # (N, T) M^bw
    fw, bw = sides(fw, bw)  # the paper's both spans, or one side (an ablation)
    signs = terms.signs.float()  # (N,)
    if inputs.contested_span is None:
        lam = combine_fn(fw, bw, signs, float(settings.positive_weight), float(settings.negative_weight))  # Eq. 5
    else:
        lam = guarded_weights(fw, bw, inputs.contested_span, signs)  # (N, T) the guard: 0 on contested tokens, else 1
    if inputs.common_prefix_span is not None:  # GRPO's update where the sharers' contexts are the same
        lam = leave_to_group(lam, inputs.common_prefix_span & fw)  # (N, T)
    token_loss = _token_loss(inputs, settings, valid, terms.advantages, lam)  # (N, T)
    loss = aggregate(token_loss, valid, count(fw, bw), normalizer)  # (), `reference` divides by the count
    mean_h = terms.mean_entropy
    if settings.entropy_term == "differentiable" and mean_h is not None and settings.gamma != 0:
        loss = loss + settings.gamma * mean_h.sum() / max(valid.shape[0], 1)  # () minimizing ⟨H⟩ (−γ⟨H⟩_i in J)
    return loss, loss_metrics(valid, signs, fw, bw, lam, terms.keep, mean_h, terms.advantages)
