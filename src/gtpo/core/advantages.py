"""§1 of GTPO in the paper's order: group-relative advantages (Eq. 8) and their signs, zero up to rounding.

N completions in right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g;
``A_i`` an advantage, ``o_i`` the valid tokens (``completion_mask``). No trainer, no logging.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gtpo.core.checks import check_group_size, float_vector_check, lookup, raise_if_any

"""ln 2 ≈ 0.693 nats: the entropy of an even choice between two tokens, Eq. (6)'s threshold."""
ZERO_ADVANTAGE_RTOL = 1e-6
"""|A_i| ≤ 1e-6·max(1, max_{j∈g} |A_j|) counts as A_i = 0 (`advantage_signs`): about 8 float32 ulps of 1."""


# 1. Advantages (Eq. 8) and their signs ------------------------------------------------------------
ADVANTAGE_SCALES = ("group", "none")
"""``group``: (R − mean)/(std + 1e-4) with torch.std's unbiased std, as TRL; ``none``: R − mean."""


def group_advantages(rewards: Tensor, group_size: int, *, scale: str = "group") -> Tensor:
    """Group-relative advantages Â_i = (R_i − mean_g R)/(std_g R + 1e-4), Eq. (8), for use without TRL.

    ``std`` is the unbiased group std of ``torch.std``, as TRL's ``scale_rewards="group"``.

    Args:
        rewards: (N,) float rewards; rows g*G .. g*G+G-1 form group g.
        group_size: G, the completions per prompt.
        scale: ``"group"`` (Eq. 8) or ``"none"``: R_i − mean_g R (the authors' code, TRL's ``scale_rewards="none"``).

    Returns:
        (N,) advantages in the rewards' dtype.

    >>> group_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, scale="none").tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    lookup(ADVANTAGE_SCALES, scale, "advantage scale")
    check_rewards(rewards, group_size, scale)
    grouped = rewards.view(-1, group_size)  # (n_groups, G)
    centered = grouped - grouped.mean(dim=-1, keepdim=True)  # (n_groups, G)
    if scale == "group":
        centered = centered / (grouped.std(dim=-1, keepdim=True) + 1e-4)  # (n_groups, G)
    return centered.reshape(-1)  # (N,)


def advantage_signs(advantages: Tensor, group_size: int) -> Tensor:
    """Sign of each advantage, 0 where it is zero up to float rounding; every sign test in GTPO uses it.

    A_i counts as 0 when |A_i| ≤ ZERO_ADVANTAGE_RTOL · max(1, max_{j∈g} |A_j|), in float32 or wider:
    (R − mean)/(std + 1e-4) of Eq. (8) leaves ±1e-7 where a reward equals its group's mean, and such a row must
    not take part in conflict detection (Sec. 5.1; docs/core.md, "Advantages that are zero up to rounding").

    Args:
        advantages: (N,) finite floats.
        group_size: G (1: each row alone).

    Returns:
        (N,) int8 in {-1, 0, 1}.

    >>> advantage_signs(torch.tensor([1.5, -1.5, 1e-7, -2e-7]), 4).tolist()
    [1, -1, 0, 0]
    """
    check_signs_inputs(advantages, group_size)
    return _signs(advantages, group_size)  # (N,)


def _signs(advantages: Tensor, group_size: int) -> Tensor:
    a = advantages.detach().to(torch.promote_types(advantages.dtype, torch.float32))  # (N,)
    grouped = a.view(-1, group_size).abs()  # (n_groups, G)
    tol = ZERO_ADVANTAGE_RTOL * grouped.amax(dim=-1, keepdim=True).clamp(min=1.0)  # (n_groups, 1) tol_g
    zero = (grouped <= tol).view(-1)  # (N,)
    return torch.where(zero, 0.0, torch.sign(a)).to(torch.int8)  # (N,)


# Input checks of this module's functions (one host sync per call) -----------------------------------
def check_rewards(rewards, group_size, scale: str) -> None:
    """Checks of `gtpo.core.group_advantages` once its scale is looked up (one sync)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    check = float_vector_check(rewards, None, "rewards")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"N={rewards.shape[0]} rewards is not a multiple of group_size={group_size}")
    if scale == "group" and group_size < 2:
        raise ValueError("scale='group' needs group_size >= 2 (the unbiased std of one reward is undefined)")
    raise_if_any([check])


def check_signs_inputs(advantages, group_size) -> None:
    """Checks of `gtpo.core.advantage_signs` (one sync)."""
    check = float_vector_check(advantages, None, "advantages")
    check_group_size(group_size, advantages.shape[0], "advantages")
    raise_if_any([check])
