"""GTPO algorithm in pure torch: conflict spans, token weights λ, entropy filter δ and the loss.

Notation follows the paper (arXiv 2508.03772, Sec. 5 and App. 11). A batch holds N completions in
right-padded (N, T) tensors; rows ``g*G .. g*G+G-1`` are the G completions of prompt g. ``A_i`` is a
completion's advantage, ``o_i`` its valid tokens (``completion_mask``), ``⟨H⟩_i`` the mean over
``o_i`` of the entropy (nats) of the full next-token distribution.

Nothing here knows about a trainer: functions take tensors and return tensors or ``(loss, metrics)``.
They run on the device and in the dtype of their inputs; the only device→host transfer is the one
boolean per call that input validation needs to raise a ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "AGGREGATIONS",
    "COMBINE_MODES",
    "ENTROPY_FILTERS",
    "ENTROPY_TERMS",
    "LN2",
    "ADVANTAGE_SCALES",
    "ZERO_ADVANTAGE_RTOL",
    "advantage_signs",
    "conflict_spans",
    "conflict_weights",
    "entropy_keep_mask",
    "group_advantages",
    "gtpo_loss",
    "mean_completion_entropy",
    "shift_advantages",
    "token_entropy",
    "validate_group_batch",
]

LN2 = math.log(2.0)
"""ln 2 ≈ 0.693 nats: the entropy of an even choice between two tokens, Eq. (6)'s threshold."""

# Work bound for `conflict_spans`: bytes of its largest temporary per chunk. On CPU 1 MiB stays in
# cache (about 2x faster than 64 MiB on a batch of 64 groups of 12x1500, benchmarks/bench_conflict.py);
# on accelerators larger chunks mean fewer kernel launches.
_SPAN_CHUNK_BYTES = {"cpu": 1 << 20}
_SPAN_CHUNK_BYTES_DEFAULT = 1 << 26
# Up to this group size conflicts are found by comparing all pairs of rows (O(G²) per position, fully
# vectorized); above it by sorting each position's G keys (O(G log G)). Measured crossover: between
# G=32 (pairs 2x faster) and G=64 (sorting up to 1.3x faster), benchmarks/bench_conflict.py.
_PAIRWISE_MAX_GROUP = 32
ZERO_ADVANTAGE_RTOL = 1e-6
"""|A_i| ≤ 1e-6·max(1, max_{j∈g} |A_j|) counts as A_i = 0 (`advantage_signs`): about 8 float32 ulps of 1."""
# Work bound for `token_entropy`: logits (float32) processed per chunk, about 256 MiB per temporary.
_ENTROPY_CHUNK_ELEMS = 1 << 26


# --------------------------------------------------------------------------------------------------
# Name lookups and input validation
# --------------------------------------------------------------------------------------------------


def _lookup(registry, name, what: str):
    """registry[name], or a ValueError naming the valid choices."""
    if not isinstance(name, str) or name not in registry:
        raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(sorted(registry))}")
    return registry[name] if isinstance(registry, dict) else name


def _raise_if_any(checks: list[tuple[Tensor, Callable[[], str]]]) -> None:
    """Raise ValueError(message) for the first check whose flag is True.

    All flags are reduced on their device and read back with a single device→host sync; messages
    are only built (and may inspect tensors) on the failure path.
    """
    if not checks:
        return
    flags = torch.stack([flag.reshape(()) for flag, _ in checks])  # (n_checks,)
    if bool(flags.any()):  # the one sync of a call
        for flag, message in checks:
            if bool(flag):
                raise ValueError(message())


def _check_float_vector(x, n: int | None, name: str) -> tuple[Tensor, Callable[[], str]]:
    """Static checks of an (n,) floating tensor; returns the deferred finiteness check."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (N,), got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must have shape (N,) (one value per completion), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}; cast it with .float()")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has {x.shape[0]} entries but the batch has N={n} completions")

    def message() -> str:
        rows = (~torch.isfinite(x)).nonzero().flatten()[:5].tolist()
        return f"{name} must be finite; non-finite values at rows {rows} (check the rewards and their std)"

    return (~torch.isfinite(x)).any(), message


def _check_mask(
    mask, shape: tuple[int, ...], name: str = "completion_mask", *, right_padded: bool = True
) -> tuple[Tensor, list[tuple[Tensor, Callable[[], str]]]]:
    """Static checks of an (N, T) mask; returns the bool mask and its deferred value checks."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)} but the completion tensors have shape {tuple(shape)}")
    checks = []
    if mask.dtype == torch.bool:
        valid = mask  # (N, T)
    else:
        valid = mask != 0  # (N, T)
        checks.append((((mask != 0) & (mask != 1)).any(), lambda: f"{name} must hold only 0/1 (or be bool)"))
    if right_padded:
        # Right padding (valid tokens first, as TRL produces): a valid token never follows a pad.
        late = (valid[:, 1:] & ~valid[:, :-1]).any(dim=-1)  # (N,)

        def message() -> str:
            rows = late.nonzero().flatten()[:5].tolist()
            return (
                f"{name} must be right-padded (each row's valid tokens first, as TRL produces); rows {rows} "
                "have a valid token after padding: flip left-padded batches to right padding first"
            )

        checks.append((late.any(), message))
    return valid, checks


def validate_group_batch(completion_ids: Tensor, completion_mask: Tensor, advantages: Tensor, group_size: int) -> Tensor:
    """Check a batch of groups and return its completion mask as bool.

    Args:
        completion_ids: (N, T) integer token ids (non-negative).
        completion_mask: (N, T) bool or 0/1, right-padded (each row's valid tokens first).
        advantages: (N,) finite floats.
        group_size: G ≥ 1 with N a multiple of G.

    Returns:
        (N, T) bool validity mask.

    Raises:
        ValueError: saying what is wrong and how to fix it. Costs one device→host sync.
    """
    if not isinstance(completion_ids, Tensor) or completion_ids.dim() != 2:
        shape = tuple(completion_ids.shape) if isinstance(completion_ids, Tensor) else type(completion_ids).__name__
        raise ValueError(f"completion_ids must be an (N, T) tensor, got {shape}")
    if completion_ids.is_floating_point() or completion_ids.is_complex() or completion_ids.dtype == torch.bool:
        raise ValueError(f"completion_ids must hold integer token ids, got dtype {completion_ids.dtype}")
    _check_group_size(group_size)
    n = completion_ids.shape[0]
    if n % group_size != 0:
        raise ValueError(
            f"N={n} completions is not a multiple of group_size={group_size}: rows g*G .. g*G+G-1 must "
            "form group g, so pass whole groups (compute spans where all completions of a prompt are visible)"
        )
    valid, checks = _check_mask(completion_mask, tuple(completion_ids.shape))
    checks.append(_check_float_vector(advantages, n, "advantages"))
    checks.append(((completion_ids < 0).any(), lambda: "completion_ids must be non-negative token ids"))
    _raise_if_any(checks)
    return valid


def advantage_signs(advantages: Tensor, group_size: int) -> Tensor:
    """Sign of each advantage, 0 where it is zero up to float rounding; every sign test in GTPO uses it.

    A_i counts as 0 when |A_i| ≤ tol_g = ZERO_ADVANTAGE_RTOL · max(1, max_{j∈g} |A_j|), g the group of
    row i (rows g*G .. g*G+G-1), computed in float32 or wider. Why: a completion whose reward equals its
    group's mean should get A = 0, but (R − mean)/(std + 1e-4) in float32 leaves a few ulps: with
    partial-credit rewards on a 0.1 grid and G = 8, A = ±1e-7 in about a third of random groups. With an
    arbitrary sign such a row would take part in conflict detection (Sec. 5.1) and change λ of others.
    1e-6 is about 8 float32 ulps of 1 (group-normalized advantages are O(1)); scaling with the group's
    largest |A| keeps the margin for unnormalized advantages (``scale="none"``) and large G. A genuine
    advantage is zeroed only if it is below a millionth of the group's largest one (or of 1). Limits: with
    ``scale="none"``, rewards far larger than their spread (e.g. 100.0 vs 100.1) round by more than tol_g.

    Args:
        advantages: (N,) finite float advantages.
        group_size: G ≥ 1 with N a multiple of G. G = 1 makes each row its own group: |A_i| ≤ 1e-6 is 0
            (what functions that see no whole groups use when not given a group size).

    Returns:
        (N,) int8 in {-1, 0, 1}, on the advantages' device.

    Raises:
        ValueError: on a bad shape, dtype, group size or non-finite advantages (one device→host sync).

    >>> advantage_signs(torch.tensor([1.5, -1.5, 1e-7, -2e-7]), 4).tolist()
    [1, -1, 0, 0]
    """
    check = _check_float_vector(advantages, None, "advantages")
    _check_group_size(group_size, advantages.shape[0], "advantages")
    _raise_if_any([check])
    return _signs(advantages, group_size)  # (N,)


def _check_group_size(group_size, n: int | None = None, what: str = "rows") -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int (completions per prompt), got {group_size!r}")
    if n is not None and n % group_size != 0:
        raise ValueError(f"N={n} {what} is not a multiple of group_size={group_size}")


def _signs(advantages: Tensor, group_size: int) -> Tensor:
    a = advantages.detach().to(torch.promote_types(advantages.dtype, torch.float32))  # (N,)
    grouped = a.view(-1, group_size).abs()  # (n_groups, G)
    tol = ZERO_ADVANTAGE_RTOL * grouped.amax(dim=-1, keepdim=True).clamp(min=1.0)  # (n_groups, 1) tol_g
    zero = (grouped <= tol).view(-1)  # (N,)
    return torch.where(zero, 0.0, torch.sign(a)).to(torch.int8)  # (N,)


# --------------------------------------------------------------------------------------------------
# Conflict spans and token weights λ (Sec. 5.1, Eqs. 5 and 21)
# --------------------------------------------------------------------------------------------------


def _aligned_conflicts(keys: Tensor, group_size: int) -> Tensor:
    """Conflict flags for keys aligned across the rows of each group.

    ``keys`` encodes, per row and aligned position, token v of a completion with A>0 as 2v, with A<0
    as 2v+1, and anything that takes no part (A=0, padding) as -1. Position p of row i is a conflict
    iff its *partner* key (2v <-> 2v+1, i.e. key XOR 1) occurs at p in another row of the group: then v
    appears there in both a positive and a negative completion (Sec. 5.1). Key -1 looks for -2, which
    never occurs. No step depends on the vocabulary size.

    Args:
        keys: (N, T') int64 keys, N a multiple of group_size.

    Returns:
        (N, T') bool conflict flags.
    """
    budget = _SPAN_CHUNK_BYTES.get(keys.device.type, _SPAN_CHUNK_BYTES_DEFAULT)
    if group_size <= _PAIRWISE_MAX_GROUP:
        return _partners_by_pairs(keys, group_size, budget)  # (N, T')
    return _partners_by_sorting(keys, group_size, budget)  # (N, T')


def _partners_by_pairs(keys: Tensor, g: int, budget: int) -> Tensor:
    """Compare every row's partner key with every row's key at the same position: O(G²·T')."""
    n_rows, width = keys.shape
    k = keys.view(n_rows // g, g, width)  # (n_groups, G, T')
    partner = k ^ 1  # (n_groups, G, T')
    hits = torch.empty(k.shape, dtype=torch.bool, device=keys.device)  # (n_groups, G, T')
    step = max(1, budget // max(1, k.shape[0] * g * g))  # positions per chunk of the (.., G, G, t) compare
    for s in range(0, width, step):
        same = partner[:, :, None, s : s + step] == k[:, None, :, s : s + step]  # (n_groups, G, G, t)
        hits[:, :, s : s + step] = same.any(dim=2)  # (n_groups, G, t)
    return hits.view(n_rows, width)  # (N, T')


def _partners_by_sorting(keys: Tensor, g: int, budget: int) -> Tensor:
    """Sort each (group, position) column of G keys and binary-search the partners: O(G log G·T')."""
    n_rows, width = keys.shape
    cols = keys.view(n_rows // g, g, width).transpose(1, 2).contiguous().view(-1, g)  # (n_groups·T', G)
    hits = torch.empty(cols.shape, dtype=torch.bool, device=keys.device)  # (n_groups·T', G)
    step = max(1, budget // (8 * g))  # columns per chunk of int64 temporaries
    for s in range(0, cols.shape[0], step):
        col = cols[s : s + step]  # (c, G)
        ordered = col.sort(dim=-1).values  # (c, G)
        partner = col ^ 1  # (c, G)
        at = torch.searchsorted(ordered, partner).clamp_(max=g - 1)  # (c, G)
        hits[s : s + step] = ordered.gather(-1, at) == partner  # (c, G)
    return hits.view(n_rows // g, width, g).transpose(1, 2).reshape(n_rows, width)  # (N, T')


def conflict_spans(
    completion_ids: Tensor, completion_mask: Tensor, advantages: Tensor, group_size: int
) -> tuple[Tensor, Tensor]:
    """Forward (leading) and backward (trailing) conflict spans of each completion, Sec. 5.1.

    Position p of completion i is a *forward conflict* when the token there also appears at position p
    in a completion with A>0 and in one with A<0 of the same group; a *backward conflict* at offset r
    counts positions from each completion's own last valid token (``|o_i| - 1 - r``). The forward span
    is the run of forward conflicts starting at the first valid token, the backward span the run of
    backward conflicts ending at the last valid token (M^fw and M^bw). Rows with A=0 (up to rounding:
    `advantage_signs`, |A_i| ≤ 1e-6·max(1, max_g |A|)), padding and empty completions are never in a span. Validity comes from ``completion_mask`` only, never from a pad id
    (the pad is often EOS, and EOS is a genuine conflict token). Cost does not depend on vocabulary size.

    Args:
        completion_ids: (N, T) integer token ids.
        completion_mask: (N, T) bool or 0/1, right-padded (each row's valid tokens first, as in TRL).
        advantages: (N,) float advantages; only their signs (`advantage_signs`) are used.
        group_size: G, completions per prompt; rows g*G .. g*G+G-1 form group g.

    Returns:
        ``(forward, backward)``, two (N, T) bool tensors on the input device.

    Raises:
        ValueError: on shapes that disagree, N not a multiple of G, non-finite advantages, a mask that
            is not 0/1 or not right-padded, or negative token ids.

    >>> ids = torch.tensor([[5, 7, 9], [5, 8, 9]])
    >>> fw, bw = conflict_spans(ids, torch.ones(2, 3, dtype=torch.bool), torch.tensor([1.0, -1.0]), 2)
    >>> fw.int().tolist(), bw.int().tolist()
    ([[1, 0, 0], [1, 0, 0]], [[0, 0, 1], [0, 0, 1]])
    """
    valid = validate_group_batch(completion_ids, completion_mask, advantages, group_size)  # (N, T)
    n, t = completion_ids.shape
    device = completion_ids.device
    ids = completion_ids.long()  # (N, T)
    lengths = valid.sum(dim=-1)  # (N,) |o_i|

    # Keys 2v (A>0), 2v+1 (A<0), -1 (A=0 or padding): see _aligned_conflicts.
    signs = _signs(advantages, group_size)  # (N,) zero up to rounding -> 0, the one sign rule
    sign_bit = (signs < 0).long().unsqueeze(-1)  # (N, 1)
    takes_part = valid & (signs != 0).unsqueeze(-1)  # (N, T)
    fw_keys = torch.where(takes_part, 2 * ids + sign_bit, -1)  # (N, T)
    # Backward alignment: offset r reads position |o_i| - 1 - r. With right padding, offset r is valid
    # exactly where position r is, so `takes_part` masks both layouts.
    pos = torch.arange(t, device=device)  # (T,)
    from_end = (lengths.unsqueeze(-1) - 1 - pos).clamp_(min=0)  # (N, T)
    bw_keys = torch.where(takes_part, fw_keys.gather(1, from_end), -1)  # (N, T)

    hits = _aligned_conflicts(torch.cat([fw_keys, bw_keys], dim=1), group_size)  # (N, 2T)
    # Span length = length of the leading run of conflicts (a running AND); padding stops it.
    fw_len = hits[:, :t].cummin(dim=-1).values.sum(dim=-1, keepdim=True)  # (N, 1)
    bw_len = hits[:, t:].cummin(dim=-1).values.sum(dim=-1, keepdim=True)  # (N, 1)
    forward = pos < fw_len  # (N, T)
    backward = (pos >= lengths.unsqueeze(-1) - bw_len) & valid  # (N, T)
    return forward, backward


def _signed_weight(span: Tensor, advantages: Tensor, positive_weight: float) -> Tensor:
    """Eq. (5) on one mask: 1 outside span; inside 0 (A<0), positive_weight (A>0), 1 (A=0).

    Callers pass `advantage_signs` (as floats), so A zero up to rounding counts as 0 here too."""
    a = advantages.unsqueeze(-1)  # (N, 1)
    one = torch.ones((), dtype=advantages.dtype, device=advantages.device)
    inside = torch.where(a > 0, positive_weight, torch.where(a < 0, 0.0, one))  # (N, 1)
    return torch.where(span, inside, one)  # (N, T)


def _combine_union(forward: Tensor, backward: Tensor, advantages: Tensor, positive_weight: float) -> Tensor:
    # The paper's text: M_i = M_i^fw ∨ M_i^bw, then Eq. (5).
    return _signed_weight(forward | backward, advantages, positive_weight)  # (N, T)


def _combine_product(forward: Tensor, backward: Tensor, advantages: Tensor, positive_weight: float) -> Tensor:
    # The authors' code (Listing 2): final_mask = mask_fwd * mask_bw, so positive_weight² in overlaps.
    fw = _signed_weight(forward, advantages, positive_weight)  # (N, T)
    return fw * _signed_weight(backward, advantages, positive_weight)  # (N, T)


COMBINE_MODES: dict[str, Callable[[Tensor, Tensor, Tensor, float], Tensor]] = {
    "union": _combine_union,
    "product": _combine_product,
}
"""How forward and backward spans combine into λ: ``union`` (paper text), ``product`` (authors' code)."""


def conflict_weights(
    forward: Tensor,
    backward: Tensor,
    advantages: Tensor,
    positive_weight: float = 2.0,
    combine: str = "union",
    *,
    group_size: int = 1,
) -> Tensor:
    """Token weights λ_{i,t} of Eq. (5)/(21) from the conflict spans.

    λ is 1 outside the spans; inside, 0 where A_i<0 and ``positive_weight`` where A_i>0 (rows with
    A_i=0 keep 1; they have no spans when the spans come from `conflict_spans`). Padding is outside
    every span, so λ=1 there; the loss masks it anyway.

    Args:
        forward: (N, T) bool forward spans.
        backward: (N, T) bool backward spans.
        advantages: (N,) float; the signs decide, so pass advantages *before* any entropy shift.
        positive_weight: λ inside a span of a positive completion (the paper's 2).
        combine: ``"union"`` (text: M = M^fw ∨ M^bw) or ``"product"`` (authors' code: forward and
            backward weight masks multiplied, so positive_weight² where a positive token is in both).
        group_size: G for `advantage_signs` (A zero up to rounding counts as 0); 1: each row alone.

    Returns:
        (N, T) λ in the dtype of ``advantages``.

    >>> fw = torch.tensor([[True, True], [True, False]])
    >>> bw = torch.tensor([[False, True], [False, False]])
    >>> conflict_weights(fw, bw, torch.tensor([1.0, -1.0]), combine="product").tolist()
    [[2.0, 4.0], [0.0, 1.0]]
    """
    fn = _lookup(COMBINE_MODES, combine, "combine mode")
    for name, span in (("forward", forward), ("backward", backward)):
        if not isinstance(span, Tensor) or span.dtype != torch.bool or span.dim() != 2:
            raise ValueError(f"{name} must be an (N, T) bool tensor (from conflict_spans)")
    if forward.shape != backward.shape:
        raise ValueError(f"forward {tuple(forward.shape)} and backward {tuple(backward.shape)} spans differ in shape")
    _check_weight(positive_weight)
    _check_group_size(group_size, forward.shape[0])
    _raise_if_any([_check_float_vector(advantages, forward.shape[0], "advantages")])
    signs = _signs(advantages, group_size).to(advantages.dtype)  # (N,)
    return fn(forward, backward, signs, float(positive_weight))  # (N, T)


def _check_weight(positive_weight) -> None:
    if isinstance(positive_weight, bool) or not isinstance(positive_weight, (int, float)):
        raise ValueError(f"positive_weight must be a number, got {positive_weight!r}")
    if not math.isfinite(positive_weight) or positive_weight < 0:
        raise ValueError(f"positive_weight must be finite and >= 0 (the paper uses 2), got {positive_weight!r}")


# --------------------------------------------------------------------------------------------------
# Entropy: ⟨H⟩_i, the completion filter δ_i (Eq. 6) and the advantage shift (Eq. 7, authors' code)
# --------------------------------------------------------------------------------------------------


def token_entropy(logits: Tensor, *, chunk_rows: int | None = None) -> Tensor:
    """Entropy H = -Σ_v p_v ln p_v (nats) of each next-token distribution (Sec. 4.2).

    Math runs in float32 even for bfloat16 logits, over chunks of rows so that the float32 copies stay
    bounded (about 256 MiB per temporary by default). Differentiable; under autograd the chunks' saved
    tensors add up, so call it under ``torch.no_grad()`` unless the entropy term needs its gradient.
    Logits of -inf (masked vocabulary) contribute 0. Pass the logits the policy samples from (already
    divided by the sampling temperature, as TRL does for log-probabilities).

    Args:
        logits: (..., T, V) next-token logits.
        chunk_rows: rows of V logits per chunk; default keeps a chunk near 2**26 logits.

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
    parts = [_entropy_rows(chunk) for chunk in flat.split(rows)]
    return torch.cat(parts).view(logits.shape[:-1])  # (..., T)


def _entropy_rows(logits: Tensor) -> Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)  # (rows, V)
    # clamp: a -inf logit has p=0 and must give 0·ln 0 = 0, not 0·(-inf) = nan (value or gradient).
    return -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(dim=-1)  # (rows,)


def mean_completion_entropy(token_entropy: Tensor, completion_mask: Tensor) -> Tensor:
    """⟨H⟩_i: mean token entropy over each completion's valid tokens (0 for empty completions).

    Args:
        token_entropy: (N, T) entropies in nats (values at padding are ignored, even if nan).
        completion_mask: (N, T) bool or 0/1.

    Returns:
        (N,) float32 ⟨H⟩_i in nats, differentiable with respect to ``token_entropy``.
    """
    if not isinstance(token_entropy, Tensor) or token_entropy.dim() != 2:
        raise ValueError("token_entropy must be an (N, T) tensor (see token_entropy())")
    valid, checks = _check_mask(completion_mask, tuple(token_entropy.shape), right_padded=False)
    _raise_if_any(checks)
    return _mean_entropy(token_entropy, valid)  # (N,)


def _mean_entropy(token_entropy: Tensor, valid: Tensor) -> Tensor:
    h = torch.where(valid, token_entropy.float(), 0.0)  # (N, T) nan at padding stays out
    return h.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)


def _keep_never(low: Tensor, advantages: Tensor, initial_entropy) -> Tensor:
    return torch.ones_like(low)  # (N,)


def _keep_always(low: Tensor, advantages: Tensor, initial_entropy) -> Tensor:
    return low  # (N,) authors' code: keep iff ⟨H⟩_i ≤ threshold


def _keep_negative_only(low: Tensor, advantages: Tensor, initial_entropy) -> Tensor:
    return low | (advantages >= 0)  # (N,) App. 13 "OnlyNeg": only A<0 completions (by advantage_signs) filtered


def _keep_auto(low: Tensor, advantages: Tensor, initial_entropy) -> Tensor:
    if initial_entropy is None:
        raise ValueError(
            "entropy_filter='auto' needs initial_entropy, the model's mean completion entropy ⟨H⟩_ini "
            "measured before training (Eq. 6; e.g. mean_completion_entropy over completions of the first "
            "100 training prompts, averaged). Pass initial_entropy=<float>, or choose entropy_filter="
            "'always' or 'never'."
        )
    # Eq. (6): filter only when the model is a low-entropy one, ⟨H⟩_ini < ln 2 (strictly; at equality
    # the text's "if ⟨H⟩_ini < ln 2 ... we apply" does not apply, so nothing is filtered).
    if isinstance(initial_entropy, Tensor):
        if initial_entropy.numel() != 1:
            raise ValueError(f"initial_entropy must be a scalar, got shape {tuple(initial_entropy.shape)}")
        filtering = initial_entropy.to(low.device).reshape(()) < LN2  # () compared on device, no sync
        return low | ~filtering  # (N,)
    if isinstance(initial_entropy, bool) or not isinstance(initial_entropy, (int, float)):
        raise ValueError(f"initial_entropy must be a scalar number of nats, got {initial_entropy!r}")
    if not math.isfinite(initial_entropy) or initial_entropy < 0:
        raise ValueError(f"initial_entropy must be a finite entropy >= 0 (nats), got {initial_entropy!r}")
    return low if initial_entropy < LN2 else torch.ones_like(low)  # (N,)


ENTROPY_FILTERS: dict[str, Callable[[Tensor, Tensor, object], Tensor]] = {
    "auto": _keep_auto,
    "always": _keep_always,
    "negative_only": _keep_negative_only,
    "never": _keep_never,
}
"""Completion filter δ_i modes: ``auto`` (Eq. 6), ``always`` (authors' code), ``negative_only``
(App. 13 "OnlyNeg"), ``never``."""


def entropy_keep_mask(
    mean_entropy: Tensor,
    advantages: Tensor,
    *,
    mode: str,
    threshold: float = LN2,
    initial_entropy: float | Tensor | None = None,
    group_size: int = 1,
) -> Tensor:
    """The completion filter δ_i of Eq. (6): True where a completion keeps its advantage.

    A completion is *low-entropy* when ⟨H⟩_i ≤ threshold (Eq. 6 rows 2–3 keep at equality, as the
    authors' code ``entropies <= ENT_THRESHOLD`` does). Modes:

    - ``auto``: Eq. (6). If ⟨H⟩_ini < ln 2 keep only low-entropy completions, else keep all
      (at ⟨H⟩_ini = ln 2 exactly, keep all). The gate compares with ln 2, Eq. (6)'s constant, not with
      ``threshold``. Needs ``initial_entropy``.
    - ``always``: keep only low-entropy completions (the authors' code).
    - ``negative_only``: drop only A<0 completions that are not low-entropy (App. 13).
    - ``never``: keep all.

    Args:
        mean_entropy: (N,) ⟨H⟩_i in nats.
        advantages: (N,) advantages (original, unshifted: the sign decides ``negative_only``).
        mode: one of `ENTROPY_FILTERS`.
        threshold: ⟨H⟩_i threshold in nats (ln 2 by default; the authors used 0.7, and 1.02–1.05 for Qwen).
        initial_entropy: ⟨H⟩_ini in nats, float or 0-d tensor (``auto`` only).
        group_size: G for `advantage_signs` (``negative_only``: A<0 up to rounding); 1: each row alone.

    Returns:
        (N,) bool δ_i.
    """
    fn = _lookup(ENTROPY_FILTERS, mode, "entropy_filter mode")
    _check_number(threshold, "entropy threshold")
    if not isinstance(mean_entropy, Tensor) or mean_entropy.dim() != 1:
        raise ValueError("mean_entropy must be an (N,) tensor (see mean_completion_entropy())")
    _check_group_size(group_size, mean_entropy.shape[0])
    _raise_if_any([_check_float_vector(advantages, mean_entropy.shape[0], "advantages")])
    return _keep(mean_entropy, _signs(advantages, group_size), fn, threshold, initial_entropy)  # (N,)


def _keep(mean_entropy: Tensor, signs: Tensor, mode_fn, threshold: float, initial_entropy) -> Tensor:
    low = mean_entropy.detach() <= threshold  # (N,) equality keeps (Eq. 6 row 3); nan is never low
    return mode_fn(low, signs, initial_entropy)  # (N,) signs from `advantage_signs`


def _check_number(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def shift_advantages(advantages: Tensor, mean_entropy: Tensor, keep: Tensor, gamma: float) -> Tensor:
    """A'_i = δ_i · (A_i − γ·⟨H⟩_i): Eq. (7)'s δ and −γ⟨H⟩ as realized in the authors' code.

    ⟨H⟩_i is detached, so the shift changes the weight of each completion's policy gradient but adds no
    gradient through the entropy. It applies to every kept completion, A_i=0 included.

    Args:
        advantages: (N,) original advantages.
        mean_entropy: (N,) ⟨H⟩_i in nats.
        keep: (N,) bool δ_i from `entropy_keep_mask`.
        gamma: γ ≥ 0 typically (the paper's 0.1).

    Returns:
        (N,) shifted advantages, in float32 or the advantages' wider dtype.
    """
    _check_number(gamma, "gamma")
    if not all(isinstance(t, Tensor) for t in (advantages, mean_entropy, keep)) or keep.dtype != torch.bool or keep.shape != advantages.shape or mean_entropy.shape != advantages.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, mean_entropy {tuple(mean_entropy.shape)} and keep "
            f"{tuple(keep.shape)} must all be (N,), keep bool"
        )
    return _shift(advantages, mean_entropy, keep, gamma)  # (N,)


def _shift(advantages: Tensor, mean_entropy: Tensor, keep: Tensor, gamma: float) -> Tensor:
    dtype = torch.promote_types(advantages.dtype, torch.float32)
    shifted = advantages.to(dtype) - gamma * mean_entropy.detach().to(dtype)  # (N,)
    return torch.where(keep, shifted, 0.0)  # (N,)


# --------------------------------------------------------------------------------------------------
# Advantages (Eq. 8) and the GTPO loss (Eq. 7)
# --------------------------------------------------------------------------------------------------

ADVANTAGE_SCALES = ("group", "none")
"""``group``: (R − mean)/(std + 1e-4) with torch.std's unbiased std, as TRL; ``none``: R − mean."""


def group_advantages(rewards: Tensor, group_size: int, *, scale: str = "group") -> Tensor:
    """Group-relative advantages Â_i = (R_i − mean_g R)/(std_g R + 1e-4), Eq. (8), for use without TRL.

    ``std`` is the unbiased (Bessel-corrected) group std of ``torch.std``, exactly as TRL's
    ``GRPOTrainer`` with ``scale_rewards="group"``; ``scale="none"`` returns R_i − mean_g R (the
    authors' code, TRL's ``scale_rewards="none"``).

    Args:
        rewards: (N,) float rewards; rows g*G .. g*G+G-1 form group g.
        group_size: G.
        scale: ``"group"`` or ``"none"``.

    Returns:
        (N,) advantages in the rewards' dtype.

    >>> group_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2, scale="none").tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    _lookup(ADVANTAGE_SCALES, scale, "advantage scale")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    check = _check_float_vector(rewards, None, "rewards")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"N={rewards.shape[0]} rewards is not a multiple of group_size={group_size}")
    if scale == "group" and group_size < 2:
        raise ValueError("scale='group' needs group_size >= 2 (the unbiased std of one reward is undefined)")
    _raise_if_any([check])
    grouped = rewards.view(-1, group_size)  # (n_groups, G)
    centered = grouped - grouped.mean(dim=-1, keepdim=True)  # (n_groups, G)
    if scale == "group":
        centered = centered / (grouped.std(dim=-1, keepdim=True) + 1e-4)  # (n_groups, G)
    return centered.reshape(-1)  # (N,)


# Aggregations: (token_loss (N, T) zero at padding, valid (N, T), n_conflict (N,), normalizer) -> ().
# Only the normalization differs; λ, δ and the entropy shift are already in token_loss.


def _aggregate_sequence(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # Eq. (7): token mean per completion, then mean over completions (= TRL's loss_type="grpo").
    per_completion = token_loss.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)
    return per_completion.sum() / max(per_completion.shape[0], 1)  # ()


def _aggregate_bnpo(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # TRL's "bnpo": token mean over the micro-batch's valid tokens.
    return token_loss.sum() / valid.sum().clamp(min=1)  # ()


def _aggregate_dr_grpo(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # TRL's "dr_grpo" (Dr. GRPO): a constant normalizer, rows × max_completion_length.
    return token_loss.sum() / (token_loss.shape[0] * normalizer)  # ()


def _aggregate_dapo(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # TRL's "dapo": token sum over the valid tokens of the whole global batch per rank (num_items_in_batch
    # / num_processes), so micro-batches and ranks add up to one token mean over the batch.
    return token_loss.sum() / normalizer  # ()


def _aggregate_reference(token_loss: Tensor, valid: Tensor, n_conflict: Tensor, normalizer) -> Tensor:
    # Authors' code (Listing 3): each completion's token mean / max(#conflict positions, 1), summed.
    per_completion = token_loss.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)  # (N,)
    return (per_completion / n_conflict.clamp(min=1)).sum()  # ()


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, Tensor, object], Tensor]] = {
    "sequence": _aggregate_sequence,
    "grpo": _aggregate_sequence,
    "bnpo": _aggregate_bnpo,
    "dr_grpo": _aggregate_dr_grpo,
    "dapo": _aggregate_dapo,
    "reference": _aggregate_reference,
}
"""Loss aggregation: ``sequence`` = ``grpo`` (Eq. 7), TRL 1.16's ``bnpo``, ``dr_grpo`` and ``dapo``
normalizations, or ``reference`` (authors' code). docs/core.md gives each formula."""


def _aggregation_normalizer(aggregation: str, max_completion_length, token_normalizer):
    """The one extra number an aggregation needs (static checks) and its deferred device check, if any."""
    if aggregation != "dr_grpo" and max_completion_length is not None:
        raise ValueError(f"max_completion_length is used only by aggregation='dr_grpo', not {aggregation!r}")
    if aggregation != "dapo" and token_normalizer is not None:
        raise ValueError(f"token_normalizer is used only by aggregation='dapo', not {aggregation!r}")
    if aggregation == "dr_grpo":
        if isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int) or max_completion_length < 1:
            raise ValueError(
                "aggregation='dr_grpo' divides by N × max_completion_length: pass max_completion_length=<int >= 1> "
                f"(the generation limit, TRL's GRPOConfig.max_completion_length), got {max_completion_length!r}"
            )
        return max_completion_length, None
    if aggregation != "dapo":
        return None, None
    hint = ("aggregation='dapo' divides by the valid tokens of the whole global batch per rank: pass "
            "token_normalizer=<number > 0> (TRL: num_items_in_batch / num_processes)")
    if isinstance(token_normalizer, Tensor):
        if token_normalizer.numel() != 1 or token_normalizer.is_complex():
            raise ValueError(f"{hint}, got a tensor of shape {tuple(token_normalizer.shape)}")
        value = token_normalizer.detach().reshape(()).float()  # () stays on its device
        return value, (~(torch.isfinite(value) & (value > 0)), lambda: f"{hint}, got {value.item()!r}")
    if isinstance(token_normalizer, bool) or not isinstance(token_normalizer, (int, float)) or not (
        math.isfinite(token_normalizer) and token_normalizer > 0
    ):
        raise ValueError(f"{hint}, got {token_normalizer!r}")
    return float(token_normalizer), None

ENTROPY_TERMS = ("advantage", "differentiable", "none")
"""How −γ⟨H⟩_i enters: advantage shift (authors' code), differentiable +γ·mean⟨H⟩ term, or not at all."""


def gtpo_loss(
    per_token_logps: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    *,
    forward_span: Tensor | None = None,
    backward_span: Tensor | None = None,
    old_per_token_logps: Tensor | None = None,
    token_entropy: Tensor | None = None,
    positive_weight: float = 2.0,
    combine: str = "union",
    entropy_filter: str = "auto",
    entropy_threshold: float = LN2,
    initial_entropy: float | Tensor | None = None,
    gamma: float = 0.1,
    entropy_term: str = "advantage",
    aggregation: str = "sequence",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    importance_weights: Tensor | None = None,
    group_size: int = 1,
    max_completion_length: int | None = None,
    token_normalizer: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GTPO policy loss −J_GTPO of Eq. (7), with the variants of the authors' code.

    Per valid token: ``ℓ_{i,t} = −λ_{i,t} · min(r·A'_i, clip(r, 1−ε_low, 1+ε_high)·A'_i)`` with
    ``r = exp(logp − logp_old.detach())``; without ``old_per_token_logps`` the ratio is
    ``exp(logp − logp.detach())`` (value 1, carries the gradient) and no clipping applies (one
    iteration per batch, π = π_old). Steps:

    1. λ from the spans and the signs of the *original* advantages (`conflict_weights`); λ ≡ 1 when
       the spans are None.
    2. ⟨H⟩_i from ``token_entropy`` (`mean_completion_entropy`) and δ_i (`entropy_keep_mask`).
    3. ``entropy_term="advantage"``: A' = δ·(A − γ⟨H⟩.detach()) (`shift_advantages`); otherwise
       A' = δ·A, and ``"differentiable"`` adds +γ·mean_i ⟨H⟩_i (with gradient, over all N rows,
       not gated by δ, as Eq. 7 is written).
    4. Aggregation of ℓ (only the normalization differs; TRL 1.16's ``_compute_loss`` formulas):
       ``sequence`` = ``grpo``: mean over completions of each completion's token mean (Eq. 7);
       ``bnpo``: Σ ℓ / Σ valid tokens of the micro-batch; ``dr_grpo``: Σ ℓ / (N·max_completion_length);
       ``dapo``: Σ ℓ / token_normalizer; ``reference``: Σ_i token-mean_i / max(|conflict positions_i|, 1)
       (Listing 3; positions counted as |M^fw ∪ M^bw|, where Listing 2's OR of a still-reversed backward
       mask counts max(|M^fw|, |M^bw|)).

    Args:
        per_token_logps: (N, T) log π_θ of the sampled tokens (float32 or bfloat16; math in float32).
        completion_mask: (N, T) bool or 0/1 (the spans assume right padding, the loss does not).
        advantages: (N,) original advantages A_i (e.g. TRL's, or `group_advantages`).
        forward_span, backward_span: (N, T) bool from `conflict_spans`, both or neither.
        old_per_token_logps: (N, T) log π_θ_old when π_old ≠ π (several iterations per batch).
        token_entropy: (N, T) entropies in nats (`token_entropy`); needed unless entropy parts are off.
        positive_weight, combine: see `conflict_weights`.
        entropy_filter, entropy_threshold, initial_entropy: see `entropy_keep_mask`.
        gamma: γ of Eq. (7).
        entropy_term: one of `ENTROPY_TERMS`.
        aggregation: one of `AGGREGATIONS`.
        epsilon_low, epsilon_high: PPO clip range, used only with ``old_per_token_logps``.
        importance_weights: (N, T) or (N, 1) non-negative weights that multiply each token's loss,
            detached: TRL's vLLM importance-sampling correction π_θold/π_vLLM (truncated or masked),
            applied exactly where TRL's GRPO loss applies it, after clipping and λ.
        max_completion_length: ``dr_grpo`` only (required there): the generation length limit.
        token_normalizer: ``dapo`` only (required there): float or 1-element tensor > 0, the valid tokens
            of the whole global batch divided by the number of processes (TRL's ``num_items_in_batch /
            num_processes``); the caller rescales to its accumulation window as TRL does.
        group_size: G when the rows are whole groups, for `advantage_signs` (λ's signs, ``negative_only``,
            the metrics' "A≠0"); the default 1 judges each row alone (|A_i| ≤ 1e-6 is 0), for micro-batches
            that mix groups (TRL shuffles them). Spans from `conflict_spans` already exclude such rows.

    Returns:
        ``(loss, metrics)``: a float32 scalar to minimize, and detached float32 scalars (see
        docs/core.md for formulas; fractions with an empty denominator are 0):

        - ``gtpo/conflict_token_frac``: valid tokens in either span / valid tokens, both over rows
          with A≠0 (the rows that take part in conflict detection).
        - ``gtpo/forward_span_len``, ``gtpo/backward_span_len``: mean span length over rows with A≠0.
        - ``gtpo/protected_negative_frac``: valid tokens of A<0 rows with λ=0 / valid tokens of A<0 rows.
        - ``gtpo/filtered_frac``: completions with δ=0 / N.
        - ``gtpo/mean_entropy``: mean ⟨H⟩_i over non-empty completions (only when token_entropy is given).
        - ``gtpo/mean_lambda``: mean λ over valid tokens.
        - ``gtpo/sign_flipped_frac``: |{i: δ_i=1, A_i>0, A'_i<0}| / |{i: δ_i=1, A_i≠0}|, signs of A by
          `advantage_signs`: kept completions whose positive advantage the entropy shift A' = A − γ⟨H⟩_i
          turns negative (λ stays ``positive_weight`` on their spans). 0 unless ``entropy_term="advantage"``.

    Raises:
        ValueError: on shapes or dtypes that disagree, non-finite advantages, an unknown mode, or
            entropy parts switched on without ``token_entropy``.
    """
    _lookup(ENTROPY_TERMS, entropy_term, "entropy_term")
    aggregate = _lookup(AGGREGATIONS, aggregation, "aggregation")
    _lookup(ENTROPY_FILTERS, entropy_filter, "entropy_filter mode")
    _lookup(COMBINE_MODES, combine, "combine mode")
    _check_weight(positive_weight)
    for name, value in (("gamma", gamma), ("entropy_threshold", entropy_threshold),
                        ("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high)):
        _check_number(value, name)
    if epsilon_low < 0 or epsilon_high < 0:
        raise ValueError(f"epsilon_low and epsilon_high must be >= 0, got {epsilon_low}, {epsilon_high}")

    if not isinstance(per_token_logps, Tensor) or per_token_logps.dim() != 2 or not per_token_logps.is_floating_point():
        raise ValueError("per_token_logps must be an (N, T) floating tensor")
    shape = tuple(per_token_logps.shape)
    n = shape[0]
    # Any 0/1 mask works for the loss; right padding only matters where the spans are computed.
    valid, checks = _check_mask(completion_mask, shape, right_padded=False)
    checks.append(_check_float_vector(advantages, n, "advantages"))
    if (forward_span is None) != (backward_span is None):
        raise ValueError("pass both forward_span and backward_span (from conflict_spans), or neither")
    for name, t in (("forward_span", forward_span), ("backward_span", backward_span),
                    ("old_per_token_logps", old_per_token_logps), ("token_entropy", token_entropy)):
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != shape):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must have the shape of per_token_logps {shape}, got {got}")
    if importance_weights is not None and (
        not isinstance(importance_weights, Tensor) or tuple(importance_weights.shape) not in (shape, (n, 1))
    ):
        got = tuple(importance_weights.shape) if isinstance(importance_weights, Tensor) else type(importance_weights).__name__
        raise ValueError(f"importance_weights must have shape {shape} or {(n, 1)} (per token or per sequence), got {got}")
    if forward_span is not None and (forward_span.dtype != torch.bool or backward_span.dtype != torch.bool):
        raise ValueError("forward_span and backward_span must be bool tensors (from conflict_spans)")
    needs_entropy = entropy_filter != "never" or (entropy_term != "none" and gamma != 0)
    if token_entropy is None and needs_entropy:
        raise ValueError(
            f"token_entropy is needed for entropy_filter={entropy_filter!r} with entropy_term={entropy_term!r}, "
            f"gamma={gamma}: pass token_entropy (see token_entropy()), or switch the entropy parts off with "
            "entropy_filter='never' and gamma=0 (or entropy_term='none')"
        )
    _check_group_size(group_size, n, "completions")
    normalizer, normalizer_check = _aggregation_normalizer(aggregation, max_completion_length, token_normalizer)
    if normalizer_check is not None:
        checks.append(normalizer_check)
    _raise_if_any(checks)

    a = advantages.float()  # (N,) original A_i: the conflict signs come from here
    signs = _signs(a, group_size).float()  # (N,) in {-1, 0, 1}, zero up to rounding -> 0
    # 1. λ (Eq. 5/21).
    if forward_span is None:
        lam = torch.ones(shape, dtype=torch.float32, device=per_token_logps.device)  # (N, T)
        in_span = torch.zeros(shape, dtype=torch.bool, device=per_token_logps.device)  # (N, T)
        fw = bw = in_span
    else:
        fw, bw = forward_span & valid, backward_span & valid  # (N, T)
        in_span = fw | bw  # (N, T)
        lam = COMBINE_MODES[combine](fw, bw, signs, float(positive_weight))  # (N, T)

    # 2.–3. ⟨H⟩_i, δ_i and the advantages the policy gradient uses (Eqs. 6–7).
    mean_h = None
    if token_entropy is not None:
        mean_h = _mean_entropy(token_entropy, valid)  # (N,) differentiable
        keep = _keep(mean_h, signs, ENTROPY_FILTERS[entropy_filter], entropy_threshold, initial_entropy)  # (N,) δ_i
    else:
        keep = torch.ones(n, dtype=torch.bool, device=a.device)  # (N,) filter "never"
    if entropy_term == "advantage" and mean_h is not None:
        a_used = _shift(a, mean_h, keep, gamma)  # (N,)
    else:
        a_used = torch.where(keep, a, 0.0)  # (N,)

    # 4. Policy-gradient surrogate (Eq. 7 / PPO clipping as TRL's GRPO).
    # Padding is zeroed before exp so that whatever it holds (inf, nan) gives neither value nor gradient.
    logp = torch.where(valid, per_token_logps.float(), 0.0)  # (N, T)
    a_tok = a_used.unsqueeze(-1)  # (N, 1)
    if old_per_token_logps is None:
        ratio = torch.exp(logp - logp.detach())  # (N, T) value 1, carries the gradient
        surrogate = ratio * a_tok  # (N, T)
    else:
        old = torch.where(valid, old_per_token_logps.detach().float(), 0.0)  # (N, T)
        ratio = torch.exp(logp - old)  # (N, T)
        clipped = ratio.clamp(1 - epsilon_low, 1 + epsilon_high)  # (N, T)
        surrogate = torch.min(ratio * a_tok, clipped * a_tok)  # (N, T)
    token_loss = -surrogate * lam  # (N, T)
    if importance_weights is not None:
        token_loss = token_loss * importance_weights.detach().float()  # (N, T) vLLM sampling correction
    token_loss = torch.where(valid, token_loss, 0.0)  # (N, T)
    n_conflict = in_span.sum(dim=-1)  # (N,)
    if isinstance(normalizer, Tensor):
        normalizer = normalizer.to(token_loss.device)
    loss = aggregate(token_loss, valid, n_conflict, normalizer)  # ()
    if entropy_term == "differentiable" and mean_h is not None and gamma != 0:
        loss = loss + gamma * mean_h.sum() / max(n, 1)  # () minimizing ⟨H⟩ (Eq. 7's −γ⟨H⟩_i in J)

    metrics = _metrics(valid, signs, fw, bw, in_span, lam, keep, mean_h, a_used)
    return loss, metrics


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    return num.float() / den.float().clamp(min=1)  # () 0 when the denominator is empty


@torch.no_grad()
def _metrics(valid, signs, fw, bw, in_span, lam, keep, mean_h, a_used) -> dict[str, Tensor]:
    active = (signs != 0).unsqueeze(-1)  # (N, 1) rows that take part in conflict detection (advantage_signs)
    negative = (signs < 0).unsqueeze(-1)  # (N, 1)
    n_active = active.sum()  # ()
    metrics = {
        "gtpo/conflict_token_frac": _ratio((in_span & active).sum(), (valid & active).sum()),
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
