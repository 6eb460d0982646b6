"""What `gtpo.core.gtpo_loss` takes: the tensors of one micro-batch, and the settings of the loss.

Tensors and hyper-parameters are kept apart, as torchtune's losses keep settings in ``__init__`` and tensors in
``forward`` (and prime-rl passes one ``LossInputs``): a new option is one field here, read where it is used.
N completions in right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


@dataclass
class LossInputs:
    """The tensors of one micro-batch.

    Attributes:
        per_token_logps: (N, T) log-probabilities of the sampled tokens under the current policy.
        completion_mask: (N, T) bool or 0/1, True at valid tokens.
        advantages: (N,) A_i of Eq. (8).
        forward_span, backward_span: (N, T) bool spans from `conflict_spans`, or None (λ = 1).
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
        entropy_filter, entropy_threshold, initial_entropy: δ's settings (Eq. 6; `entropy_keep_mask`).
        gamma, entropy_term: the entropy penalty's weight γ and how it enters (Eq. 7; `ENTROPY_TERMS`).
        aggregation: a normaliser or loss type of `gtpo.core.registry` (how token losses are reduced).
        surrogate: a surrogate of `gtpo.core.registry` ("clip": Eq. 7).
        epsilon_low, epsilon_high: the clip range of r.
        group_size: G when rows are whole groups, for `advantage_signs` (1: each row alone).
        max_completion_length: the ``dr_grpo`` normaliser's constant.
        delta: cap of the unclipped term's ratio (TRL's two-sided clipping, > 1 + ε_high), or None.
        importance_sampling_level: "token" (Eq. 7) or "sequence" (GSPO's ratio value, GSPO-token's gradient).
        beta, kl_bias_correction: TRL's per-token KL term (k3) to the reference model; 0 in the paper.
        sapo_temperatures: (τ_pos, τ_neg) for the "sapo" surrogate.
    """

    positive_weight: float = 2.0
    combine: str = "union"
    entropy_filter: str = "auto"
    entropy_threshold: float = math.log(2.0)
    initial_entropy: float | Tensor | None = None
    gamma: float = 0.1
    entropy_term: str = "advantage"
    aggregation: str = "sequence"
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
