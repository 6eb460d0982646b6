"""§4–6 of GTPO in the paper's order: entropy H and ⟨H⟩_i (Sec. 4.2), the completion filter δ_i (Eq. 6) and
the shifted advantages A'_i = δ_i(A_i − γ⟨H⟩_i) (Eq. 7).

N completions in right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g;
``A_i`` an advantage, ``o_i`` the valid tokens (``completion_mask``). No trainer, no logging.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from gtpo.core.advantages import _signs
from gtpo.core.checks import (
    check_entropy_threshold,
    check_group_size,
    check_number,
    float_vector_check,
    lookup,
    mask_checks,
    raise_if_any,
)
from gtpo.core.paper import ENTROPY_THRESHOLD, LN2

# 4. Entropy H (Sec. 4.2) and ⟨H⟩_i ----------------------------------------------------------------
_ENTROPY_CHUNK_ELEMS = 1 << 26  # logits (float32) per chunk of `token_entropy`: 256 MiB per temporary


def token_entropy(logits: Tensor, *, chunk_rows: int | None = None) -> Tensor:
    """Entropy H = -Σ_v p_v ln p_v (nats) of each next-token distribution (Sec. 4.2).

    Untempered logits give the paper's H (the trainer's default); tempered ones the sampling distribution's.
    A thin wrapper over `fold_logits`, the same per-tile statistics the trainer's single-pass LM head
    (`gtpo.forward.lm_head.token_scores`) folds, so both compute H the same way. Float32 math over chunks of
    ``chunk_rows`` rows (default ≈2**26 logits, 256 MiB per temporary); -inf logits give 0. Differentiable: use
    ``torch.no_grad()`` unless a gradient is needed.

    Args:
        logits: (..., T, V) next-token logits, any float dtype.
        chunk_rows: rows of the flattened (rows, V) logits per chunk (None: about 2**26 logits per chunk).

    Returns:
        (..., T) float32 entropies in nats.

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
    parts = []
    for chunk in flat.split(rows):
        # clamp: a -inf logit has p = 0 and must give 0·ln 0 = 0, not 0·(-inf) = nan (value or gradient).
        z = chunk.float().clamp(min=torch.finfo(torch.float32).min)  # (rows, V)
        stats = new_statistics(z.shape[0], z.device)
        fold_logits(z, stats)
        parts.append(statistics_entropy(stats))  # (rows,)
    return torch.cat(parts).view(logits.shape[:-1])  # (..., T)


def new_statistics(n: int, device, temperatures: int = 1) -> list[Tensor]:
    """Running statistics of n distributions for `fold_logits`: [max, s₁, x₁] (+ [s_T, x_T] with 2 temperatures)."""
    stats = [torch.full((n,), -math.inf, device=device)]
    return stats + [torch.zeros(n, device=device) for _ in range(2 * temperatures)]


def fold_logits(z: Tensor, stats: list[Tensor], inv_t: float | None = None) -> None:
    """Fold one (n, c) tile of raw float32 logits into the running statistics (online log-sum-exp).

    With running max m (shared by both temperatures, since T > 0 keeps the argmax): s₁ = Σ e^{z−m},
    x₁ = Σ z·e^{z−m}, and, when ``inv_t`` = 1/T is given, s_T = Σ e^{(z−m)/T}, x_T = Σ z·e^{(z−m)/T}. Tiles of the
    vocabulary may come in any order; `statistics_entropy` turns the totals into H. Replaces the entries of the
    ``stats`` list.

    Args:
        z: (n, c) float32 logits of one vocabulary tile (after any logit scale or soft-capping).
        stats: from `new_statistics` (with ``temperatures=2`` when ``inv_t`` is given).
        inv_t: 1/T for the tempered statistics, or None.
    """
    m, s1, x1 = stats[:3]
    new_m = torch.maximum(m, z.amax(dim=1))  # (n,)
    shift = m - new_m  # (n,) -inf on the first tile, where the sums are still 0
    e = z - new_m.unsqueeze(1)  # (n, c) z - m
    e1 = torch.exp(e)
    # The (n,) statistics are replaced, not updated in place, so that autograd can differentiate H; the (n, c)
    # buffer is reused in place when no gradient is recorded (the trainer's LM head, forward or recomputed).
    stats[1] = s1 * torch.exp(shift) + e1.sum(dim=1)
    stats[2] = x1 * torch.exp(shift) + _rowdot(e1, z)
    if inv_t is not None:
        del e1
        et = torch.exp(e * inv_t) if z.requires_grad else e.mul_(inv_t).exp_()  # (n, c) e^{(z - m)/T}
        stats[3] = stats[3] * torch.exp(shift * inv_t) + et.sum(dim=1)
        stats[4] = stats[4] * torch.exp(shift * inv_t) + _rowdot(et, z)
    stats[0] = new_m


def statistics_entropy(stats: list[Tensor], inv_t: float | None = None) -> Tensor:
    """(n,) entropy from folded statistics: H₁ = log Z₁ − x₁/s₁, or H_T = log Z_T − (x_T/s_T)/T with ``inv_t``."""
    m = stats[0]
    if inv_t is None:
        return m + torch.log(stats[1]) - stats[2] / stats[1]
    return m * inv_t + torch.log(stats[3]) - inv_t * stats[4] / stats[3]


def clamped_entropy_terms(z: Tensor, log_normaliser: Tensor, clamp: float) -> Tensor:
    """One vocabulary tile's share of the entropy with p clamped inside the log, −Σ_v p_v·ln max(p_v, clamp): what the
    authors' released code computes (``torch.clamp(probs, min=1e-6)`` in the log), a lower value than H wherever
    p_v < clamp. Summed over the tiles of a row it is that row's clamped entropy.

    Args:
        z: (n, c) float32 logits of one tile; log_normaliser: (n,) the rows' log Σ_v e^{z_v} over the whole vocabulary.
        clamp: the floor of p inside the log (1e-6 in the authors' code).

    Returns:
        (n,) float32.

    >>> z = torch.log(torch.tensor([[0.5, 0.5 - 1e-8, 1e-8]]))
    >>> lse = torch.logsumexp(z, dim=-1)
    >>> round(clamped_entropy_terms(z, lse, 1e-6).item(), 6)  # ln 2 less 1e-8·(ln 1e-6 − ln 1e-8): 0.693147
    0.693147
    """
    p = torch.exp(z - log_normaliser.unsqueeze(-1))  # (n, c)
    return -(p * torch.log(p.clamp(min=clamp))).sum(dim=-1)  # (n,)


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Σ_j a_ij b_ij per row, (n, V) × (n, V) -> (n,), as one batched dot (no (n, V) temporary)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).reshape(-1)


def mean_completion_entropy(token_entropy: Tensor, completion_mask: Tensor) -> Tensor:
    """⟨H⟩_i, the mean next-token entropy of completion i over its valid tokens (Sec. 4.2, Eq. 6).

    Values at padding are ignored, even if nan; differentiable with respect to ``token_entropy``.

    Args:
        token_entropy: (N, T) per-token entropies in nats.
        completion_mask: (N, T) bool or 0/1, True at valid tokens.

    Returns:
        (N,) float32 ⟨H⟩_i (0 for an empty completion).
    """
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


@dataclass(frozen=True)
class EntropyFilter:
    """A completion filter δ_i mode (Eq. 6).

    Attributes:
        keep: ``(low (N,) bool, signs (N,), ⟨H⟩_ini) -> δ (N,) bool``, where low = (⟨H⟩_i ≤ threshold).
        needs_initial_entropy: the mode reads ⟨H⟩_ini (the trainer measures it before step 1, `gtpo inspect` asks
            for it or stands in the group's mean).
    """

    keep: Callable[[Tensor, Tensor, object], Tensor]
    needs_initial_entropy: bool = False


ENTROPY_FILTERS: dict[str, EntropyFilter] = {
    "auto": EntropyFilter(_keep_auto, needs_initial_entropy=True),
    "always": EntropyFilter(lambda low, signs, h_ini: low),  # authors' code: keep iff ⟨H⟩_i ≤ threshold
    "negative_only": EntropyFilter(lambda low, signs, h_ini: low | (signs >= 0)),  # App. 13 "OnlyNeg": A<0 only
    "never": EntropyFilter(lambda low, signs, h_ini: torch.ones_like(low)),
}
"""Completion filter δ_i modes: ``auto`` (Eq. 6), ``always`` (authors' code), ``negative_only``
(App. 13 "OnlyNeg"), ``never``. A new mode is one entry (the config, the CLI and `gtpo inspect` read this table)."""


def entropy_keep_mask(
    mean_entropy: Tensor,
    advantages: Tensor,
    *,
    mode: str,
    threshold: float = ENTROPY_THRESHOLD,
    initial_entropy: float | Tensor | None = None,
    group_size: int = 1,
) -> Tensor:
    """The completion filter δ_i of Eq. (6): True where a completion keeps its advantage.

    Low-entropy means ⟨H⟩_i ≤ threshold (equality keeps, Eq. 6 rows 2–3 and the authors' ``<=``).

    Args:
        mean_entropy: (N,) ⟨H⟩_i in nats.
        advantages: (N,) original advantages (the sign decides ``negative_only``).
        mode: ``auto``: if ⟨H⟩_ini < ln 2 keep only low-entropy completions, else all (the gate is ln 2, not
            ``threshold``); ``always``: keep only low-entropy; ``negative_only``: drop only A<0 completions that
            are not low-entropy (App. 13, OnlyNeg); ``never``: keep all.
        threshold: nats (ln 2; the authors used 0.7, 1.02–1.05 for Qwen).
        initial_entropy: ⟨H⟩_ini, a float or 0-d tensor; needed by ``auto``.
        group_size: G for `advantage_signs`.

    Returns:
        (N,) bool δ_i.
    """
    entropy_filter = lookup(ENTROPY_FILTERS, mode, "entropy_filter mode")
    check_keep_inputs(mean_entropy, advantages, threshold, group_size)
    return _keep(mean_entropy, _signs(advantages, group_size), entropy_filter, threshold, initial_entropy)  # (N,)


def _keep(mean_entropy: Tensor, signs: Tensor, entropy_filter: EntropyFilter, threshold: float, initial_entropy):
    low = mean_entropy.detach() <= threshold  # (N,) equality keeps (Eq. 6 row 3); nan is never low
    return entropy_filter.keep(low, signs, initial_entropy)  # (N,) δ_i


# 6. Shifted advantages A'_i (Eq. 7's δ and −γ⟨H⟩_i, as in the authors' code) ----------------------
ENTROPY_TERMS = ("advantage", "differentiable", "none")
"""How −γ⟨H⟩_i enters: advantage shift (authors' code), differentiable +γ·mean⟨H⟩ term, or not at all."""


def shift_advantages(advantages: Tensor, mean_entropy: Tensor, keep: Tensor, gamma: float) -> Tensor:
    """The shifted advantages of Eq. (7): A'_i = δ_i · (A_i − γ·⟨H⟩_i), with ⟨H⟩_i detached.

    Args:
        advantages: (N,) A_i.
        mean_entropy: (N,) ⟨H⟩_i in nats.
        keep: (N,) bool δ_i from `entropy_keep_mask`.
        gamma: γ ≥ 0 (the paper's 0.1).

    Returns:
        (N,) A'_i in float32 or wider.
    """
    check_shift_inputs(advantages, mean_entropy, keep, gamma)
    return _shift(advantages, mean_entropy, keep, gamma)  # (N,)


def _shift(advantages: Tensor, mean_entropy: Tensor, keep: Tensor, gamma: float) -> Tensor:
    dtype = torch.promote_types(advantages.dtype, torch.float32)
    shifted = advantages.to(dtype) - gamma * mean_entropy.detach().to(dtype)  # (N,)
    return torch.where(keep, shifted, 0.0)  # (N,)


# Input checks of this module's functions (one host sync per call) -----------------------------------
def initial_entropy_value(initial_entropy, device: torch.device) -> float | Tensor:
    """⟨H⟩_ini for ``entropy_filter='auto'``: a float, or a () tensor moved to ``device`` (no sync)."""
    if initial_entropy is None:
        raise ValueError(
            "entropy_filter='auto' needs initial_entropy, the model's mean completion entropy ⟨H⟩_ini "
            "measured before training (Eq. 6; e.g. mean_completion_entropy over completions of the first "
            "100 training prompts, averaged). Pass initial_entropy=<float>, or choose entropy_filter="
            "'always' or 'never'."
        )
    if isinstance(initial_entropy, Tensor):
        if initial_entropy.numel() != 1:
            raise ValueError(f"initial_entropy must be a scalar, got shape {tuple(initial_entropy.shape)}")
        return initial_entropy.to(device).reshape(())  # () stays on the device
    if isinstance(initial_entropy, bool) or not isinstance(initial_entropy, (int, float)):
        raise ValueError(f"initial_entropy must be a scalar number of nats, got {initial_entropy!r}")
    if not math.isfinite(initial_entropy) or initial_entropy < 0:
        raise ValueError(f"initial_entropy must be a finite entropy >= 0 (nats), got {initial_entropy!r}")
    return float(initial_entropy)


def check_keep_inputs(mean_entropy, advantages, threshold, group_size) -> None:
    """Checks of `gtpo.core.entropy_keep_mask` once its mode is looked up (one sync)."""
    check_entropy_threshold(threshold)
    if not isinstance(mean_entropy, Tensor) or mean_entropy.dim() != 1:
        raise ValueError("mean_entropy must be an (N,) tensor (see mean_completion_entropy())")
    check_group_size(group_size, mean_entropy.shape[0])
    raise_if_any([float_vector_check(advantages, mean_entropy.shape[0], "advantages")])


def check_shift_inputs(advantages, mean_entropy, keep, gamma) -> None:
    """Checks of `gtpo.core.shift_advantages` (no sync)."""
    check_number(gamma, "gamma")
    tensors = all(isinstance(t, Tensor) for t in (advantages, mean_entropy, keep))
    if (
        not tensors
        or keep.dtype != torch.bool
        or keep.shape != advantages.shape
        or mean_entropy.shape != advantages.shape
    ):
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, mean_entropy {tuple(mean_entropy.shape)} and keep "
            f"{tuple(keep.shape)} must all be (N,), keep bool"
        )


def check_entropy_inputs(token_entropy, completion_mask) -> Tensor:
    """Checks of `gtpo.core.mean_completion_entropy` (one sync); returns the (N, T) bool mask."""
    if not isinstance(token_entropy, Tensor) or token_entropy.dim() != 2:
        raise ValueError("token_entropy must be an (N, T) tensor (see token_entropy())")
    valid, checks = mask_checks(completion_mask, tuple(token_entropy.shape), right_padded=False)
    raise_if_any(checks)
    return valid
