"""The single-pass LM head (gtpo.forward.lm_head.token_scores) against the two-pass result it replaces.

Invariant: folding one logit tile at two temperatures gives the same log-probs (temperature T), entropies
(temperature 1 and T) and gradients as running TRL's chunked kernel twice, once per temperature, within 1e-5
(forward) and 1e-5 relative (gradients). Checked on the torch fold (CPU, full layout) and on the Triton branch
with TRL's Triton kernels replaced by TRL's own torch tile functions (CPU: this checks our statistics and gradient
bookkeeping on that branch, not the kernels themselves); on a CUDA device the gpu-marked tests run the branch with
its real Triton kernels (gtpo.forward.head_kernels), against TRL's kernel run twice and a float64 brute force (seen
passing on an H200: docs/measurements/gpu-h200-20261126).
"""

from __future__ import annotations

import pytest
import torch
from trl.kernels import chunked_logprob as trl_kernel

from gtpo.forward import lm_head

OUTPUTS = ("log_probs", "entropy")


def _inputs(seed: int = 0, tokens: int = 48, width: int = 32, vocab: int = 1000):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=generator)
    weight = torch.randn(vocab, width, generator=generator) * 0.5  # logits of std ~3, as a trained LM head's
    bias = torch.randn(vocab, generator=generator) * 0.1
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    return hidden.requires_grad_(), weight.requires_grad_(), bias.requires_grad_(), targets


def _two_pass(hidden, weight, bias, targets, temperature, softcap, scale, chunk_size=300):
    """Today's reference: TRL's kernel at T (log-probs, sampling entropy), then again at 1 (entropy)."""
    apply = trl_kernel.ChunkedLogProbFunction.apply
    log_probs, sampling_entropy, *_ = apply(
        hidden, weight, bias, targets, temperature, chunk_size, softcap, scale, OUTPUTS
    )
    _, entropy, *_ = apply(hidden, weight, bias, targets, 1.0, chunk_size, softcap, scale, OUTPUTS)
    return log_probs, entropy, sampling_entropy


def _compare(temperature, softcap, scale):
    hidden, weight, bias, targets = _inputs()
    ours = lm_head.token_scores(
        hidden, weight, bias, targets, temperature, chunk_size=300, softcap=softcap, logit_scale=scale,
        differentiable_entropy=True,
    )  # fmt: skip
    log_probs, entropy, sampling_entropy = _two_pass(hidden, weight, bias, targets, temperature, softcap, scale)
    torch.testing.assert_close(ours.log_probs, log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy, entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.sampling_entropy, sampling_entropy, atol=1e-5, rtol=1e-5)
    assert not ours.sampling_entropy.requires_grad
    # The loss GTPO differentiates: a weighted sum of tempered log-probs plus the temperature-1 entropy term.
    weights = torch.linspace(-1, 1, len(targets))
    ours_grads = torch.autograd.grad((ours.log_probs * weights).sum() + ours.entropy.sum(), (hidden, weight, bias))
    reference = torch.autograd.grad((log_probs * weights).sum() + entropy.sum(), (hidden, weight, bias))
    for got, expected in zip(ours_grads, reference, strict=True):
        assert ((got - expected).norm() / expected.norm()).item() < 1e-5
    # The control: the two temperatures' entropies differ, so a swap would fail.
    if temperature != 1.0:
        assert (entropy - sampling_entropy).abs().max() > 1e-2


@pytest.mark.parametrize("temperature", [0.5, 0.7, 1.0])
@pytest.mark.parametrize(("softcap", "scale"), [(None, 1.0), (30.0, 0.8)])
def test_one_pass_equals_two_passes_on_the_torch_fold(temperature, softcap, scale):
    _compare(temperature, softcap, scale)


def _fused_fold_in_torch(tile, stride, targets, m1, s1, x1, mt, st, xt, target_t, vocab_start, n_cols, *,
                         logit_scale, softcap, inv_t, HAS_SOFTCAP, BLOCK_SIZE):  # fmt: skip
    """What `head_kernels.fold_two_temperatures_kernel` claims to compute: TRL's tile fold at 1 and at T."""
    common = dict(logit_scale=logit_scale, softcap=softcap, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ENTROPY=True,
                  HAS_LOG_SUM_SQ_PROBS=False, HAS_MEAN_LOGITS=False, HAS_IS_TOP1=False,
                  BLOCK_SIZE=BLOCK_SIZE)  # fmt: skip
    unused = torch.zeros_like(m1)
    trl_kernel._forward_tile(tile, stride, targets, m1, s1, x1, unused, unused, unused, unused.clone(), vocab_start,
                             n_cols, inv_t=1.0, **common)  # fmt: skip
    trl_kernel._forward_tile(tile, stride, targets, mt, st, xt, unused, unused, unused, target_t, vocab_start,
                             n_cols, inv_t=inv_t, **common)  # fmt: skip


def _fused_backward_in_torch(tile, stride, targets, log_zt, log_z1, entropy, g_lp, g_h, vocab_start, n_cols, *,
                             logit_scale, softcap, inv_t, HAS_SOFTCAP, HAS_LOGPROB_GRAD, HAS_ENTROPY_GRAD,
                             BLOCK_SIZE):  # fmt: skip
    """What `head_kernels.two_temperature_backward_kernel` claims to write: the sum of TRL's tile gradients of the
    tempered log-prob (at T) and of the temperature-1 entropy, in place of the tile."""
    common = dict(logit_scale=logit_scale, softcap=softcap, HAS_SOFTCAP=HAS_SOFTCAP, BLOCK_SIZE=BLOCK_SIZE)
    total = torch.zeros(tile.shape, dtype=torch.float32)
    if HAS_LOGPROB_GRAD:
        part = tile.clone()
        trl_kernel._backward_tile(part, stride, targets, log_zt, log_zt, g_lp, g_lp, vocab_start, n_cols, inv_t=inv_t,
                                  HAS_LOGPROB_GRAD=True, HAS_ENTROPY_GRAD=False, **common)  # fmt: skip
        total += part.float()
    if HAS_ENTROPY_GRAD:
        part = tile.clone()
        trl_kernel._backward_tile(part, stride, targets, log_z1, entropy, g_h, g_h, vocab_start, n_cols, inv_t=1.0,
                                  HAS_LOGPROB_GRAD=False, HAS_ENTROPY_GRAD=True, **common)  # fmt: skip
        total += part.float()
    tile.copy_(total)


class _Launcher:
    """Stands in for a Triton kernel: `kernel[grid](...)` runs a torch function of the same signature."""

    def __init__(self, function):
        self.function, self.launches = function, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.function


@pytest.mark.parametrize("temperature", [0.5, 0.7])
@pytest.mark.parametrize(("softcap", "scale"), [(None, 1.0), (30.0, 0.8)])
def test_triton_branch_with_the_kernels_mocked_equals_two_passes(monkeypatch, temperature, softcap, scale):
    """The Triton branch's bookkeeping (statistics, arguments, the gradient's assembly) with our two kernels replaced
    by what they claim to compute, written with TRL's own torch tile functions: one fold launch and one backward
    launch per tile. The kernels themselves run only on a CUDA device (the gpu-marked test below)."""
    from gtpo.forward import head_kernels

    forward, backward = _Launcher(_fused_fold_in_torch), _Launcher(_fused_backward_in_torch)
    monkeypatch.setattr(lm_head.trl_kernel, "_use_triton", lambda device: True)
    monkeypatch.setattr(head_kernels, "fold_two_temperatures_kernel", forward)
    monkeypatch.setattr(head_kernels, "two_temperature_backward_kernel", backward)

    # The reference must not take the Triton branch itself: run TRL's kernel with its own check restored.
    def two_pass(*args):
        with monkeypatch.context() as inner:
            inner.setattr(trl_kernel, "_use_triton", lambda device: False)
            return _two_pass(*args)

    hidden, weight, bias, targets = _inputs(seed=1)
    ours = lm_head.token_scores(
        hidden, weight, bias, targets, temperature, chunk_size=300, softcap=softcap, logit_scale=scale,
        differentiable_entropy=True,
    )  # fmt: skip
    log_probs, entropy, sampling_entropy = two_pass(hidden, weight, bias, targets, temperature, softcap, scale)
    assert forward.launches == 4  # 4 vocabulary tiles of 300 (1000 columns), each read once for both temperatures
    torch.testing.assert_close(ours.log_probs, log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy, entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.sampling_entropy, sampling_entropy, atol=1e-5, rtol=1e-5)
    weights = torch.linspace(-1, 1, len(targets))
    ours_grads = torch.autograd.grad((ours.log_probs * weights).sum() + ours.entropy.sum(), (hidden, weight, bias))
    with monkeypatch.context() as inner:
        inner.setattr(trl_kernel, "_use_triton", lambda device: False)
        reference = torch.autograd.grad((log_probs * weights).sum() + entropy.sum(), (hidden, weight, bias))
    assert backward.launches == 4  # each tile's gradient, both terms, in one launch
    for got, expected in zip(ours_grads, reference, strict=True):
        assert ((got - expected).norm() / expected.norm()).item() < 1e-5


def test_entropy_carries_no_gradient_unless_asked():
    hidden, weight, bias, targets = _inputs()
    scores = lm_head.token_scores(hidden, weight, bias, targets, 0.7, chunk_size=300)
    assert scores.log_probs.requires_grad and not scores.entropy.requires_grad


def test_untempered_kernel_makes_one_projection_per_tile(monkeypatch):
    """The temperature-1 entropy no longer costs a second pass: inside `untempered_entropy`, one fused call
    projects each (token chunk, vocabulary chunk) tile once (TRL's kernel is not called at all at T != 1)."""
    import trl.trainer.utils as trl_utils

    from gtpo.forward import untempered

    products = []
    real_mm = torch.mm

    def counting_mm(a, b, *args, **kwargs):
        products.append(a.shape[0] * b.shape[1])
        return real_mm(a, b, *args, **kwargs)

    hidden, weight, bias, targets = _inputs()
    with untempered.untempered_entropy(True):
        kernel = getattr(trl_utils, untempered.KERNEL_NAME)
        monkeypatch.setattr(lm_head.torch, "mm", counting_mm)
        out = kernel.apply(hidden.detach(), weight.detach(), None, targets, 0.7, 300, None, 1.0, OUTPUTS)
        monkeypatch.setattr(lm_head.torch, "mm", real_mm)
    assert sum(products) == len(targets) * weight.shape[0]  # every logit computed exactly once
    reference = _two_pass(hidden.detach(), weight.detach(), None, targets, 0.7, None, 1.0)
    torch.testing.assert_close(out[1], reference[1], atol=1e-5, rtol=1e-5)  # the temperature-1 entropy
    torch.testing.assert_close(out[0], reference[0], atol=1e-5, rtol=1e-5)  # the tempered log-probs


def _float64_reference(hidden, weight, bias, targets, temperature, softcap, scale):
    """Brute force in float64 on the CPU: the whole (N, V) logit matrix, log-softmax at T and at 1; returns
    (log p_T(target), H₁, H_T)."""
    logits = hidden.detach().double().cpu() @ weight.detach().double().cpu().t() + bias.detach().double().cpu()
    logits = logits * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    log_p_t = torch.log_softmax(logits / temperature, dim=-1)
    log_p_1 = torch.log_softmax(logits, dim=-1)
    entropy = -(log_p_1.exp() * log_p_1).sum(-1)
    sampling_entropy = -(log_p_t.exp() * log_p_t).sum(-1)
    return log_p_t.gather(1, targets.cpu().unsqueeze(1)).squeeze(1), entropy, sampling_entropy


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("temperature", [0.5, 0.7])
@pytest.mark.parametrize(("softcap", "scale"), [(None, 1.0), (30.0, 0.8)])
def test_triton_branch_on_cuda_equals_two_passes_and_float64(temperature, softcap, scale):
    """The Triton branch with its real kernels (the CPU tests mock them): one pass equals TRL's Triton kernel run
    twice within 1e-5 (forward) and 1e-5 relative (gradients), and both equal a float64 brute force within 1e-4."""
    device = torch.device("cuda")
    assert trl_kernel._use_triton(device), "CUDA without Triton: this test is for the Triton branch"
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's float32 default; the float64 tolerance assumes it
    hidden, weight, bias, targets = (
        x.detach().to(device).requires_grad_(x.requires_grad) for x in _inputs(seed=2, tokens=600, vocab=70000)
    )  # 600 tokens: more than one token tile of TRL's; 70,000 columns: tiles of 32,768 and a ragged last one
    ours = lm_head.token_scores(
        hidden, weight, bias, targets, temperature, softcap=softcap, logit_scale=scale, differentiable_entropy=True
    )
    # The same tiles on both sides (TRL's 32,768 columns): a different tiling folds in another order, which moves
    # float32 sums by ~1e-5 (seen: 3.6e-5 on the sampling entropy at T = 0.5 with tiles of 300 against 32,768).
    log_probs, entropy, sampling_entropy = _two_pass(
        hidden, weight, bias, targets, temperature, softcap, scale, chunk_size=lm_head.VOCAB_CHUNK
    )
    assert ours.log_probs.is_cuda and torch.isfinite(ours.log_probs).all() and torch.isfinite(ours.entropy).all()
    torch.testing.assert_close(ours.log_probs, log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy, entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.sampling_entropy, sampling_entropy, atol=1e-5, rtol=1e-5)
    exact = _float64_reference(hidden, weight, bias, targets, temperature, softcap, scale)
    for got, expected in zip((ours.log_probs, ours.entropy, ours.sampling_entropy), exact, strict=True):
        torch.testing.assert_close(got.double().cpu(), expected, atol=1e-4, rtol=1e-4)
    weights = torch.linspace(-1, 1, len(targets), device=device)
    ours_grads = torch.autograd.grad((ours.log_probs * weights).sum() + ours.entropy.sum(), (hidden, weight, bias))
    reference = torch.autograd.grad((log_probs * weights).sum() + entropy.sum(), (hidden, weight, bias))
    for got, expected in zip(ours_grads, reference, strict=True):
        assert torch.isfinite(got).all()
        assert ((got - expected).norm() / expected.norm()).item() < 1e-5
    assert (entropy - sampling_entropy).abs().max() > 1e-2  # the control, as on the CPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_branch_on_cuda_in_bfloat16_equals_two_passes():
    """In bfloat16 (how training runs on a GPU) the fused kernels fold the same bf16 tile as TRL's kernel does at each
    temperature, so the forward agrees within 1e-5; the backward sums both gradient terms in float32 and rounds the
    tile once where TRL's two passes round each term to bf16 before adding, so gradients agree within 1e-2 relative
    (bf16 has 8 bits of mantissa: 4e-3 per element)."""
    device = torch.device("cuda")
    hidden, weight, bias, targets = (
        x.detach().to(device, torch.bfloat16 if x.is_floating_point() else x.dtype).requires_grad_(x.requires_grad)
        for x in _inputs(seed=5, tokens=300, vocab=40000)
    )
    ours = lm_head.token_scores(hidden, weight, bias, targets, 0.7, differentiable_entropy=True)
    log_probs, entropy, sampling_entropy = _two_pass(
        hidden, weight, bias, targets, 0.7, None, 1.0, chunk_size=lm_head.VOCAB_CHUNK
    )
    torch.testing.assert_close(ours.log_probs, log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy, entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.sampling_entropy, sampling_entropy, atol=1e-5, rtol=1e-5)
    weights = torch.linspace(-1, 1, len(targets), device=device)
    ours_grads = torch.autograd.grad((ours.log_probs * weights).sum() + ours.entropy.sum(), (hidden, weight, bias))
    reference = torch.autograd.grad((log_probs * weights).sum() + entropy.sum(), (hidden, weight, bias))
    for got, expected in zip(ours_grads, reference, strict=True):
        assert torch.isfinite(got).all() and got.dtype == torch.bfloat16
        assert ((got.float() - expected.float()).norm() / expected.float().norm()).item() < 1e-2
