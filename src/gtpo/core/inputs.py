"""What `gtpo.core.gtpo_loss` takes: the tensors of one micro-batch, and the settings of the loss.

Tensors and hyper-parameters are kept apart, as torchtune's losses keep settings in ``__init__`` and tensors in
``forward`` (and prime-rl passes one ``LossInputs``): a new option is one field here, read where it is used.
N completions in right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gtpo.core import paper, registry
from gtpo.core.checks import (
    check_entropy_threshold,
    check_group_size,
    check_number,
    check_weight,
    float_vector_check,
    mask_checks,
    raise_if_any,
)


@dataclass
class LossInputs:
    """The tensors of one micro-batch.

    Attributes:
        per_token_logps: (N, T) log-probabilities of the sampled tokens under the current policy.
        completion_mask: (N, T) bool or 0/1, True at valid tokens.
        advantages: (N,) A_i of Eq. (8).
        forward_span, backward_span: (N, T) bool spans from `conflict_spans`, or None (λ = 1).
        contested_span: (N, T) bool from `contested_tokens` (the stall guard, `conflict_guard`), or None: with it λ is
            0 on these span tokens and 1 elsewhere, instead of Eq. (5); it needs the spans.
        common_prefix_span: (N, T) bool from `common_prefix_conflicts`, or None: with it λ is 1 on these tokens
            (GRPO's update, the group's exact evidence on a shared opening) whatever else applies; it needs the spans.
        old_per_token_logps: (N, T) log-probabilities at sampling time, or None (on-policy, r = 1).
        ref_per_token_logps: (N, T) reference-model log-probabilities, needed when ``beta`` > 0.
        token_entropy: (N, T) entropies in nats, for δ and γ; None when neither is on.
        importance_weights: (N, T) or (N, 1) TRL's vLLM importance-sampling weights, or None.
        token_mask: (N, T) or (N, 1) 0/1 multiplier of the token loss (TRL's top-entropy or off-policy masks).
        sequence_weights: (N,) or (N, 1) VESPO's φ_i (TRL's ``get_gamma_weights``), detached.
        token_normalizer: the token-sum normalisers' divisor (TRL's num_items_in_batch / num_processes).
    """

    per_token_logps: Tensor
    completion_mask: Tensor
    advantages: Tensor
    forward_span: Tensor | None = None
    backward_span: Tensor | None = None
    contested_span: Tensor | None = None
    common_prefix_span: Tensor | None = None
    old_per_token_logps: Tensor | None = None
    ref_per_token_logps: Tensor | None = None
    token_entropy: Tensor | None = None
    importance_weights: Tensor | None = None
    token_mask: Tensor | None = None
    sequence_weights: Tensor | None = None
    token_normalizer: Tensor | float | None = None


@dataclass(frozen=True)
class LossSettings:
    """The settings of GTPO's loss (docs/core.md gives each); the defaults are the paper's.

    Attributes:
        positive_weight, combine: λ's settings (Eq. 5; `conflict_weights`).
        negative_weight, span_sides: λ of a negative completion's span tokens (the paper's 0) and which spans
            (`SPAN_SIDES`: the paper's ``both``); both for ablations.
        conflict_count: how the ``reference`` aggregation counts a completion's conflict positions
            (`CONFLICT_COUNTS`: ``union``, or the authors' code's ``max``).
        entropy_filter, entropy_threshold, initial_entropy: δ's settings (Eq. 6; `entropy_keep_mask`).
        gamma, entropy_term: the entropy penalty's weight γ and how it enters (Eq. 7; `ENTROPY_TERMS`).
        gtpo_aggregation: how token losses are reduced, a normaliser or loss type of `gtpo.core.registry` (the config's
            `gtpo_aggregation` with loss_type="grpo", else the loss_type's own normaliser); one name throughout.
        surrogate: a surrogate of `gtpo.core.registry` ("clip": Eq. 7).
        epsilon_low, epsilon_high: the clip range of r.
        group_size: G when rows are whole groups, for `advantage_signs` (1: each row alone).
        max_completion_length: the ``dr_grpo`` normaliser's constant.
        delta: cap of the unclipped term's ratio (TRL's two-sided clipping, > 1 + ε_high), or None.
        importance_sampling_level: "token" (Eq. 7) or "sequence" (GSPO's ratio value, GSPO-token's gradient).
        beta, kl_bias_correction: TRL's per-token KL term (k3) to the reference model; 0 in the paper.
        sapo_temperatures: (τ_pos, τ_neg) for the "sapo" surrogate.
    """

    positive_weight: float = paper.POSITIVE_WEIGHT
    combine: str = "union"
    negative_weight: float = paper.NEGATIVE_WEIGHT
    span_sides: str = "both"
    conflict_count: str = "union"
    entropy_filter: str = "auto"
    entropy_threshold: float = paper.ENTROPY_THRESHOLD
    initial_entropy: float | Tensor | None = None
    gamma: float = paper.GAMMA
    entropy_term: str = "advantage"
    gtpo_aggregation: str = "sequence"
    surrogate: str = "clip"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    group_size: int = 1
    max_completion_length: int | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    beta: float = 0.0
    kl_bias_correction: bool = False
    sapo_temperatures: tuple[float, float] | None = None


@dataclass
class AdvantageTerms:
    """⟨H⟩_i, δ_i and A'_i of one micro-batch (Eq. 6-7), computed once and shared by the loss and the metrics.

    Attributes:
        signs: (N,) int8 signs of the original advantages (zero within tolerance).
        mean_entropy: (N,) ⟨H⟩_i (differentiable), or None without token entropies.
        keep: (N,) bool δ_i.
        advantages: (N,) A'_i = δ_i·(A_i − γ⟨H⟩_i) (entropy_term="advantage") or δ_i·A_i.
    """

    signs: Tensor
    mean_entropy: Tensor | None
    keep: Tensor
    advantages: Tensor


# Input checks of this module's functions (one host sync per call) -----------------------------------
def _aggregation_normalizer(inputs, settings):
    """The one extra number the normaliser needs (static checks) and its deferred device check, if any."""
    normaliser = registry.normaliser_of(settings.gtpo_aggregation)
    aggregation, max_completion_length, token_normalizer = (
        settings.gtpo_aggregation, settings.max_completion_length, inputs.token_normalizer
    )  # fmt: skip
    if normaliser.needs != "max_completion_length" and max_completion_length is not None:
        raise ValueError(f"max_completion_length is used only by gtpo_aggregation='dr_grpo', not {aggregation!r}")
    if normaliser.needs != "token_normalizer" and token_normalizer is not None:
        others = ", ".join(
            repr(n) for n in sorted(registry.LOSS_TYPES) if registry.LOSS_TYPES[n].token_sum and n != "dapo"
        )
        raise ValueError(
            f"token_normalizer is used only by gtpo_aggregation='dapo' and the other token sums ({others}), not "
            f"{aggregation!r}"
        )
    if normaliser.needs == "max_completion_length":
        if (
            isinstance(max_completion_length, bool)
            or not isinstance(max_completion_length, int)
            or max_completion_length < 1
        ):
            raise ValueError(
                f"gtpo_aggregation={aggregation!r} divides by N × max_completion_length: pass "
                f"max_completion_length=<int >= 1> (the generation limit, TRL's GRPOConfig.max_completion_length), "
                f"got {max_completion_length!r}"
            )
        return max_completion_length, None
    if normaliser.needs is None:
        return None, None
    hint = (
        f"gtpo_aggregation={aggregation!r} divides by the valid tokens of the whole global batch per rank: pass "
        "token_normalizer=<number > 0> (TRL: num_items_in_batch / num_processes)"
    )
    if isinstance(token_normalizer, Tensor):
        if token_normalizer.numel() != 1 or token_normalizer.is_complex():
            raise ValueError(f"{hint}, got a tensor of shape {tuple(token_normalizer.shape)}")
        value = token_normalizer.detach().reshape(()).float()  # () stays on its device
        return value, (~(torch.isfinite(value) & (value > 0)), lambda: f"{hint}, got {value.item()!r}")
    if (
        isinstance(token_normalizer, bool)
        or not isinstance(token_normalizer, (int, float))
        or not (math.isfinite(token_normalizer) and token_normalizer > 0)
    ):
        raise ValueError(f"{hint}, got {token_normalizer!r}")
    return float(token_normalizer), None


def _shape_of(value) -> object:
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def check_loss_options(inputs, settings) -> None:
    """The checks of `gtpo.core.gtpo_loss`'s GRPOConfig options (docs/core.md): shapes and ranges, no sync.

    Args:
        inputs, settings: `gtpo.core.inputs.LossInputs` and `LossSettings`.
    """
    logps = inputs.per_token_logps
    shape = tuple(logps.shape) if isinstance(logps, Tensor) else (0, 0)
    surrogate = registry.surrogate_of(settings.surrogate)
    if surrogate.check is not None:
        surrogate.check(inputs, settings, shape)
    if settings.importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"importance_sampling_level must be 'token' or 'sequence', got {settings.importance_sampling_level!r}"
        )
    delta, beta = settings.delta, settings.beta
    if delta is not None:
        check_number(delta, "delta")
        if delta <= 1 + settings.epsilon_high:
            raise ValueError(
                f"delta must exceed 1 + epsilon_high = {1 + settings.epsilon_high} (it caps r), got {delta}"
            )
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    n, token_mask, ref = shape[0], inputs.token_mask, inputs.ref_per_token_logps
    if token_mask is not None and (
        not isinstance(token_mask, Tensor) or tuple(token_mask.shape) not in (shape, (n, 1))
    ):
        raise ValueError(f"token_mask must have shape {shape} or {(n, 1)}, got {_shape_of(token_mask)}")
    if beta and (not isinstance(ref, Tensor) or tuple(ref.shape) != shape):
        got = tuple(ref.shape) if isinstance(ref, Tensor) else ref
        raise ValueError(f"beta > 0 needs ref_per_token_logps of shape {shape}, got {got}")


def check_loss_inputs(inputs, settings) -> tuple[Tensor, float | Tensor | None]:
    """All checks of `gtpo.core.gtpo_loss` (mode names already looked up), with one sync.

    Args:
        inputs, settings: `gtpo.core.inputs.LossInputs` and `LossSettings`.

    Returns:
        ``(valid, normalizer)``: the (N, T) bool mask, and the normaliser's extra number
        (``max_completion_length`` for ``dr_grpo``, ``token_normalizer`` for the token sums, else None).
    """
    check_weight(settings.positive_weight)
    check_weight(settings.negative_weight, "negative_weight")
    check_entropy_threshold(settings.entropy_threshold, "entropy_threshold")
    for name in ("gamma", "epsilon_low", "epsilon_high"):
        check_number(getattr(settings, name), name)
    if settings.epsilon_low < 0 or settings.epsilon_high < 0:
        raise ValueError(
            f"epsilon_low and epsilon_high must be >= 0, got {settings.epsilon_low}, {settings.epsilon_high}"
        )
    logps = inputs.per_token_logps
    if not isinstance(logps, Tensor) or logps.dim() != 2 or not logps.is_floating_point():
        raise ValueError("per_token_logps must be an (N, T) floating tensor")
    shape = tuple(logps.shape)
    n = shape[0]
    # Any 0/1 mask works for the loss; right padding only matters where the spans are computed.
    valid, checks = mask_checks(inputs.completion_mask, shape, right_padded=False)
    checks.append(float_vector_check(inputs.advantages, n, "advantages"))
    forward_span, backward_span = inputs.forward_span, inputs.backward_span
    if (forward_span is None) != (backward_span is None):
        raise ValueError("pass both forward_span and backward_span (from conflict_spans), or neither")
    if inputs.contested_span is not None and forward_span is None:
        raise ValueError("contested_span (the guard) needs forward_span and backward_span (from conflict_spans)")
    if inputs.common_prefix_span is not None and forward_span is None:
        raise ValueError("common_prefix_span needs forward_span and backward_span (from conflict_spans)")
    spans = ("forward_span", "backward_span", "contested_span", "common_prefix_span")
    for name in (*spans, "old_per_token_logps", "token_entropy"):
        t = getattr(inputs, name)
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != shape):
            raise ValueError(f"{name} must have the shape of per_token_logps {shape}, got {_shape_of(t)}")
    weights = inputs.importance_weights
    if weights is not None and (not isinstance(weights, Tensor) or tuple(weights.shape) not in (shape, (n, 1))):
        raise ValueError(
            f"importance_weights must have shape {shape} or {(n, 1)} (per token or per sequence), got "
            f"{_shape_of(weights)}"
        )
    if forward_span is not None and (forward_span.dtype != torch.bool or backward_span.dtype != torch.bool):
        raise ValueError("forward_span and backward_span must be bool tensors (from conflict_spans)")
    if inputs.contested_span is not None and inputs.contested_span.dtype != torch.bool:
        raise ValueError("contested_span must be a bool tensor (from contested_tokens)")
    if inputs.common_prefix_span is not None and inputs.common_prefix_span.dtype != torch.bool:
        raise ValueError("common_prefix_span must be a bool tensor (from common_prefix_conflicts)")
    entropy_filter, entropy_term, gamma = settings.entropy_filter, settings.entropy_term, settings.gamma
    needs_entropy = entropy_filter != "never" or (entropy_term != "none" and gamma != 0)
    if inputs.token_entropy is None and needs_entropy:
        raise ValueError(
            f"token_entropy is needed for entropy_filter={entropy_filter!r} with entropy_term={entropy_term!r}, "
            f"gamma={gamma}: pass token_entropy (see token_entropy()), or switch the entropy parts off with "
            "entropy_filter='never' and gamma=0 (or entropy_term='none')"
        )
    check_group_size(settings.group_size, n, "completions")
    normalizer, normalizer_check = _aggregation_normalizer(inputs, settings)
    if normalizer_check is not None:
        checks.append(normalizer_check)
    raise_if_any(checks)
    if isinstance(normalizer, Tensor):
        normalizer = normalizer.to(logps.device)
    return valid, normalizer
