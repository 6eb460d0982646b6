"""The paper's math in pure torch (arXiv 2508.03772, Sec. 5): conflict spans, weights λ, entropy filter δ, the loss.

Imports no other gtpo package and no trainer: tensors in, tensors out. The modules read in the paper's order:
`advantages` (§1, Eq. 8), `spans` (§2–3, Sec. 5.1, Eq. 5), `entropy` (§4–6, Eq. 6 and the shift of Eq. 7), `loss`
(§7, Eq. 7); `registry` holds the loss types (surrogates × normalisers), `inputs` the loss's dataclasses, `conflicts`
finds the shared positions, `checks` validates inputs, `metrics` reports what the loss did, `paper` holds the
paper's constants and defaults.

Names are loaded on first use (PEP 562), so ``from gtpo.core.paper import LN2`` does not import torch.
"""

from __future__ import annotations

import importlib

# Where each exported name lives: loaded on first use, so that the torch-free `paper` module stays cheap to import.
_EXPORTS = {
    "ADVANTAGE_SCALES": "advantages",
    "ZERO_ADVANTAGE_RTOL": "advantages",
    "advantage_signs": "advantages",
    "group_advantages": "advantages",
    "validate_group_batch": "checks",
    "PAIRWISE_MAX_GROUP": "conflicts",
    "aligned_conflicts": "conflicts",
    "ENTROPY_FILTERS": "entropy",
    "ENTROPY_TERMS": "entropy",
    "EntropyFilter": "entropy",
    "clamped_entropy_terms": "entropy",
    "entropy_keep_mask": "entropy",
    "fold_logits": "entropy",
    "mean_completion_entropy": "entropy",
    "new_statistics": "entropy",
    "shift_advantages": "entropy",
    "statistics_entropy": "entropy",
    "token_entropy": "entropy",
    "AdvantageTerms": "inputs",
    "LossInputs": "inputs",
    "LossSettings": "inputs",
    "AGGREGATIONS": "loss",
    "advantage_terms": "loss",
    "gtpo_loss": "loss",
    "loss_metrics": "metrics",
    "push_against_group": "metrics",
    "LN2": "paper",
    "COMBINE_MODES": "spans",
    "SPAN_SIDES": "spans",
    "CONFLICT_COUNTS": "spans",
    "conflict_spans": "spans",
    "conflict_weights": "spans",
    "contested_tokens": "spans",
    "common_prefix_conflicts": "spans",
    "leave_to_group": "spans",
}
_SUBMODULES = ("registry", "paper")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
