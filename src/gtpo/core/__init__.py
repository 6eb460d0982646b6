"""The paper's math in pure torch (arXiv 2508.03772, Sec. 5): conflict spans, weights λ, entropy filter δ, the loss.

Imports no other gtpo package and no trainer: tensors in, tensors out. `algorithm` reads in the paper's order;
`conflicts` finds the shared positions, `checks` validates inputs, `metrics` reports what the loss did.
"""

from gtpo.core.algorithm import (
    ADVANTAGE_SCALES,
    AGGREGATIONS,
    COMBINE_MODES,
    ENTROPY_FILTERS,
    ENTROPY_TERMS,
    LN2,
    ZERO_ADVANTAGE_RTOL,
    advantage_signs,
    conflict_spans,
    conflict_weights,
    entropy_keep_mask,
    group_advantages,
    gtpo_loss,
    mean_completion_entropy,
    shift_advantages,
    token_entropy,
    validate_group_batch,
)
from gtpo.core.conflicts import PAIRWISE_MAX_GROUP, aligned_conflicts
from gtpo.core.metrics import loss_metrics

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "COMBINE_MODES",
    "ENTROPY_FILTERS",
    "ENTROPY_TERMS",
    "LN2",
    "PAIRWISE_MAX_GROUP",
    "ZERO_ADVANTAGE_RTOL",
    "advantage_signs",
    "aligned_conflicts",
    "conflict_spans",
    "conflict_weights",
    "entropy_keep_mask",
    "group_advantages",
    "gtpo_loss",
    "loss_metrics",
    "mean_completion_entropy",
    "shift_advantages",
    "token_entropy",
    "validate_group_batch",
]
