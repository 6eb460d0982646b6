"""The ``gtpo/`` metrics that `gtpo.core.gtpo_loss` returns next to the loss.

Detached float32 scalars on the input device, no host transfer; a fraction whose denominator is empty
is 0, not nan. ``active`` = rows with A ≠ 0 by `gtpo.core.advantage_signs` (the rows that take part in
conflict detection). Formulas: docs/core.md, "Metrics"; how they are logged: docs/metrics.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["loss_metrics"]


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    return num.float() / den.float().clamp(min=1)  # () 0 when the denominator is empty


@torch.no_grad()
def loss_metrics(
    valid: Tensor,
    signs: Tensor,
    fw: Tensor,
    bw: Tensor,
    lam: Tensor,
    keep: Tensor,
    mean_h: Tensor | None,
    a_used: Tensor,
) -> dict[str, Tensor]:
    """Metrics of one `gtpo_loss` call.

    Args:
        valid, fw, bw: (N, T) bool mask and spans (spans already within the mask).
        signs: (N,) float signs of the original advantages, in {-1, 0, 1}.
        lam: (N, T) λ. keep: (N,) bool δ_i. mean_h: (N,) ⟨H⟩_i or None. a_used: (N,) A'_i.

    >>> m = loss_metrics(torch.ones(1, 2, dtype=torch.bool), torch.ones(1), torch.tensor([[True, False]]),
    ...                  torch.zeros(1, 2, dtype=torch.bool), torch.tensor([[2.0, 1.0]]),
    ...                  torch.ones(1, dtype=torch.bool),
    ...                  None, torch.ones(1))
    >>> m["gtpo/conflict_token_frac"].item(), m["gtpo/mean_lambda"].item()
    (0.5, 1.5)
    """
    active = (signs != 0).unsqueeze(-1)  # (N, 1) rows that take part in conflict detection (advantage_signs)
    negative = (signs < 0).unsqueeze(-1)  # (N, 1)
    n_active = active.sum()  # ()
    metrics = {
        "gtpo/conflict_token_frac": _ratio(((fw | bw) & active).sum(), (valid & active).sum()),
        "gtpo/forward_span_len": _ratio((fw & active).sum(), n_active),
        "gtpo/backward_span_len": _ratio((bw & active).sum(), n_active),
        "gtpo/protected_negative_frac": _ratio(((lam == 0) & valid & negative).sum(), (valid & negative).sum()),
        "gtpo/filtered_frac": (~keep).sum().float() / max(keep.numel(), 1),
        "gtpo/mean_lambda": _ratio(torch.where(valid, lam, 0.0).sum(), valid.sum()),
        # Kept rows whose positive A the shift A' = A − γ⟨H⟩ turns negative, over kept rows with A≠0.
        "gtpo/sign_flipped_frac": _ratio((keep & (signs > 0) & (a_used < 0)).sum(), (keep & (signs != 0)).sum()),
    }
    if mean_h is not None:
        nonempty = valid.any(dim=-1)  # (N,)
        metrics["gtpo/mean_entropy"] = _ratio(torch.where(nonempty, mean_h, 0.0).sum(), nonempty.sum())
    return {k: v.detach() for k, v in metrics.items()}
