"""Triton kernels of the one-pass LM head (:mod:`gtpo.forward.lm_head`) on CUDA/XPU: each logit tile read once.

TRL's chunked kernel (trl/kernels/chunked_logprob.py) folds a tile at one temperature; running it once per
temperature reads every tile twice in the forward and, with ``entropy_term="differentiable"``, runs its backward
twice and adds the two gradient tiles. These kernels do the same arithmetic for both temperatures in one pass:

- :func:`fold_two_temperatures_kernel`, one program per token row: the online-logsumexp statistics of the raw
  logits z (temperature 1: running max m₁, s₁ = Σ e^{z−m₁}, x₁ = Σ z·e^{z−m₁}) and of z/T (m_T, s_T, x_T), and the
  target's z/T; the same statistics TRL's ``_forward_kernel`` keeps, with the same operations in the same order
  (its ``_transform`` at 1, then · 1/T), so each temperature's are those of TRL's kernel at that temperature.
- :func:`two_temperature_backward_kernel`, one program per (row, block): overwrites the tile with
  ∂L/∂(projection) = ((1[j=y] − p_T,j)·g_lp/T − p₁,j (log p₁,j + H₁)·g_H)·(1 − tanh²)·scale, summed in float32 and
  rounded to the tile's dtype once (TRL's two passes round each term, then add them in the tile's dtype).

Without Triton these names exist but are plain functions that are never called (``lm_head`` takes the torch path).
"""

from __future__ import annotations

from gtpo.forward.trl_head import trl_kernel

# triton.language as TRL imports it where Triton is installed (it ships with CUDA torch, not with the CPU wheel, so
# gtpo does not import it itself); None elsewhere, where nothing below is compiled or called.
tl = getattr(trl_kernel, "tl", None)
_jit = trl_kernel._jit
_transform = trl_kernel._transform  # scale, soft-cap, · 1/T: TRL's, so that the logits are computed as TRL's are
BLOCK_SIZE = trl_kernel._BLOCK_SIZE  # vocabulary columns a program reads at a time, TRL's


@_jit
def _fold_block(z, mask, m, s, x):
    """One block of logits z (masked entries -inf) into the running (m, s, x) of one temperature, as TRL's kernel."""
    new_m = tl.maximum(m, tl.max(z, axis=0))
    rescale = tl.exp(m - new_m)
    e = tl.where(mask, tl.exp(z - new_m), 0.0)
    s = s * rescale + tl.sum(e, axis=0)
    x = x * rescale + tl.sum(e * tl.where(mask, z, 0.0), axis=0)
    return new_m, s, x


@_jit
def fold_two_temperatures_kernel(
    mm_ptr,
    mm_stride,
    targets_ptr,
    m1_ptr,
    s1_ptr,
    x1_ptr,
    mt_ptr,
    st_ptr,
    xt_ptr,
    target_t_ptr,
    vocab_start,
    n_cols,
    logit_scale,
    softcap,
    inv_t,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = mm_ptr + row * mm_stride
    inv_t = tl.cast(inv_t, tl.float32)
    m1, s1, x1 = tl.load(m1_ptr + row), tl.load(s1_ptr + row), tl.load(x1_ptr + row)
    mt, st, xt = tl.load(mt_ptr + row), tl.load(st_ptr + row), tl.load(xt_ptr + row)
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        y = tl.load(row_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        z = _transform(y, logit_scale, softcap, 1.0, HAS_SOFTCAP)
        z_t = tl.where(mask, z * inv_t, -float("inf"))
        z = tl.where(mask, z, -float("inf"))
        m1, s1, x1 = _fold_block(z, mask, m1, s1, x1)
        mt, st, xt = _fold_block(z_t, mask, mt, st, xt)
    tl.store(m1_ptr + row, m1)
    tl.store(s1_ptr + row, s1)
    tl.store(x1_ptr + row, x1)
    tl.store(mt_ptr + row, mt)
    tl.store(st_ptr + row, st)
    tl.store(xt_ptr + row, xt)
    local = tl.load(targets_ptr + row) - vocab_start
    if (local >= 0) & (local < n_cols):
        y = tl.load(row_ptr + local).to(tl.float32)
        tl.store(target_t_ptr + row, _transform(y, logit_scale, softcap, 1.0, HAS_SOFTCAP) * inv_t)


@_jit
def two_temperature_backward_kernel(
    mm_ptr,
    mm_stride,
    targets_ptr,
    log_zt_ptr,
    log_z1_ptr,
    entropy_ptr,
    grad_logprobs_ptr,
    grad_entropy_ptr,
    vocab_start,
    n_cols,
    logit_scale,
    softcap,
    inv_t,
    HAS_SOFTCAP: tl.constexpr,
    HAS_LOGPROB_GRAD: tl.constexpr,
    HAS_ENTROPY_GRAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    logit_scale = tl.cast(logit_scale, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    inv_t = tl.cast(inv_t, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    ptrs = mm_ptr + row * mm_stride + offsets
    y = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32) * logit_scale
    if HAS_SOFTCAP:
        t = 2 * tl.sigmoid(2 * y / softcap) - 1  # tanh, as TRL's kernel computes it
        z = softcap * t
    else:
        z = y
    grad = tl.zeros((BLOCK_SIZE,), tl.float32)
    if HAS_LOGPROB_GRAD:  # d log p_T(y) / dz_j = (1[j = y] - p_T,j) / T
        p_t = tl.exp(z * inv_t - tl.load(log_zt_ptr + row))
        is_target = (offsets + vocab_start) == tl.load(targets_ptr + row)
        grad += tl.load(grad_logprobs_ptr + row) * (is_target.to(tl.float32) - p_t) * inv_t
    if HAS_ENTROPY_GRAD:  # d H_1 / dz_j = -p_1,j (log p_1,j + H_1)
        log_p1 = z - tl.load(log_z1_ptr + row)
        grad -= tl.load(grad_entropy_ptr + row) * tl.exp(log_p1) * (log_p1 + tl.load(entropy_ptr + row))
    if HAS_SOFTCAP:
        grad = grad * (1 - t * t)
    grad = grad * logit_scale
    tl.store(ptrs, grad.to(mm_ptr.dtype.element_ty), mask=mask)
