"""The paper's math in pure torch (arXiv 2508.03772, Sec. 5): conflict spans, weights λ, entropy filter δ, the loss.

Imports no other gtpo package and no trainer: tensors in, tensors out. The modules read in the paper's order:
`advantages` (§1, Eq. 8), `spans` (§2–3, Sec. 5.1, Eq. 5), `entropy` (§4–6, Eq. 6 and the shift of Eq. 7), `loss`
(§7, Eq. 7); `registry` holds the loss types (surrogates × normalisers), `inputs` the loss's dataclasses, `conflicts`
finds the shared positions, `checks` validates inputs, `metrics` reports what the loss did.
"""

from gtpo.core import registry
from gtpo.core.advantages import ADVANTAGE_SCALES, ZERO_ADVANTAGE_RTOL, advantage_signs, group_advantages
from gtpo.core.checks import validate_group_batch
from gtpo.core.conflicts import PAIRWISE_MAX_GROUP, aligned_conflicts
from gtpo.core.entropy import (
    ENTROPY_FILTERS,
    ENTROPY_TERMS,
    LN2,
    entropy_keep_mask,
    fold_logits,
    mean_completion_entropy,
    new_statistics,
    shift_advantages,
    statistics_entropy,
    token_entropy,
)
from gtpo.core.inputs import AdvantageTerms, LossInputs, LossSettings
from gtpo.core.loss import AGGREGATIONS, advantage_terms, gtpo_loss, policy_loss
from gtpo.core.metrics import loss_metrics
from gtpo.core.spans import COMBINE_MODES, conflict_spans, conflict_weights

__all__ = [
    "ADVANTAGE_SCALES",
    "AdvantageTerms",
    "LossInputs",
    "LossSettings",
    "AGGREGATIONS",
    "COMBINE_MODES",
    "ENTROPY_FILTERS",
    "ENTROPY_TERMS",
    "LN2",
    "PAIRWISE_MAX_GROUP",
    "ZERO_ADVANTAGE_RTOL",
    "advantage_signs",
    "advantage_terms",
    "aligned_conflicts",
    "conflict_spans",
    "conflict_weights",
    "entropy_keep_mask",
    "fold_logits",
    "group_advantages",
    "gtpo_loss",
    "loss_metrics",
    "mean_completion_entropy",
    "new_statistics",
    "policy_loss",
    "registry",
    "shift_advantages",
    "statistics_entropy",
    "token_entropy",
    "validate_group_batch",
]
