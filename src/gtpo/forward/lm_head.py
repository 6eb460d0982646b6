"""The LM head in one pass: tempered log-probs and the temperature-1 entropy from the same logit tiles.

GTPO's entropies (Eq. 6-7) are those of the model's own next-token distribution (temperature 1, Sec. 4.2),
while the importance ratios use the log-probs of the sampling distribution (temperature T). TRL's chunked
kernel (`trl.kernels.ChunkedLogProbFunction`) projects hidden states onto the vocabulary tile by tile and
folds each tile into online-logsumexp statistics at one temperature. :func:`token_scores` folds the same tile
at both temperatures, so the `[N, V]` projection, by far the largest cost of the head, runs once instead of
twice (the earlier two-pass head ran TRL's kernel a second time at T = 1).

Per token, with raw logits z (after `logit_scale` and soft-capping), running max m and tile sums
s₁ = Σ e^{z−m}, x₁ = Σ z·e^{z−m}, s_T = Σ e^{(z−m)/T}, x_T = Σ z·e^{(z−m)/T}:

    log Z₁ = m + log s₁,          H₁ = log Z₁ − x₁ / s₁            (temperature-1 entropy)
    log Z_T = m/T + log s_T,      H_T = log Z_T − (x_T / s_T) / T  (sampling entropy, for TRL's metric)
    log p_T(y) = z_y / T − log Z_T                                   (the ratio's log-prob)

Backward (recomputing each tile, as TRL's does): ∂ log p_T(y)/∂z_j = (1[j=y] − p_T,j)/T and
∂H₁/∂z_j = −p₁,j (log p₁,j + H₁), then through soft-capping and the logit scale.

On CUDA/XPU with Triton, `gtpo.forward.head_kernels` folds both temperatures from one read of each tile, with
TRL's arithmetic, and writes both gradient terms in one pass (running TRL's kernels once per temperature read each
tile twice: 1.25-1.3x TRL's forward on an H200, docs/performance.md). Elsewhere `gtpo.core.fold_logits`
computes both temperatures' statistics from one logit tile, sharing its max and its shift; it is also what
`gtpo.core.token_entropy` folds, so the trainer, `gtpo inspect` and core compute H one way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gtpo import core
from gtpo.forward import head_kernels
from gtpo.forward.trl_head import trl_kernel, trl_utils

# TRL's tile sizes, read from TRL so that both heads tile alike: vocabulary columns per tile on the torch path
# (trl/trainer/utils.py), token rows per tile in the Triton kernels (trl/kernels/chunked_logprob.py).
VOCAB_CHUNK = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
TOKEN_CHUNK = trl_kernel.TOKEN_CHUNK_SIZE


@dataclass
class HeadScores:
    """Per-token outputs of :func:`token_scores`, each of shape (N,), float32.

    Attributes:
        log_probs: log p_T(target) under the tempered distribution; carries the gradient.
        entropy: H of the temperature-1 distribution; carries a gradient only with ``differentiable_entropy``.
        sampling_entropy: H of the tempered distribution (what TRL's `entropy` metric reports); no gradient.
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor
    sampling_entropy: torch.Tensor


def token_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    *,
    chunk_size: int = VOCAB_CHUNK,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    differentiable_entropy: bool = False,
) -> HeadScores:
    """Tempered log-probs and temperature-1 entropies of ``hidden @ weight.T``, one projection per tile.

    Args:
        hidden: (N, H) hidden states of the scored positions.
        weight: (V, H) LM-head weight; ``bias``: (V,) or None.
        targets: (N,) long, the next-token labels (all valid, in [0, V)).
        temperature: the sampling temperature T > 0 that divides the logits of ``log_probs``.
        chunk_size: vocabulary columns per tile (TRL's 32768).
        softcap: final-logit soft-capping (Gemma's), or None.
        logit_scale: multiplier of the logits before soft-capping (Cohere, Granite, ...).
        differentiable_entropy: whether ``entropy`` carries a gradient (GTPO's entropy_term="differentiable").

    Returns:
        HeadScores with three (N,) float32 tensors.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if temperature == 1.0:
        # One temperature: TRL's kernel as is (its entropy is the temperature-1 one).
        log_probs, entropy, *_ = trl_kernel.ChunkedLogProbFunction.apply(
            hidden, weight, bias, targets, 1.0, chunk_size, softcap, logit_scale, ("log_probs", "entropy")
        )
        return HeadScores(log_probs, entropy if differentiable_entropy else entropy.detach(), entropy.detach())
    log_probs, entropy, sampling_entropy = _TwoTemperatureHead.apply(
        hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale
    )
    return HeadScores(log_probs, entropy if differentiable_entropy else entropy.detach(), sampling_entropy)


@torch.no_grad()
def clamped_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    clamp: float,
    *,
    chunk_size: int = VOCAB_CHUNK,
    softcap: float | None = None,
    logit_scale: float = 1.0,
) -> torch.Tensor:
    """(N,) temperature-1 entropy with p clamped inside the log, −Σ_v p_v·ln max(p_v, clamp), as the authors' code
    computes it (`core.entropy.clamped_entropy_terms`), without a gradient. Two more passes over the vocabulary tiles
    (the row's log-normaliser, then the clamped sum): only `GTPOConfig.authors_code` asks for it."""
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    buffer = torch.empty((min(max(n_tokens, 1), TOKEN_CHUNK), chunk_size), device=hidden.device, dtype=hidden.dtype)
    log_normaliser = torch.full((n_tokens,), -math.inf, device=hidden.device, dtype=torch.float32)
    for token_start, token_end, start, end in _tiles(n_tokens, vocab, chunk_size):
        z = _transform(_project(buffer, hidden[token_start:token_end], weight, bias, start, end, hidden.dtype),
                       logit_scale, softcap)  # fmt: skip
        rows = log_normaliser[token_start:token_end]
        rows.copy_(torch.logaddexp(rows, torch.logsumexp(z, dim=-1)))
    entropy = torch.zeros(n_tokens, device=hidden.device, dtype=torch.float32)
    for token_start, token_end, start, end in _tiles(n_tokens, vocab, chunk_size):
        z = _transform(_project(buffer, hidden[token_start:token_end], weight, bias, start, end, hidden.dtype),
                       logit_scale, softcap)  # fmt: skip
        entropy[token_start:token_end] += core.clamped_entropy_terms(z, log_normaliser[token_start:token_end], clamp)
    return entropy


def _transform_with_tanh(
    tile: torch.Tensor, logit_scale: float, softcap: float | None, keep_tanh: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(z, t): the logits z of a tile in float32, z = softcap·tanh(s·x/softcap) (or s·x without a softcap), and
    t = tanh(s·x/softcap), which the backward needs for the softcap's derivative 1 − t² (None without a softcap or
    with ``keep_tanh=False``, which then computes z in place of t). In place when the tile already is float32."""
    z = tile.float()
    if logit_scale != 1.0:
        z.mul_(logit_scale)
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return (t * softcap, t) if keep_tanh else (t.mul_(softcap), None)


def _transform(tile: torch.Tensor, logit_scale: float, softcap: float | None) -> torch.Tensor:
    """Logits z of a tile in float32 (the forward's half of :func:`_transform_with_tanh`)."""
    return _transform_with_tanh(tile, logit_scale, softcap, keep_tanh=False)[0]


def _torch_fold(tile, targets, stats, vocab_start, n_cols, logit_scale, softcap, inv_t) -> None:
    """Fold one (n, n_cols) logit tile into both temperatures' statistics with core's fold (`core.fold_logits`,
    the one `core.token_entropy` uses), and track the target's logit; updates ``stats`` rows in place."""
    z = _transform(tile, logit_scale, softcap)  # (n, c)
    target = stats[5]
    local = targets - vocab_start
    in_tile = (local >= 0) & (local < n_cols)
    target.copy_(torch.where(in_tile, z.gather(1, local.clamp(0, n_cols - 1).unsqueeze(1)).squeeze(1), target))
    running = list(stats[:5])  # [m, s₁, x₁, s_T, x_T] of these rows
    core.fold_logits(z, running, inv_t)
    for destination, value in zip(stats[:5], running, strict=True):
        destination.copy_(value)


def _triton_fold(tile, targets, stats, vocab_start, n_cols, logit_scale, softcap, inv_t) -> None:
    """Both temperatures' statistics from one read of the tile (`head_kernels.fold_two_temperatures_kernel`)."""
    m1, s1, x1, mt, st, xt, target_t = stats
    head_kernels.fold_two_temperatures_kernel[(tile.shape[0],)](
        tile, tile.stride(0), targets, m1, s1, x1, mt, st, xt, target_t, vocab_start, n_cols,
        logit_scale=logit_scale, softcap=softcap or 1.0, inv_t=inv_t, HAS_SOFTCAP=softcap is not None,
        BLOCK_SIZE=head_kernels.BLOCK_SIZE,
    )  # fmt: skip


def _tiles(n_tokens: int, vocab: int, chunk_size: int):
    for token_start in range(0, n_tokens, TOKEN_CHUNK):
        token_end = min(token_start + TOKEN_CHUNK, n_tokens)
        for start in range(0, vocab, chunk_size):
            yield token_start, token_end, start, min(start + chunk_size, vocab)


def _project(buffer, hidden_chunk, weight, bias, start, end, compute_dtype):
    tile = buffer[: hidden_chunk.shape[0], : end - start]
    torch.mm(hidden_chunk, weight[start:end].to(compute_dtype).t(), out=tile)
    if bias is not None:
        tile.add_(bias[start:end].to(compute_dtype))
    return tile


class _TwoTemperatureHead(torch.autograd.Function):
    """(log p_T(y), H₁, H_T) per token; see the module docstring for the statistics and the gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale):
        ctx.set_materialize_grads(False)
        device, n_tokens, vocab = hidden.device, hidden.shape[0], weight.shape[0]
        compute_dtype = (
            torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        )
        inv_t = 1.0 / temperature
        triton = trl_kernel._use_triton(device)

        def zeros():
            return torch.zeros(n_tokens, device=device, dtype=torch.float32)

        def minus_inf():
            return torch.full((n_tokens,), -math.inf, device=device, dtype=torch.float32)

        if triton:
            stats = (minus_inf(), zeros(), zeros(), minus_inf(), zeros(), zeros(), zeros())
        else:
            stats = (minus_inf(), zeros(), zeros(), zeros(), zeros(), zeros())
        fold = _triton_fold if triton else _torch_fold
        buffer = torch.empty((min(n_tokens, TOKEN_CHUNK), chunk_size), device=device, dtype=compute_dtype)
        for token_start, token_end, start, end in _tiles(n_tokens, vocab, chunk_size):
            rows = slice(token_start, token_end)
            tile = _project(buffer, hidden[rows].to(compute_dtype), weight, bias, start, end, compute_dtype)
            fold(tile, targets[rows], [s[rows] for s in stats], start, end - start, logit_scale, softcap, inv_t)

        if triton:  # the kernel keeps each temperature's statistics of its own logits (z and z / T), as TRL's
            m1, s1, x1, mt, st, xt, target_t = stats
            log_z1 = m1 + torch.log(s1)
            log_zt = mt + torch.log(st)
            entropy = log_z1 - x1 / s1
            sampling_entropy = log_zt - xt / st
            log_probs = target_t - log_zt
        else:
            m, s1, _, st, _, target = stats
            log_z1 = m + torch.log(s1)
            log_zt = m * inv_t + torch.log(st)
            entropy = core.statistics_entropy(stats)
            sampling_entropy = core.statistics_entropy(stats, inv_t)
            log_probs = target * inv_t - log_zt
        ctx.save_for_backward(hidden, weight, bias, targets, log_z1, log_zt, entropy)
        ctx.settings = (compute_dtype, chunk_size, softcap, logit_scale, inv_t, triton)
        ctx.mark_non_differentiable(sampling_entropy)
        return log_probs, entropy, sampling_entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, _grad_sampling_entropy):
        hidden, weight, bias, targets, log_z1, log_zt, entropy = ctx.saved_tensors
        compute_dtype, chunk_size, softcap, logit_scale, inv_t, triton = ctx.settings
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        n_tokens, vocab = hidden.shape[0], weight.shape[0]
        grad_hidden = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if needs_weight else None
        grad_bias = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if needs_bias else None
        if grad_log_probs is None and grad_entropy is None:
            return (None,) * 8
        g_lp = None if grad_log_probs is None else grad_log_probs.float().contiguous()
        g_h = None if grad_entropy is None else grad_entropy.float().contiguous()
        buffer = torch.empty((min(n_tokens, TOKEN_CHUNK), chunk_size), device=hidden.device, dtype=compute_dtype)
        for token_start, token_end, start, end in _tiles(n_tokens, vocab, chunk_size):
            rows = slice(token_start, token_end)
            hidden_chunk = hidden[rows].to(compute_dtype)
            tile = _project(buffer, hidden_chunk, weight, bias, start, end, compute_dtype)
            part = (g_lp, g_h, targets, log_z1, log_zt, entropy)
            part = [None if x is None else x[rows] for x in part]
            grad_tile = (_triton_backward if triton else _torch_backward)(
                tile, *part, start, end - start, logit_scale, softcap, inv_t
            )
            w_chunk = weight[start:end].to(compute_dtype)
            if grad_hidden is not None:
                trl_kernel._addmm_fp32(grad_hidden[rows], grad_tile, w_chunk)
            if grad_weight is not None:
                trl_kernel._addmm_fp32(grad_weight[start:end], grad_tile.t(), hidden_chunk)
            if grad_bias is not None:
                grad_bias[start:end] += grad_tile.sum(dim=0, dtype=torch.float32)
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            *(None,) * 5,
        )


def _torch_backward(
    tile, g_lp, g_h, targets, log_z1, log_zt, entropy, vocab_start, n_cols, logit_scale, softcap, inv_t
):
    """∂L/∂(raw tile) for one (n, c) tile: the tempered log-prob's and the temperature-1 entropy's terms."""
    z, t = _transform_with_tanh(tile, logit_scale, softcap)  # may overwrite the tile: it is not read again
    grad = torch.zeros_like(z)
    if g_lp is not None:
        p_t = torch.exp(z * inv_t - log_zt.unsqueeze(1))  # (n, c)
        grad.sub_(p_t * (g_lp * inv_t).unsqueeze(1))
        local = targets - vocab_start
        in_tile = (local >= 0) & (local < n_cols)
        add = torch.where(in_tile, g_lp * inv_t, torch.zeros_like(g_lp))
        grad.scatter_add_(1, local.clamp(0, n_cols - 1).unsqueeze(1), add.unsqueeze(1))
    if g_h is not None:
        log_p1 = z - log_z1.unsqueeze(1)
        grad.sub_(log_p1.exp() * (log_p1 + entropy.unsqueeze(1)) * g_h.unsqueeze(1))
    if t is not None:
        grad.mul_(1 - t * t)
    grad.mul_(logit_scale)
    return grad.to(tile.dtype)


def _triton_backward(
    tile, g_lp, g_h, targets, log_z1, log_zt, entropy, vocab_start, n_cols, logit_scale, softcap, inv_t
):
    """The same gradient, both terms in one pass over the tile, which it overwrites
    (`head_kernels.two_temperature_backward_kernel`)."""
    grid = (tile.shape[0], -(-n_cols // head_kernels.BLOCK_SIZE))  # triton.cdiv, without importing triton here
    unused = log_zt  # a float32 row vector for the pointer of a term that is absent (its branch is compiled out)
    head_kernels.two_temperature_backward_kernel[grid](
        tile, tile.stride(0), targets, log_zt, log_z1, entropy,
        unused if g_lp is None else g_lp, unused if g_h is None else g_h, vocab_start, n_cols,
        logit_scale=logit_scale, softcap=softcap or 1.0, inv_t=inv_t, HAS_SOFTCAP=softcap is not None,
        HAS_LOGPROB_GRAD=g_lp is not None, HAS_ENTROPY_GRAD=g_h is not None, BLOCK_SIZE=head_kernels.BLOCK_SIZE,
    )  # fmt: skip
    return tile
