"""The loss registry: each loss type is one entry, a token *surrogate* and a *normaliser*, with its traits.

Two axes, as verl registers its policy losses (`@register_policy_loss`), each entry carrying everything about it:

- a **surrogate** turns the ratio r, the log-probability and the advantage A' into the per-token objective
  (Eq. 7's clipped min(r·A', clip(r)·A'), CISPO's, SAPO's, VESPO's, ...), which λ (Eq. 5) then weights;
- a **normaliser** reduces the (N, T) token losses to one number (Eq. 7's token mean per completion, TRL's
  bnpo / dr_grpo / dapo / luspo, the authors' `reference` sum), and says what extra number it needs and how the
  trainer scales micro-batches so that they add up to the batch's loss.

A **loss type** (the `loss_type` of `GTPOConfig`) names one surrogate and one normaliser. `gtpo.core.gtpo_loss`,
its input checks, `GTPOConfig`'s validation and the trainer read these tables, never a list of names, so a new
loss is one `register_*` call:

>>> from gtpo.core.registry import LOSS_TYPES
>>> LOSS_TYPES["cispo"].surrogate, LOSS_TYPES["cispo"].normaliser
('cispo', 'dapo')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# What a normaliser needs beyond the token losses, and how the trainer scales a micro-batch's loss.
NORMALISER_NEEDS = (None, "max_completion_length", "token_normalizer")
NORMALISER_SCALES = ("mean", "token_sum", "group_sum")


@dataclass(frozen=True)
class Surrogate:
    """A per-token objective J_{i,t} (before λ and the sign of the loss).

    Attributes:
        name: the registry key.
        objective: ``(ratio (N, T), logp (N, T), a_tok (N, 1), inputs, settings) -> (N, T)``; ``inputs`` and
            ``settings`` are `gtpo.core.inputs.LossInputs` / `LossSettings`.
        check: ``(inputs, settings, shape) -> None``, raising a one-line ValueError for missing inputs; or None.
        weights_in_objective: the vLLM importance weights enter the objective (VESPO's φ) rather than
            multiplying the token loss.
        needs_sequence_weights: the objective reads ``LossInputs.sequence_weights`` (VESPO's φ_i), which the
            caller computes for it (the trainer from TRL's ``get_gamma_weights``).
    """

    name: str
    objective: Callable[..., Tensor]
    check: Callable[..., None] | None = None
    weights_in_objective: bool = False
    needs_sequence_weights: bool = False


@dataclass(frozen=True)
class Normaliser:
    """A reduction of the (N, T) token losses (zero at padding) to the micro-batch's loss.

    Attributes:
        name: the registry key.
        aggregate: ``(token_loss (N, T), valid (N, T), n_conflict (N,), normalizer) -> ()``.
        needs: None, "max_completion_length" (dr_grpo) or "token_normalizer" (the batch's valid tokens per rank).
        scale: how the trainer makes micro-batches add up: "mean" (divide by accumulation steps), "token_sum"
            (already over the generation batch's tokens: divide by accumulation / steps_per_generation) or
            "group_sum" (a sum over completions, turned into a mean over groups).
    """

    name: str
    aggregate: Callable[[Tensor, Tensor, Tensor, object], Tensor]
    needs: str | None = None
    scale: str = "mean"


@dataclass(frozen=True)
class LossType:
    """A `loss_type`: one surrogate and one normaliser (each a registry key)."""

    name: str
    surrogate: str
    normaliser: str

    @property
    def token_sum(self) -> bool:
        """Normalised by the generation batch's token count (not per micro-batch)."""
        return NORMALISERS[self.normaliser].scale == "token_sum"


SURROGATES: dict[str, Surrogate] = {}
NORMALISERS: dict[str, Normaliser] = {}
LOSS_TYPES: dict[str, LossType] = {}


def register_surrogate(
    name: str, objective, *, check=None, weights_in_objective: bool = False, needs_sequence_weights: bool = False
) -> Surrogate:
    """Add (or replace) a surrogate; see `Surrogate`."""
    SURROGATES[name] = Surrogate(name, objective, check, weights_in_objective, needs_sequence_weights)
    return SURROGATES[name]


def register_normaliser(name: str, aggregate, *, needs: str | None = None, scale: str = "mean") -> Normaliser:
    """Add (or replace) a normaliser; see `Normaliser`."""
    if needs not in NORMALISER_NEEDS or scale not in NORMALISER_SCALES:
        raise ValueError(f"normaliser {name!r}: needs must be one of {NORMALISER_NEEDS}, scale of {NORMALISER_SCALES}")
    NORMALISERS[name] = Normaliser(name, aggregate, needs, scale)
    return NORMALISERS[name]


def register_loss_type(name: str, *, surrogate: str, normaliser: str) -> LossType:
    """Add (or replace) a loss type made of a registered surrogate and normaliser."""
    if surrogate not in SURROGATES:
        raise ValueError(f"loss type {name!r}: unknown surrogate {surrogate!r}; registered: {sorted(SURROGATES)}")
    if normaliser not in NORMALISERS:
        raise ValueError(f"loss type {name!r}: unknown normaliser {normaliser!r}; registered: {sorted(NORMALISERS)}")
    LOSS_TYPES[name] = LossType(name, surrogate, normaliser)
    return LOSS_TYPES[name]


def normaliser_of(aggregation: str) -> Normaliser:
    """The normaliser an ``aggregation`` names: a normaliser's own name, or a loss type's (its normaliser)."""
    if aggregation in NORMALISERS:
        return NORMALISERS[aggregation]
    if aggregation in LOSS_TYPES:
        return NORMALISERS[LOSS_TYPES[aggregation].normaliser]
    valid = sorted(set(NORMALISERS) | set(LOSS_TYPES))
    raise ValueError(f"unknown aggregation {aggregation!r}; valid: {', '.join(valid)}")


def surrogate_of(name: str) -> Surrogate:
    if name not in SURROGATES:
        raise ValueError(f"surrogate must be one of {', '.join(repr(s) for s in sorted(SURROGATES))}, got {name!r}")
    return SURROGATES[name]


# Surrogates (TRL 1.16's `_compute_loss` formulas; docs/core.md) ------------------------------------------
def _clip(ratio, logp, a_tok, inputs, settings) -> Tensor:
    # Eq. (7): min(r·A', clip(r, 1−ε_low, 1+ε_high)·A'); with delta, the unclipped ratio is capped (two-sided).
    on_policy = inputs.old_per_token_logps is None and settings.importance_sampling_level == "token"
    if on_policy and settings.delta is None:
        return ratio * a_tok  # (N, T) the ratio of value 1 carries the gradient; clipping never binds
    unclipped = ratio if settings.delta is None else ratio.clamp(max=settings.delta)
    clipped = ratio.clamp(1 - settings.epsilon_low, 1 + settings.epsilon_high)
    return torch.min(unclipped * a_tok, clipped * a_tok)  # (N, T)


def _cispo(ratio, logp, a_tok, inputs, settings) -> Tensor:
    # CISPO: the clipped ratio is a detached weight on the token's log-probability.
    return ratio.clamp(max=settings.epsilon_high).detach() * a_tok * logp  # (N, T)


def _sapo(ratio, logp, a_tok, inputs, settings) -> Tensor:
    # SAPO: a soft gate around r = 1, sharper for negative advantages.
    positive, negative = settings.sapo_temperatures
    tau = torch.where(a_tok > 0, positive, negative)  # (N, 1)
    return torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a_tok  # (N, T)


def _vespo(ratio, logp, a_tok, inputs, settings) -> Tensor:
    # VESPO: a detached per-sequence weight φ_i (TRL's gamma weights) on the token's log-probability.
    return inputs.sequence_weights.detach().float().reshape(-1, 1) * a_tok * logp  # (N, T)


def _check_sapo(inputs, settings, shape) -> None:
    temperatures = settings.sapo_temperatures
    if not isinstance(temperatures, (tuple, list)) or len(temperatures) != 2:
        raise ValueError(f"surrogate='sapo' needs sapo_temperatures=(pos, neg), got {temperatures!r}")
    for value in temperatures:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"sapo temperatures must be finite numbers > 0, got {temperatures}")


def _check_vespo(inputs, settings, shape) -> None:
    weights = inputs.sequence_weights
    if not isinstance(weights, Tensor) or weights.numel() != shape[0]:
        raise ValueError(f"surrogate='vespo' needs sequence_weights of shape ({shape[0]},), got {weights!r:.60}")


register_surrogate("clip", _clip)
register_surrogate("cispo", _cispo)
register_surrogate("sapo", _sapo, check=_check_sapo)
register_surrogate("vespo", _vespo, check=_check_vespo, weights_in_objective=True, needs_sequence_weights=True)


# Normalisers: (token_loss (N, T) zero at padding, valid (N, T), n_conflict (N,), normalizer) -> () --------
def _sequence(token_loss, valid, n_conflict, normalizer) -> Tensor:
    # Eq. (7): token mean per completion, then mean over completions (= TRL's loss_type="grpo").
    per_completion = token_loss.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)
    return per_completion.sum() / max(per_completion.shape[0], 1)  # ()


def _bnpo(token_loss, valid, n_conflict, normalizer) -> Tensor:
    # TRL's "bnpo": token mean over the micro-batch's valid tokens.
    return token_loss.sum() / valid.sum().clamp(min=1)  # ()


def _dr_grpo(token_loss, valid, n_conflict, normalizer) -> Tensor:
    # TRL's "dr_grpo" (Dr. GRPO): a constant normalizer, rows × max_completion_length.
    return token_loss.sum() / (token_loss.shape[0] * normalizer)  # ()


def _token_sum(token_loss, valid, n_conflict, normalizer) -> Tensor:
    # TRL's "dapo": token sum over the valid tokens of the whole global batch per rank (num_items_in_batch /
    # num_processes), so micro-batches and ranks add up to one token mean over the batch.
    return token_loss.sum() / normalizer  # ()


def _luspo(token_loss, valid, n_conflict, normalizer) -> Tensor:
    # TRL's "luspo": token sum per completion, then mean over completions (length-unbiased sequence loss).
    return token_loss.sum(dim=-1).sum() / max(token_loss.shape[0], 1)  # ()


def _reference(token_loss, valid, n_conflict, normalizer) -> Tensor:
    # Authors' code (Listing 3): each completion's token mean / max(#conflict positions, 1), summed.
    per_completion = token_loss.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)
    return (per_completion / n_conflict.clamp(min=1)).sum()  # ()


register_normaliser("sequence", _sequence)
register_normaliser("bnpo", _bnpo)
register_normaliser("dr_grpo", _dr_grpo, needs="max_completion_length")
register_normaliser("dapo", _token_sum, needs="token_normalizer", scale="token_sum")
register_normaliser("luspo", _luspo)
register_normaliser("reference", _reference, scale="group_sum")

# TRL 1.16's loss types that compose with GTPO's λ, δ and γ (docs/core.md), each as TRL normalises it.
register_loss_type("grpo", surrogate="clip", normaliser="sequence")
register_loss_type("bnpo", surrogate="clip", normaliser="bnpo")
register_loss_type("dr_grpo", surrogate="clip", normaliser="dr_grpo")
register_loss_type("dapo", surrogate="clip", normaliser="dapo")
register_loss_type("cispo", surrogate="cispo", normaliser="dapo")
register_loss_type("sapo", surrogate="sapo", normaliser="sequence")
register_loss_type("luspo", surrogate="clip", normaliser="luspo")
register_loss_type("vespo", surrogate="vespo", normaliser="dapo")
