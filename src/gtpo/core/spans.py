"""§2–3 of GTPO in the paper's order: conflict spans (Sec. 5.1) and the token weights λ (Eq. 5/21).

N completions in right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g;
``A_i`` an advantage, ``o_i`` the valid tokens (``completion_mask``). No trainer, no logging.
The conflict search itself is `gtpo.core.conflicts`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gtpo.core.advantages import ZERO_ADVANTAGE_RTOL, _signs
from gtpo.core.checks import (
    check_group_size,
    check_weight,
    float_vector_check,
    lookup,
    raise_if_any,
    validate_group_batch,
)
from gtpo.core.conflicts import aligned_conflicts
from gtpo.core.paper import NEGATIVE_WEIGHT, POSITIVE_WEIGHT

# 2. Conflict spans (Sec. 5.1) ---------------------------------------------------------------------
# Spans are searched window by window from each end: the first window has this many aligned positions,
# each next one is 8x wider, and a window is searched only while some span reaches its start. Spans are
# usually a handful of tokens (a shared format tag, a shared ending), so a call usually reads 2x64 aligned
# positions instead of 2T, and the windows are disjoint, so a call never does more than one full pass.
FIRST_SPAN_WINDOW = 64


def conflict_spans(
    completion_ids: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    group_size: int,
    *,
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    """Forward (leading) and backward (trailing) conflict spans M^fw, M^bw of each completion, Sec. 5.1.

    Position p of completion i is a *forward conflict* when its token also appears at p in a completion
    with A>0 and in one with A<0 of the same group; a *backward conflict* counts offsets r from each
    completion's own last valid token (position ``|o_i| - 1 - r``). The forward span is the run of
    forward conflicts from the first valid token, the backward span the run ending at the last one.
    Rows with A=0 (`advantage_signs`), padding and empty completions are never in a span. Validity comes
    from ``completion_mask`` only, never from a pad id (often EOS, itself a genuine conflict token).

    Cost: O(N·G·W) comparisons (sorting above G=32: O(N·log G·W)), W the aligned positions searched:
    64 when every span is shorter, then 64+512, 64+512+4096, ... up to T, never more than one pass; plus
    O(N·T) for the lengths, the outputs and, with ``validate``, the checks.

    Args:
        completion_ids: (N, T) integer token ids, right-padded (as in TRL).
        completion_mask: (N, T) bool or 0/1, True at valid tokens.
        advantages: (N,) floats; only their signs count.
        group_size: G, the completions per prompt (rows g*G .. g*G+G-1 form group g).
        validate: check the inputs (`validate_group_batch`: shapes, integer ids >= 0, a 0/1 right-padded
            mask, finite advantages, whole groups). Only a caller that has already checked this batch's
            producer passes False (GTPOTrainer checks its first batch; TRL builds the rest the same way).

    Returns:
        (forward, backward): two (N, T) bool tensors, the spans M^fw and M^bw.

    >>> ids = torch.tensor([[5, 7, 9], [5, 8, 9]])
    >>> fw, bw = conflict_spans(ids, torch.ones(2, 3, dtype=torch.bool), torch.tensor([1.0, -1.0]), 2)
    >>> fw.int().tolist(), bw.int().tolist()
    ([[1, 0, 0], [1, 0, 0]], [[0, 0, 1], [0, 0, 1]])
    """
    if validate:
        valid = validate_group_batch(completion_ids, completion_mask, advantages, group_size)  # (N, T)
    else:
        valid = completion_mask if completion_mask.dtype == torch.bool else completion_mask != 0  # (N, T)
    n, t = completion_ids.shape
    device = completion_ids.device
    lengths = valid.sum(dim=-1, keepdim=True)  # (N, 1) |o_i|
    signs = _signs(advantages, group_size)  # (N,) zero up to rounding -> 0, the one sign rule
    sign_bit = (signs < 0).long().view(n, 1, 1)  # (N, 1, 1)
    takes_part = (signs != 0).view(n, 1, 1)  # (N, 1, 1)

    span = torch.zeros(n, 2, dtype=torch.long, device=device)  # (N, 2) forward, backward span lengths so far
    start, width = 0, FIRST_SPAN_WINDOW
    while start < t:
        stop = min(t, start + width)
        pos = torch.arange(start, stop, device=device)  # (w,) aligned positions, from the start or the end
        from_end = (lengths - 1 - pos).clamp_(min=0)  # (N, w) position |o_i| - 1 - r of offset r
        aligned = torch.stack([completion_ids[:, start:stop], completion_ids.gather(1, from_end)], dim=1)  # (N, 2, w)
        # With right padding, aligned position p (or offset p from the end) is valid exactly when p < |o_i|.
        inside = takes_part & (pos < lengths).unsqueeze(1)  # (N, 1, w)
        # Keys 2v (A>0), 2v+1 (A<0), -1 (A=0 or padding): see gtpo.core.conflicts.aligned_conflicts.
        keys = torch.where(inside, aligned.long() * 2 + sign_bit, -1)  # (N, 2, w)
        hits = aligned_conflicts(keys.view(n, 2 * (stop - start)), group_size).view(keys.shape)  # (N, 2, w)
        # A span grows only in rows whose run reached this window's start; its growth is the leading run
        # of conflicts in the window (a running AND); padding and A=0 rows stop it.
        span += torch.where(span == start, hits.cummin(dim=-1).values.sum(dim=-1), 0)  # (N, 2)
        start, width = stop, 8 * width
        # One host sync per window: search on only while some span may still grow past this window.
        if start >= t or not bool(((span == start) & (lengths > start)).any()):
            break

    pos = torch.arange(t, device=device)  # (T,)
    forward = pos < span[:, :1]  # (N, T)
    backward = (pos >= lengths - span[:, 1:]) & valid  # (N, T)
    return forward, backward


# 3. Token weights λ (Eq. 5/21) --------------------------------------------------------------------
def _signed_weight(span: Tensor, signs: Tensor, positive_weight: float, negative_weight: float) -> Tensor:
    """Eq. (5) on one mask: 1 outside the span; inside negative_weight (A<0; the paper's 0), positive_weight (A>0),
    1 (A=0)."""
    a = signs.unsqueeze(-1)  # (N, 1) from `advantage_signs`, as floats
    one = torch.ones((), dtype=signs.dtype, device=signs.device)
    inside = torch.where(a > 0, positive_weight, torch.where(a < 0, negative_weight, one))  # (N, 1)
    return torch.where(span, inside, one)  # (N, T)


def _combine_union(forward, backward, signs, positive_weight: float, negative_weight: float) -> Tensor:
    # The paper's text: M_i = M_i^fw ∨ M_i^bw, then Eq. (5).
    return _signed_weight(forward | backward, signs, positive_weight, negative_weight)  # (N, T)


def _combine_product(forward, backward, signs, positive_weight: float, negative_weight: float) -> Tensor:
    # The authors' code (Listing 2): final_mask = mask_fwd * mask_bw, so positive_weight² in overlaps.
    fw = _signed_weight(forward, signs, positive_weight, negative_weight)  # (N, T)
    return fw * _signed_weight(backward, signs, positive_weight, negative_weight)  # (N, T)


COMBINE_MODES: dict[str, Callable[[Tensor, Tensor, Tensor, float, float], Tensor]] = {
    "union": _combine_union,
    "product": _combine_product,
}
"""How forward and backward spans combine into λ: ``union`` (paper text), ``product`` (authors' code)."""

SPAN_SIDES: dict[str, Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]] = {
    "both": lambda forward, backward: (forward, backward),  # Sec. 5.1: leading and trailing spans
    "forward": lambda forward, backward: (forward, torch.zeros_like(backward)),  # an ablation: the opening only
    "backward": lambda forward, backward: (torch.zeros_like(forward), backward),  # an ablation: the ending only
}
"""Which conflict spans the correction acts on: ``both`` (the paper), or one side alone (ablations)."""

CONFLICT_COUNTS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "union": lambda forward, backward: (forward | backward).sum(dim=-1),  # |M^fw ∪ M^bw|, each position once
    # The authors' Listing 2 ORs the forward mask with the backward mask while the latter is still reversed, so the
    # two spans overlap from position 0 on: max(|M^fw|, |M^bw|). A bug, reproduced only by `authors_code`.
    "max": lambda forward, backward: torch.maximum(forward.sum(dim=-1), backward.sum(dim=-1)),
}
"""How many conflict positions a completion has, (N, T) spans -> (N,): the ``reference`` aggregation's divisor."""


def conflict_weights(
    forward: Tensor,
    backward: Tensor,
    advantages: Tensor,
    positive_weight: float = POSITIVE_WEIGHT,
    combine: str = "union",
    *,
    group_size: int = 1,
    negative_weight: float = NEGATIVE_WEIGHT,
    sides: str = "both",
    contested: Tensor | None = None,
    common_prefix: Tensor | None = None,
) -> Tensor:
    """Token weights λ_{i,t} of Eq. (5)/(21): 1 outside the spans; inside 0 (A<0), positive_weight (A>0).

    Rows with A_i=0 keep 1 (they have no spans from `conflict_spans`); padding is outside every span.
    With ``contested`` (the guard, `contested_tokens`), λ is instead 0 on the contested span tokens and 1 everywhere
    else, whatever the sign, weights and combine mode. With ``common_prefix`` (`common_prefix_conflicts`), λ is 1 on
    those tokens whatever else applies (`leave_to_group`).

    Args:
        forward: (N, T) bool forward spans M^fw.
        backward: (N, T) bool backward spans M^bw.
        advantages: (N,) floats *before* any entropy shift (the signs decide).
        positive_weight: λ inside a span for A>0 (the paper's 2, App. 11 Eq. 19).
        combine: one of `COMBINE_MODES`: ``union`` (M = M^fw ∨ M^bw, the paper's text) or ``product`` (the
            authors' code: forward and backward λ multiplied, 4 on tokens in both spans).
        group_size: G for `advantage_signs` (1: each row alone).
        negative_weight: λ inside a span for A<0 (the paper's 0: no negative update; 1 keeps it, an ablation).
        sides: one of `SPAN_SIDES`: ``both`` (the paper), ``forward`` or ``backward`` alone (ablations).
        contested: (N, T) bool from `contested_tokens` on the same spans, or None (Eq. 5).
        common_prefix: (N, T) bool from `common_prefix_conflicts` on the same spans, or None (Eq. 5 there too).

    Returns:
        (N, T) λ in the dtype of ``advantages``.

    >>> fw = torch.tensor([[True, True], [True, False]])
    >>> bw = torch.tensor([[False, True], [False, False]])
    >>> conflict_weights(fw, bw, torch.tensor([1.0, -1.0]), combine="product").tolist()
    [[2.0, 4.0], [0.0, 1.0]]
    """
    fn = lookup(COMBINE_MODES, combine, "combine mode")
    forward, backward = lookup(SPAN_SIDES, sides, "span sides")(forward, backward)
    check_weights_inputs(forward, backward, advantages, positive_weight, group_size)
    check_weight(negative_weight, "negative_weight")
    signs = _signs(advantages, group_size).to(advantages.dtype)  # (N,)
    if contested is not None:
        lam = guarded_weights(forward, backward, contested, signs)  # (N, T)
    else:
        lam = fn(forward, backward, signs, float(positive_weight), float(negative_weight))  # (N, T)
    return lam if common_prefix is None else leave_to_group(lam, common_prefix)  # (N, T)


# 3b. The stall guard (off by default): protect without promoting ----------------------------------
def contested_tokens(
    completion_ids: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    group_size: int,
    forward: Tensor,
    backward: Tensor,
) -> Tensor:
    """The span tokens that the group as a whole pushes down: where the stall guard sets λ = 0.

    For a span token v of completion i at aligned position p (counted from the start in M^fw_i, from the end in
    M^bw_i), let S = Σ_j A_j over the completions j of i's group that have v at that aligned position (i included,
    rows with A = 0 adding nothing). Without the correction, v's update there is, up to each completion's length
    weight, S times v's gradient: the group's net evidence on v. Eq. (5) replaces it by 2·Σ_{j: A_j>0} A_j, a push up
    whatever S, which favours an opening the positives share with negatives over one only positives have; in study E
    that opening was the restated question, and the group converged on it (docs/studies/mechanism.md). The guard
    keeps S where S ≥ 0 (λ = 1, as without the correction) and drops it where S < 0 (λ = 0 for
    every sharer, the paper's protection): no shared token is pushed down, and none is pushed up more than the
    group's advantages say. S counts as negative below −G·ZERO_ADVANTAGE_RTOL·max(1, max_g |A_j|), the rounding of a
    sum of G advantages (a token every completion shares has S = 0 up to rounding under Eq. 8).

    Cost: G passes over the (N, W) aligned ids, W the longest span (one host sync per side); no (N, G, G, W) tensor.

    Args:
        completion_ids: (N, T) integer token ids, right-padded.
        completion_mask: (N, T) bool or 0/1, True at valid tokens.
        advantages: (N,) A_i before any entropy shift, as for the signs of Eq. (5).
        group_size: G; rows g*G .. g*G+G-1 form group g.
        forward, backward: (N, T) bool spans from `conflict_spans` on the same rows (after any `SPAN_SIDES` choice).

    Returns:
        (N, T) bool, True on span tokens whose S is negative (a subset of M^fw ∨ M^bw).

    >>> ids = torch.tensor([[5, 7], [5, 8], [5, 9]])  # token 5 opens all three: S = 1 - 0.5 - 0.5 = 0, kept
    >>> fw, bw = conflict_spans(ids, torch.ones(3, 2, dtype=torch.bool), torch.tensor([1.0, -0.5, -0.5]), 3)
    >>> contested_tokens(ids, torch.ones(3, 2), torch.tensor([1.0, -0.5, -0.5]), 3, fw, bw).int().tolist()
    [[0, 0], [0, 0], [0, 0]]
    >>> a = torch.tensor([1.0, -2.0, 1.0])  # 5 opens rows 0 and 1 only: S = 1 - 2 < 0, both get λ = 0
    >>> ids = torch.tensor([[5, 7], [5, 8], [6, 9]])
    >>> fw, bw = conflict_spans(ids, torch.ones(3, 2, dtype=torch.bool), a, 3)
    >>> contested_tokens(ids, torch.ones(3, 2), a, 3, fw, bw).int().tolist()
    [[1, 0], [1, 0], [0, 0]]
    """
    valid = completion_mask.bool()  # (N, T)
    n, t = completion_ids.shape
    signs = _signs(advantages, group_size)  # (N,) zero up to rounding -> 0, the one sign rule
    a = torch.where(signs != 0, advantages.detach().float(), 0.0)  # (N,)
    tol = net_advantage_tolerance(a, group_size)  # (N, 1)
    lengths = valid.sum(dim=-1, keepdim=True)  # (N, 1) |o_i|
    contested = torch.zeros(n, t, dtype=torch.bool, device=completion_ids.device)  # (N, T)
    width = int(forward.sum(dim=-1).max()) if n else 0  # the longest forward span
    if width:
        pos = torch.arange(width, device=completion_ids.device)  # (W,)
        net = _net_advantage(completion_ids[:, :width], pos < lengths, a, group_size)  # (N, W)
        contested[:, :width] = forward[:, :width] & (net < -tol)
    width = int(backward.sum(dim=-1).max()) if n else 0  # the longest backward span
    if width:
        offset = torch.arange(width, device=completion_ids.device)  # (W,) offsets r from the last valid token
        present = offset < lengths  # (N, W)
        at = (lengths - 1 - offset).clamp(min=0)  # (N, W) position |o_i| - 1 - r
        net = _net_advantage(completion_ids.gather(1, at), present, a, group_size)  # (N, W)
        down = (net < -tol) & present  # (N, W)
        # Back to positions; clamped offsets all land on 0 with False, so add rather than overwrite.
        hits = torch.zeros(n, t, dtype=torch.long, device=completion_ids.device).scatter_add_(1, at, down.long())
        contested |= backward & (hits > 0)  # (N, T)
    return contested  # (N, T)


def net_advantage_tolerance(advantages: Tensor, group_size: int) -> Tensor:
    """Below −tol a sum S of a group's advantages counts as negative (above tol, positive): the rounding of a sum of G
    advantages, tol = G·ZERO_ADVANTAGE_RTOL·max(1, max_g |A_j|). advantages: (N,) -> (N, 1), one value per group."""
    scale = advantages.view(-1, group_size).abs().amax(dim=-1, keepdim=True).clamp(min=1.0)  # (n_groups, 1)
    return (group_size * ZERO_ADVANTAGE_RTOL * scale).repeat_interleave(group_size, dim=0)  # (N, 1)


def _net_advantage(aligned: Tensor, present: Tensor, advantages: Tensor, group_size: int) -> Tensor:
    """S of `contested_tokens`: for each row and aligned position, Σ_j A_j over the rows j of its group that are
    present there with the same token. aligned, present: (N, W); advantages: (N,), or (N, W) for a value per row and
    aligned position (Σ_j v_{j,p}) -> (N, W) float32."""
    n, w = aligned.shape
    ids = aligned.view(-1, group_size, w)  # (n_groups, G, W)
    here = present.view(-1, group_size, w)  # (n_groups, G, W)
    values = advantages.float() if advantages.dim() == 2 else advantages.float().unsqueeze(-1).expand(n, w)
    v = values.reshape(-1, group_size, w)  # (n_groups, G, W)
    net = torch.zeros(ids.shape, dtype=torch.float32, device=aligned.device)  # (n_groups, G, W)
    for j in range(group_size):  # G passes of (N, W): no (N, G, G, W) temporary
        shares = (ids == ids[:, j : j + 1]) & here[:, j : j + 1]  # (n_groups, G, W) row j has row i's token
        net += shares * v[:, j : j + 1]
    return net.view(n, w)


def guarded_weights(forward: Tensor, backward: Tensor, contested: Tensor, signs: Tensor) -> Tensor:
    """λ under the guard: 0 on contested span tokens (both signs), 1 everywhere else. (N, T) in the signs' dtype."""
    return _signed_weight(contested & (forward | backward), signs, 0.0, 0.0)  # (N, T)


# 3c. The common prefix (off by default): the group's own evidence where it is exact ----------------------
def common_prefix_conflicts(
    completion_ids: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    group_size: int,
    forward: Tensor,
) -> Tensor:
    """The forward-span tokens whose whole prefix, the token included, a positive and a negative completion share.

    Eq. (5) rests on the claim that a token shared by completions of both signs receives conflicting updates. Where the
    sharers' prefixes up to the token are identical, their contexts are too, so the token's per-row gradients (and,
    under clipping, its ratios) are identical, and without the correction the rows' updates add up to
    S = Σ_j A_j·w_j (w_j each row's length weight) times that one gradient: no conflict, the group's Monte-Carlo
    evidence on that opening, with its sign (docs/core.md, "What Eq. 5 does to a shared opening"). Eq. (5) replaces
    S by 2·Σ_{j: A_j>0} A_j·w_j, a push up whatever S: an opening that fails more often than the group, or one the
    whole group shares (S = 0 under Eq. 8), is pushed up because it is shared. These tokens are where that holds; a
    span token shared only by position, after prefixes that differ, is not among them (its gradients differ by
    context, the case the paper argues for), nor is any backward-span token (two completions whose every token up to
    an aligned end matches are the same text).

    Row i's common prefix is the longest L such that a row with A>0 and a row with A<0 of its group (i counting for
    its own sign) hold i's first L tokens exactly; these are a leading run of i's forward span. Rows with A = 0 have
    none. Signs as Eq. (5)'s (`advantage_signs`, before any entropy filter or shift).

    Cost: G passes over the (N, W) leading ids, W the longest forward span (one host sync); no (N, G, G, W) tensor.

    Args:
        completion_ids: (N, T) integer token ids, right-padded.
        completion_mask: (N, T) bool or 0/1, True at valid tokens.
        advantages: (N,) A_i; only their signs count.
        group_size: G; rows g*G .. g*G+G-1 form group g.
        forward: (N, T) bool forward spans from `conflict_spans` on the same rows (after any `SPAN_SIDES` choice).

    Returns:
        (N, T) bool, True on forward-span tokens inside their row's common prefix.

    >>> ids = torch.tensor([[5, 7, 9], [5, 7, 8], [6, 7, 9]])  # rows 0 (A>0) and 1 (A<0) open "5 7" alike
    >>> a = torch.tensor([1.0, -0.5, -0.5])
    >>> fw, _ = conflict_spans(ids, torch.ones(3, 3, dtype=torch.bool), a, 3)
    >>> fw.int().tolist()  # row 0's 9 at position 2 is shared by position only, with row 2, whose prefix differs
    [[1, 1, 1], [1, 1, 0], [0, 0, 0]]
    >>> common_prefix_conflicts(ids, torch.ones(3, 3), a, 3, fw).int().tolist()
    [[1, 1, 0], [1, 1, 0], [0, 0, 0]]
    >>> ids = torch.tensor([[5, 7], [6, 7], [5, 8]])  # 7 at position 1: rows 0 (A>0) and 1 (A<0), prefixes differ
    >>> fw, _ = conflict_spans(ids, torch.ones(3, 2, dtype=torch.bool), a, 3)
    >>> fw.int().tolist(), common_prefix_conflicts(ids, torch.ones(3, 2), a, 3, fw).int().tolist()
    ([[1, 1], [0, 0], [1, 0]], [[1, 0], [0, 0], [1, 0]])
    """
    n, t = completion_ids.shape
    common = torch.zeros(n, t, dtype=torch.bool, device=completion_ids.device)  # (N, T)
    width = int(forward.sum(dim=-1).max()) if n else 0  # the longest forward span; a common prefix lies inside it
    if not width:
        return common
    check_group_size(group_size, n)
    signs = _signs(advantages, group_size).view(-1, group_size)  # (n_groups, G)
    ids = completion_ids[:, :width].reshape(-1, group_size, width)  # (n_groups, G, W)
    here = completion_mask[:, :width].bool().reshape(-1, group_size, width)  # (n_groups, G, W)
    with_positive = torch.zeros(signs.shape, dtype=torch.long, device=ids.device)  # (n_groups, G)
    with_negative = torch.zeros_like(with_positive)  # (n_groups, G)
    for j in range(group_size):  # G passes of (N, W): row i's common prefix with row j
        same = (ids == ids[:, j : j + 1]) & here & here[:, j : j + 1]  # (n_groups, G, W)
        shared = same.long().cummin(dim=-1).values.sum(dim=-1)  # (n_groups, G) tokens i and j hold alike from 0
        with_positive = torch.where(signs[:, j : j + 1] > 0, torch.maximum(with_positive, shared), with_positive)
        with_negative = torch.where(signs[:, j : j + 1] < 0, torch.maximum(with_negative, shared), with_negative)
    length = torch.minimum(with_positive, with_negative).view(n, 1)  # (N, 1)
    common[:, :width] = (torch.arange(width, device=ids.device) < length) & forward[:, :width]
    return common  # (N, T)


def leave_to_group(lam: Tensor, common_prefix: Tensor) -> Tensor:
    """λ = 1 on the common-prefix tokens (`common_prefix_conflicts`): the update GRPO gives them. (N, T)."""
    return torch.where(common_prefix, torch.ones((), dtype=lam.dtype, device=lam.device), lam)  # (N, T)


# Input checks of this module's functions (one host sync per call) -----------------------------------
def check_weights_inputs(forward, backward, advantages, positive_weight, group_size) -> None:
    """Checks of `gtpo.core.conflict_weights` (one sync)."""
    for name, span in (("forward", forward), ("backward", backward)):
        if not isinstance(span, Tensor) or span.dtype != torch.bool or span.dim() != 2:
            raise ValueError(f"{name} must be an (N, T) bool tensor (from conflict_spans)")
    if forward.shape != backward.shape:
        raise ValueError(f"forward {tuple(forward.shape)} and backward {tuple(backward.shape)} spans differ in shape")
    check_weight(positive_weight)
    check_group_size(group_size, forward.shape[0])
    raise_if_any([float_vector_check(advantages, forward.shape[0], "advantages")])
