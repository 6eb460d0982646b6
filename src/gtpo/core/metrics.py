"""The ``gtpo/`` metrics that `gtpo.core.gtpo_loss` returns next to the loss.

Detached float32 scalars on the input device, no host transfer; a fraction whose denominator is empty
is 0, not nan. ``active`` = rows with A ≠ 0 by `gtpo.core.advantage_signs` (the rows that take part in
conflict detection). Formulas: docs/core.md, "Metrics"; how they are logged: docs/metrics.md.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from gtpo.core.advantages import _signs
from gtpo.core.spans import _net_advantage, net_advantage_tolerance

__all__ = ["loss_metrics", "push_against_group"]


# Where each metric's numerator and denominator sit in the (row, weight) table `loss_metrics` builds: one (K, N) table
# of per-completion counts times one (N, 3) table of row weights gives every sum in one reduction, so the metrics cost
# about 30 operator calls instead of 75 (on a GPU a small model's step is bound by kernel launches, and these ran at
# every micro-batch: docs/performance.md). Rows of the table:
_VALID, _SPAN, _FORWARD, _BACKWARD, _PROTECTED, _LAMBDA = range(6)  # per-token counts (and λ) summed per row
_FILTERED, _FLIPPED, _KEPT_ACTIVE, _NONEMPTY, _ENTROPY, _ONE = range(6, 12)  # per-row flags (and ⟨H⟩_i)
# Columns: the rows summed over, by the row weights `active` (A ≠ 0), `negative` (A < 0), every row.
_ACTIVE, _NEGATIVE, _ALL = range(3)
_COLUMNS = _ALL + 1
# key: (numerator, denominator), each a (table row, column).
_FRACTIONS = {
    "gtpo/conflict_token_frac": ((_SPAN, _ACTIVE), (_VALID, _ACTIVE)),
    "gtpo/forward_span_len": ((_FORWARD, _ACTIVE), (_ONE, _ACTIVE)),
    "gtpo/backward_span_len": ((_BACKWARD, _ACTIVE), (_ONE, _ACTIVE)),
    "gtpo/protected_negative_frac": ((_PROTECTED, _NEGATIVE), (_VALID, _NEGATIVE)),
    "gtpo/filtered_frac": ((_FILTERED, _ALL), (_ONE, _ALL)),
    "gtpo/mean_lambda": ((_LAMBDA, _ALL), (_VALID, _ALL)),
    # Kept rows whose positive A the shift A' = A − γ⟨H⟩ turns negative, over kept rows with A≠0.
    "gtpo/sign_flipped_frac": ((_FLIPPED, _ALL), (_KEPT_ACTIVE, _ALL)),
    "gtpo/mean_entropy": ((_ENTROPY, _ALL), (_NONEMPTY, _ALL)),
}


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

    Returns:
        {key: () float32}, the fractions of docs/core.md's "Metrics" table, each numerator over its denominator
        clamped at 1 (0 where it is empty); ``gtpo/mean_entropy`` only with ``mean_h``.

    >>> m = loss_metrics(torch.ones(1, 2, dtype=torch.bool), torch.ones(1), torch.tensor([[True, False]]),
    ...                  torch.zeros(1, 2, dtype=torch.bool), torch.tensor([[2.0, 1.0]]),
    ...                  torch.ones(1, dtype=torch.bool),
    ...                  None, torch.ones(1))
    >>> m["gtpo/conflict_token_frac"].item(), m["gtpo/mean_lambda"].item()
    (0.5, 1.5)
    """
    lam = lam.float()
    token_counts = torch.stack([valid, fw | bw, fw, bw, (lam == 0) & valid]).sum(-1, dtype=torch.float32)  # (5, N)
    lambda_sums = torch.where(valid, lam, 0.0).sum(-1)  # (N,)
    nonempty = token_counts[_VALID] > 0  # (N,)
    entropy = torch.zeros_like(lambda_sums) if mean_h is None else torch.where(nonempty, mean_h.float(), 0.0)  # (N,)
    row_flags = torch.stack(
        [~keep, keep & (signs > 0) & (a_used < 0), keep & (signs != 0), nonempty, torch.ones_like(nonempty)]
    )  # (5, N) filtered, flipped, kept with A≠0, non-empty, one
    table = torch.cat([token_counts, lambda_sums[None], row_flags.float()[:4], entropy[None], row_flags[4:].float()])
    weights = torch.stack([signs != 0, signs < 0, torch.ones_like(nonempty)], dim=1).float()  # (N, 3)
    totals = (table[:, :, None] * weights).sum(1)  # (12, 3); not a matmul, which TF32 would round on a GPU
    keys = tuple(k for k in _FRACTIONS if mean_h is not None or k != "gtpo/mean_entropy")
    numerators, denominators = _positions(keys, totals.device)
    flat = totals.flatten()  # (36,)
    fractions = flat[numerators] / flat[denominators].clamp(min=1)  # (K,) 0 where a denominator is empty
    return dict(zip(keys, fractions.unbind(), strict=True))


@functools.lru_cache(maxsize=16)
def _positions(keys: tuple[str, ...], device: torch.device) -> tuple[Tensor, Tensor]:
    """The flat positions in the (12, 3) totals of ``keys``' numerators and denominators, (K,) each, made once per
    device (a tensor built from a list is a host-to-device copy on a GPU)."""
    numerators = [row * _COLUMNS + column for row, column in (_FRACTIONS[k][0] for k in keys)]
    denominators = [row * _COLUMNS + column for row, column in (_FRACTIONS[k][1] for k in keys)]
    return torch.tensor(numerators, device=device), torch.tensor(denominators, device=device)


@torch.no_grad()
def push_against_group(
    completion_ids: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    group_size: int,
    forward: Tensor,
    backward: Tensor,
    lam: Tensor,
) -> Tensor:
    """The share of λ's net push up on span tokens that lands where the group's advantages do not favour the token.

    For a span token at an aligned position (from the start in M^fw, from the end in M^bw), its *sharers* are the rows
    of its group holding the same token there. Without the correction their summed update on it is, up to length
    weights and the token's gradient, S = Σ_j A_j; with λ it is U = Σ_j λ_j·A_j (each sharer's λ at that position).
    Where the sharers' prefixes are identical their gradients are too, so S is the group's exact evidence on the
    token (`common_prefix_conflicts`). Eq. (5) gives U = 2·Σ_{A_j>0} A_j whatever S: an opening that fails more often
    than the group (S < 0), or one the whole group shares (S = 0 under Eq. 8), is pushed up because it is shared, the
    lock-in of study G (docs/studies/lockin.md). This is Σ U/n over the span tokens with U > 0 and S ≤ tol, divided by
    Σ U/n over the span tokens with U > 0 (n the sharers, so that a shared token counts about once; forward and
    backward spans each counted; tol = G·ZERO_ADVANTAGE_RTOL·max(1, max|A|), the rounding of a sum of G advantages);
    0 when nothing is pushed up. Signs as Eq. (5)'s, before the entropy filter and shift.

    Cost: 3·G passes over (N, W) per side, W the longest span on that side; two host syncs.

    Args:
        completion_ids: (N, T) integer token ids, right-padded.
        completion_mask: (N, T) bool or 0/1, True at valid tokens.
        advantages: (N,) A_i, before any entropy shift.
        group_size: G; rows g*G .. g*G+G-1 form group g.
        forward, backward: (N, T) bool spans the correction acts on (after any `SPAN_SIDES` choice).
        lam: (N, T) the λ the loss applies (`conflict_weights`, with the guard or the common prefix if set).

    Returns:
        () float32 in [0, 1].

    >>> ids = torch.tensor([[5, 7], [5, 8], [6, 9]])  # 5 opens rows 0 (A>0) and 1 (A<0): S = 1 - 2 < 0
    >>> a, mask = torch.tensor([1.0, -2.0, 1.0]), torch.ones(3, 2, dtype=torch.bool)
    >>> from gtpo.core.spans import conflict_spans, conflict_weights
    >>> fw, bw = conflict_spans(ids, mask, a, 3)
    >>> push_against_group(ids, mask, a, 3, fw, bw, conflict_weights(fw, bw, a, group_size=3)).item()  # U = 2 > 0
    1.0
    >>> push_against_group(ids, mask, a, 3, fw, bw, torch.ones(3, 2)).item()  # λ = 1: U = S < 0, nothing pushed up
    0.0
    """
    valid = completion_mask.bool()  # (N, T)
    signs = _signs(advantages, group_size)  # (N,)
    a = torch.where(signs != 0, advantages.detach().float(), 0.0)  # (N,)
    tol = net_advantage_tolerance(a, group_size)  # (N, 1) the stall guard's
    lengths = valid.sum(dim=-1, keepdim=True)  # (N, 1)
    against = pushed = torch.zeros((), dtype=torch.float32, device=completion_ids.device)
    for span, from_end in ((forward, False), (backward, True)):
        width = int(span.sum(dim=-1).max()) if span.numel() else 0
        if not width:
            continue
        offset = torch.arange(width, device=completion_ids.device)  # (W,)
        present = offset < lengths  # (N, W)
        at = (lengths - 1 - offset).clamp(min=0) if from_end else offset.expand_as(present)  # (N, W) positions
        aligned = completion_ids.gather(1, at)  # (N, W)
        in_span = span.gather(1, at) & present  # (N, W)
        lam_a = lam.float().gather(1, at) * a.unsqueeze(-1)  # (N, W) λ_j·A_j
        s = _net_advantage(aligned, present, a, group_size)  # (N, W) S
        u = _net_advantage(aligned, present, torch.where(present, lam_a, 0.0), group_size)  # (N, W) U
        n = _net_advantage(aligned, present, present.float(), group_size).clamp(min=1)  # (N, W) sharers
        up = in_span & (u > tol)  # (N, W)
        share = torch.where(up, u / n, 0.0)  # (N, W)
        pushed = pushed + share.sum()
        against = against + torch.where(s < -tol, share, 0.0).sum()
    return torch.where(pushed > 0, against / pushed.clamp(min=1e-30), 0.0)
