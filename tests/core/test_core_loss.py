"""GTPO loss, entropy parts, advantages and metrics (gtpo.core), checked against GRPO written
independently here, hand-derived values, brute-force gradients (Eq. 22) and torch's Categorical."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from gtpo.core import (
    LN2,
    conflict_spans,
    conflict_weights,
    entropy_keep_mask,
    group_advantages,
    mean_completion_entropy,
    shift_advantages,
    token_entropy,
)
from loss_helpers import keyword_loss  # noqa: E402

ENTROPY_OFF = dict(entropy_filter="never", gamma=0.0)


def grpo_loss(per_token_logps, mask, advantages):
    """GRPO, Eq. (1)-(2) with β=0 and one iteration: −(1/G) Σ_i (1/|o_i|) Σ_t r_{i,t} Â_i, r = π/π_old = 1."""
    ratio = torch.exp(per_token_logps - per_token_logps.detach())
    m = mask.float()
    per_completion = (ratio * advantages.unsqueeze(-1) * m).sum(-1) / m.sum(-1).clamp(min=1)
    return -per_completion.mean()


def conflict_batch(seed=0, n_groups=6, group_size=6, max_len=12, vocab=2):
    """Random right-padded groups with frequent conflicts (tiny vocabulary), with their spans."""
    rng = random.Random(seed)
    width = max_len + 2
    ids = torch.zeros(n_groups * group_size, width, dtype=torch.long)
    mask = torch.zeros(n_groups * group_size, width, dtype=torch.bool)
    for i in range(ids.shape[0]):
        length = rng.randint(1, max_len)
        ids[i, :length] = torch.tensor([rng.randrange(vocab) for _ in range(length)])
        mask[i, :length] = True
    adv = torch.tensor([rng.choice([-1.3, -0.4, 0.0, 0.6, 1.1]) for _ in range(ids.shape[0])])
    fw, bw = conflict_spans(ids, mask, adv, group_size)
    assert fw.any() and bw.any() and (fw & bw).any()  # the batch exercises every case
    return ids, mask, adv, fw, bw


def leaf_logps(mask, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (-torch.rand(mask.shape, generator=g) * 3).to(dtype).requires_grad_()


# --------------------------------------------------------------------------------------------------
# Gradients (Eqs. 5, 21, 22)
# --------------------------------------------------------------------------------------------------


def gradients(mask, adv, fw, bw, positive_weight=2.0, combine="union"):
    logps = leaf_logps(mask)
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        positive_weight=positive_weight,
        combine=combine,
        **ENTROPY_OFF,
    )
    loss.backward()
    ref = logps.detach().clone().requires_grad_()
    grpo_loss(ref, mask, adv).backward()
    return logps.grad, ref.grad


def test_negative_completion_span_tokens_get_exactly_zero_gradient():
    _, mask, adv, fw, bw = conflict_batch()
    grad, grpo = gradients(mask, adv, fw, bw)
    protected = (fw | bw) & (adv < 0).unsqueeze(-1)
    assert protected.sum() > 5
    assert (grad[protected] == 0).all()
    assert (grpo[protected] != 0).all()  # GRPO does push them down


@pytest.mark.parametrize("combine", ["union", "product"])
def test_positive_completion_span_tokens_get_exactly_positive_weight_times_grpo_gradient(combine):
    _, mask, adv, fw, bw = conflict_batch()
    grad, grpo = gradients(mask, adv, fw, bw, combine=combine)
    positive = (adv > 0).unsqueeze(-1)
    once = (fw ^ bw) & positive
    assert once.sum() > 5
    assert torch.equal(grad[once], 2.0 * grpo[once])
    both = fw & bw & positive
    assert both.sum() > 0
    assert torch.equal(grad[both], (2.0 if combine == "union" else 4.0) * grpo[both])


def test_positive_span_tokens_scale_with_any_positive_weight():
    _, mask, adv, fw, bw = conflict_batch(seed=1)
    grad, grpo = gradients(mask, adv, fw, bw, positive_weight=3.5)
    span = (fw | bw) & (adv > 0).unsqueeze(-1)
    torch.testing.assert_close(grad[span], 3.5 * grpo[span], rtol=1e-6, atol=0)


def test_tokens_outside_spans_and_padding_keep_the_grpo_gradient():
    _, mask, adv, fw, bw = conflict_batch(seed=2)
    grad, grpo = gradients(mask, adv, fw, bw)
    outside = ~(fw | bw)
    assert torch.equal(grad[outside], grpo[outside])
    assert (grad[~mask] == 0).all()


def tiny_policy(seed=0, n=8, t=7, vocab=5, dim=4):
    """A log-linear policy: logits = features @ W, so each token's g_{i,t} = ∇_W log π is cheap."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n, t, dim, generator=g)
    weight = torch.randn(dim, vocab, generator=g, dtype=torch.float64).float().requires_grad_()
    ids = torch.randint(0, vocab, (n, t), generator=g)

    def logps():
        return torch.log_softmax(features @ weight, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)

    return weight, ids, logps


def test_loss_and_gradient_equal_grpo_without_conflicts_and_entropy_terms():
    weight, ids, logps = tiny_policy()
    lengths = torch.tensor([7, 3, 0, 5, 7, 1, 2, 6])
    mask = torch.arange(7) < lengths.unsqueeze(-1)
    adv = torch.tensor([1.0, -0.5, 0.3, -0.8, 1.2, 0.0, -0.2, -1.0])
    expected = grpo_loss(logps(), mask, adv)
    (expected_grad,) = torch.autograd.grad(expected, weight)
    no_conflict = torch.zeros(8, 7, dtype=torch.bool)
    for spans in (dict(), dict(forward_span=no_conflict, backward_span=no_conflict)):
        for aggregation in ("sequence", "reference"):  # without conflicts both reduce to GRPO × N
            loss, _ = keyword_loss(logps(), mask, adv, gtpo_aggregation=aggregation, **spans, **ENTROPY_OFF)
            (grad,) = torch.autograd.grad(loss, weight)
            scale = 8 if aggregation == "reference" else 1
            torch.testing.assert_close(loss, expected * scale)
            torch.testing.assert_close(grad, expected_grad * scale)


def test_loss_accepts_masks_with_holes_and_averages_over_valid_tokens_only():
    mask = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])  # not right-padded: fine for the loss
    adv = torch.tensor([1.0, -2.0, 0.5])
    logps = torch.full((3, 4), math.nan).masked_fill(mask.bool(), -1.0).requires_grad_()  # nan where masked
    loss, _ = keyword_loss(logps, mask, adv, **ENTROPY_OFF)
    torch.testing.assert_close(loss, torch.tensor(-(1.0 + -2.0 + 0.0) / 3))
    loss.backward()
    expected = torch.tensor([[-1 / 3 / 3, 0, -1 / 3 / 3, -1 / 3 / 3], [0, 2 / 3, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(logps.grad, expected)


def test_parameter_gradient_is_eq22_computed_token_by_token():
    weight, ids, logps = tiny_policy(seed=3, n=6, t=6, vocab=3)
    lengths = torch.tensor([6, 4, 5, 6, 3, 6])
    mask = torch.arange(6) < lengths.unsqueeze(-1)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 1.0])
    fw, bw = conflict_spans(ids, mask, adv, 6)
    in_span = fw | bw
    assert in_span.any()
    loss, _ = keyword_loss(logps(), mask, adv, forward_span=fw, backward_span=bw, **ENTROPY_OFF)
    (grad,) = torch.autograd.grad(loss, weight)
    # Eq. (22): ∇J* = 1/G Σ_{G+} A_i/|o_i| (2 Σ_{c_i} g + Σ_{u_i} g) + 1/G Σ_{G-} A_i/|o_i| Σ_{u_i} g.
    expected = torch.zeros_like(weight)
    per_token = logps()
    for i in range(6):
        for t in range(int(lengths[i])):
            (g_it,) = torch.autograd.grad(per_token[i, t], weight, retain_graph=True)
            if adv[i] > 0:
                coeff = 2.0 if in_span[i, t] else 1.0
            elif adv[i] < 0:
                coeff = 0.0 if in_span[i, t] else 1.0
            else:
                coeff = 1.0
            expected += coeff * adv[i] / lengths[i] / 6 * g_it
    torch.testing.assert_close(grad, -expected)  # the loss is −J


def test_reference_aggregation_divides_each_completion_by_its_conflict_count_then_sums():
    # Rows: + [1,2,3], − [1,4,3], A=0 [1,2,3], − [6,6]: spans at the first and last tokens of rows 0, 1.
    ids = torch.tensor([[1, 2, 3], [1, 4, 3], [1, 2, 3], [6, 6, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -0.5, 0.0, -0.5])
    fw, bw = conflict_spans(ids, mask, adv, 4)
    logps = torch.zeros(4, 3, requires_grad=True)
    loss, _ = keyword_loss(
        logps, mask, adv, forward_span=fw, backward_span=bw, gtpo_aggregation="reference", **ENTROPY_OFF
    )
    # Row 0: −(2+1+2)/3 / 2 conflicts; row 1: −(−0.5)(0+1+0)/3 / 2; row 2: 0; row 3: −(−0.5)(2/2) / max(0,1).
    expected = -(5 / 3) / 2 + (0.5 / 3) / 2 + 0.0 + 0.5
    torch.testing.assert_close(loss, torch.tensor(expected))
    seq, _ = keyword_loss(logps, mask, adv, forward_span=fw, backward_span=bw, **ENTROPY_OFF)
    torch.testing.assert_close(seq, torch.tensor((-(5 / 3) + 0.5 / 3 + 0.0 + 0.5) / 4))


# --------------------------------------------------------------------------------------------------
# Ratio and PPO clipping
# --------------------------------------------------------------------------------------------------


def test_old_logps_equal_to_current_give_the_on_policy_loss_and_gradient():
    _, mask, adv, fw, bw = conflict_batch(seed=4)
    a = leaf_logps(mask)
    b = leaf_logps(mask)
    la, _ = keyword_loss(a, mask, adv, forward_span=fw, backward_span=bw, **ENTROPY_OFF)
    lb, _ = keyword_loss(
        b, mask, adv, forward_span=fw, backward_span=bw, old_per_token_logps=b.detach().clone(), **ENTROPY_OFF
    )
    la.backward()
    lb.backward()
    torch.testing.assert_close(la, lb)
    torch.testing.assert_close(a.grad, b.grad)


def test_ppo_clipping_zeroes_the_gradient_exactly_where_the_clipped_term_is_smaller():
    _, mask, adv, fw, bw = conflict_batch(seed=5)
    g = torch.Generator().manual_seed(0)
    old = leaf_logps(mask).detach()
    logps = (old + (torch.rand(old.shape, generator=g) - 0.5)).requires_grad_()  # ratios in [0.61, 1.65]
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        old_per_token_logps=old,
        epsilon_low=0.1,
        epsilon_high=0.3,
        **ENTROPY_OFF,
    )
    loss.backward()
    lam = conflict_weights(fw, bw, adv)
    ratio = torch.exp(logps.detach() - old)
    a = adv.unsqueeze(-1)
    # d/dlogp of −λ·min(rA, clip(r)A): −λAr where the unclipped term is the min, else 0 (PPO / TRL).
    unclipped = ((a > 0) & (ratio <= 1.3)) | ((a < 0) & (ratio >= 0.9))
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)
    expected = torch.where(unclipped & mask, -lam * a * ratio / lengths / mask.shape[0], 0.0)
    torch.testing.assert_close(logps.grad, expected)
    assert (~unclipped & mask & (a != 0) & (lam != 0)).sum() > 10  # clipping happened
    clipped_value = -torch.minimum(ratio * a, ratio.clamp(0.9, 1.3) * a) * lam
    torch.testing.assert_close(loss.detach(), ((clipped_value * mask).sum(-1) / lengths.squeeze(-1)).mean())


@pytest.mark.parametrize("per_sequence", [False, True])
def test_importance_weights_multiply_each_token_loss_after_clipping_as_trl_vllm_correction(per_sequence):
    # TRL's GRPO loss with vLLM: per_token_loss = −min(rA, clip(r)A) · w, then the same aggregation;
    # w is a detached (N, T) or (N, 1) correction. GTPO applies it on top of λ.
    _, mask, adv, fw, bw = conflict_batch(seed=7)
    g = torch.Generator().manual_seed(1)
    old = leaf_logps(mask).detach()
    logps = (old + (torch.rand(old.shape, generator=g) - 0.5) * 0.4).requires_grad_()
    shape = (mask.shape[0], 1) if per_sequence else mask.shape
    weights = torch.rand(shape, generator=g) * 2  # includes values near 0 (masked) and above 1
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        old_per_token_logps=old,
        importance_weights=weights,
        **ENTROPY_OFF,
    )
    lam = conflict_weights(fw, bw, adv)
    ratio = torch.exp(logps - old)
    a = adv.unsqueeze(-1)
    token = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a) * lam * weights
    lengths = mask.sum(-1).clamp(min=1)
    expected = ((token * mask).sum(-1) / lengths).mean()
    torch.testing.assert_close(loss, expected)
    grad, expected_grad = torch.autograd.grad(loss, logps)[0], torch.autograd.grad(expected, logps)[0]
    torch.testing.assert_close(grad, expected_grad)


def test_importance_weights_of_a_wrong_shape_are_rejected():
    _, mask, adv, fw, bw = conflict_batch(seed=7)
    with pytest.raises(ValueError, match="importance_weights must have shape"):
        keyword_loss(leaf_logps(mask), mask, adv, importance_weights=torch.ones(3), **ENTROPY_OFF)


# --------------------------------------------------------------------------------------------------
# Entropy: H, ⟨H⟩_i, δ_i, shift
# --------------------------------------------------------------------------------------------------


def test_token_entropy_equals_categorical_entropy():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0)) * 3
    expected = torch.distributions.Categorical(logits=logits.double()).entropy()
    got = token_entropy(logits)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(token_entropy(torch.zeros(2, 8)), torch.full((2,), math.log(8)))


def test_token_entropy_chunked_equals_unchunked():
    logits = torch.randn(4, 9, 13, generator=torch.Generator().manual_seed(1))
    full = token_entropy(logits)
    for rows in (1, 2, 7, 36, 1000):
        torch.testing.assert_close(token_entropy(logits, chunk_rows=rows), full, rtol=0, atol=0)


def test_token_entropy_of_bfloat16_logits_is_float32_math():
    logits = (torch.randn(6, 50, generator=torch.Generator().manual_seed(2)) * 4).bfloat16()
    got = token_entropy(logits)
    assert got.dtype == torch.float32
    expected = torch.distributions.Categorical(logits=logits.double()).entropy()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)


def test_token_entropy_ignores_minus_inf_logits_with_finite_gradient():
    logits = torch.tensor([[0.0, 0.0, -math.inf, -math.inf], [1.0, 2.0, 3.0, -math.inf]], requires_grad=True)
    h = token_entropy(logits)
    torch.testing.assert_close(h[0], torch.tensor(math.log(2)))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_mean_completion_entropy_averages_valid_tokens_and_is_zero_for_empty_rows():
    h = torch.tensor([[1.0, 2.0, math.nan], [4.0, math.nan, math.nan], [math.nan, math.nan, math.nan]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert mean_completion_entropy(h, mask).tolist() == [1.5, 4.0, 0.0]


@pytest.mark.parametrize(
    "mode, initial, expected",
    [
        # ⟨H⟩ = [0.2, ln2, 0.9, 0.9, 0.9], A = [1, -1, 1, -1, 0], threshold ln 2 (equality keeps).
        ("never", None, [True, True, True, True, True]),
        ("always", None, [True, True, False, False, False]),
        ("negative_only", None, [True, True, True, False, True]),  # only A<0 rows are filtered
        ("auto", 0.5, [True, True, False, False, False]),  # ⟨H⟩_ini < ln 2: filter (Eq. 6 rows 2-3)
        ("auto", LN2, [True, True, True, True, True]),  # ⟨H⟩_ini = ln 2: the filter condition is strict
        ("auto", 1.5, [True, True, True, True, True]),  # ⟨H⟩_ini > ln 2: keep all (Eq. 6 row 1)
        ("auto", torch.tensor(0.5), [True, True, False, False, False]),
    ],
)
def test_entropy_keep_mask_follows_eq6_and_its_variants(mode, initial, expected):
    mean_h = torch.tensor([0.2, LN2, 0.9, 0.9, 0.9])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0])
    assert entropy_keep_mask(mean_h, adv, mode=mode, initial_entropy=initial).tolist() == expected
    # gtpo_loss applies the same δ: kept rows get A − γ⟨H⟩ (A=0 included), filtered rows nothing.
    logps = torch.zeros(5, 1, requires_grad=True)
    loss, _ = keyword_loss(
        logps,
        torch.ones(5, 1),
        adv,
        token_entropy=mean_h.unsqueeze(-1),
        entropy_filter=mode,
        initial_entropy=initial,
        gamma=0.1,
    )
    loss.backward()
    keep = torch.tensor(expected)
    torch.testing.assert_close(logps.grad.squeeze(-1), torch.where(keep, -(adv - 0.1 * mean_h) / 5, 0.0))


def test_entropy_keep_mask_threshold_is_configurable():
    mean_h = torch.tensor([0.69, 0.71, 1.05, 1.06])
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert entropy_keep_mask(mean_h, adv, mode="always", threshold=0.7).tolist() == [True, False, False, False]
    assert entropy_keep_mask(mean_h, adv, mode="always", threshold=1.05).tolist() == [True, True, True, False]


def test_auto_filter_without_initial_entropy_says_how_to_provide_it():
    with pytest.raises(ValueError, match="initial_entropy"):
        entropy_keep_mask(torch.tensor([0.1]), torch.tensor([1.0]), mode="auto")
    _, mask, adv, fw, bw = conflict_batch()
    with pytest.raises(ValueError, match="initial_entropy=<float>"):
        keyword_loss(leaf_logps(mask), mask, adv, token_entropy=torch.ones(mask.shape))


def test_shift_advantages_subtracts_detached_entropy_on_kept_rows_and_zeroes_filtered():
    adv = torch.tensor([1.0, -1.0, 0.0, 2.0])
    mean_h = torch.tensor([0.5, 0.2, 0.3, 3.0], requires_grad=True)
    keep = torch.tensor([True, True, True, False])
    shifted = shift_advantages(adv, mean_h, keep, 0.1)
    torch.testing.assert_close(shifted, torch.tensor([0.95, -1.02, -0.03, 0.0]))
    assert not shifted.requires_grad


def reference_loss(logps, mask, a_used, lam):
    """−(1/N) Σ_i (1/|o_i|) Σ_t λ_{i,t} A'_i r_{i,t}, Eq. (7) with r = 1 carrying the gradient."""
    ratio = torch.exp(logps - logps.detach())
    m = mask.float()
    return -((ratio * a_used.unsqueeze(-1) * lam * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()


def entropy_batch(seed=6):
    ids, mask, adv, fw, bw = conflict_batch(seed=seed)
    g = torch.Generator().manual_seed(seed)
    h = torch.rand(mask.shape, generator=g) * 1.4  # ⟨H⟩_i spread around ln 2
    return mask, adv, fw, bw, h


def test_entropy_shift_loss_uses_original_signs_for_lambda_and_shifted_advantages_for_the_gradient():
    mask, adv, fw, bw, h = entropy_batch()
    logps = leaf_logps(mask)
    loss, metrics = keyword_loss(
        logps, mask, adv, forward_span=fw, backward_span=bw, token_entropy=h, entropy_filter="always", gamma=0.3
    )
    mean_h = (h * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    keep = mean_h <= LN2
    assert 0 < (~keep).sum() < keep.numel()
    a_used = torch.where(keep, adv - 0.3 * mean_h, 0.0)
    lam = conflict_weights(fw, bw, adv)  # original signs
    ref_logps = logps.detach().clone().requires_grad_()
    expected = reference_loss(ref_logps, mask, a_used, lam)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(logps.grad, ref_logps.grad)
    torch.testing.assert_close(metrics["gtpo/filtered_frac"], (~keep).float().mean())


def test_small_positive_advantage_flipped_by_the_shift_keeps_lambda_of_a_positive_completion():
    ids = torch.tensor([[5, 6], [5, 7]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([0.01, -0.01])
    fw, bw = conflict_spans(ids, mask, adv, 2)
    logps = torch.zeros(2, 2, requires_grad=True)
    h = torch.ones(2, 2)  # ⟨H⟩ = 1: A'_0 = 0.01 − 0.1 < 0
    loss, _ = keyword_loss(
        logps, mask, adv, forward_span=fw, backward_span=bw, token_entropy=h, entropy_filter="never", gamma=0.1
    )
    loss.backward()
    a0 = 0.01 - 0.1
    # Row 0 position 0 is in a span of a positive completion: λ = 2 even though A'_0 < 0.
    torch.testing.assert_close(logps.grad[0], torch.tensor([-2 * a0 / 2 / 2, -a0 / 2 / 2]))
    torch.testing.assert_close(logps.grad[1], torch.tensor([0.0, -(-0.01 - 0.1) / 2 / 2]))


def test_filtered_completions_get_zero_gradient():
    mask, adv, fw, bw, h = entropy_batch(seed=7)
    logps = leaf_logps(mask)
    loss, _ = keyword_loss(
        logps, mask, adv, forward_span=fw, backward_span=bw, token_entropy=h, entropy_filter="negative_only", gamma=0.1
    )
    loss.backward()
    mean_h = (h * mask).sum(-1) / mask.sum(-1)
    dropped = (mean_h > LN2) & (adv < 0)
    assert dropped.any()
    assert (logps.grad[dropped] == 0).all()
    assert (logps.grad[~dropped & (adv > 0)][mask[~dropped & (adv > 0)]] != 0).any()


def test_differentiable_entropy_term_adds_gamma_mean_entropy_with_gradient_and_no_shift():
    mask, adv, fw, bw, h = entropy_batch(seed=8)
    h = h.requires_grad_()
    logps = leaf_logps(mask)
    common = dict(forward_span=fw, backward_span=bw, entropy_filter="always")
    loss, _ = keyword_loss(logps, mask, adv, token_entropy=h, gamma=0.25, entropy_term="differentiable", **common)
    base_logps = logps.detach().clone().requires_grad_()
    base, _ = keyword_loss(base_logps, mask, adv, token_entropy=h.detach(), gamma=0.25, entropy_term="none", **common)
    mean_h = (h.detach() * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(loss, base + 0.25 * mean_h.mean())
    loss.backward()
    base.backward()
    torch.testing.assert_close(logps.grad, base_logps.grad)  # advantages are not shifted
    expected_h_grad = 0.25 * mask / mask.sum(-1, keepdim=True) / mask.shape[0]
    torch.testing.assert_close(h.grad, expected_h_grad)


def test_missing_token_entropy_is_only_accepted_with_entropy_parts_off():
    _, mask, adv, fw, bw = conflict_batch()
    logps = leaf_logps(mask)
    for kwargs in (
        dict(entropy_filter="always", gamma=0.0),
        dict(entropy_filter="never", gamma=0.1),
        dict(entropy_filter="auto", initial_entropy=0.1, gamma=0.0),
    ):
        with pytest.raises(ValueError, match="token_entropy is needed"):
            keyword_loss(logps, mask, adv, **kwargs)
    loss, metrics = keyword_loss(logps, mask, adv, entropy_filter="never", gamma=0.1, entropy_term="none")
    torch.testing.assert_close(loss, grpo_loss(logps, mask, adv))
    assert "gtpo/mean_entropy" not in metrics


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------


def test_metrics_on_a_hand_worked_group():
    # + [1,2,3], − [1,4,3], A=0 [1,2,3], − [6,6]: spans are the first and last tokens of rows 0, 1.
    ids = torch.tensor([[1, 2, 3], [1, 4, 3], [1, 2, 3], [6, 6, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0, 0.0, -1.0])
    fw, bw = conflict_spans(ids, mask, adv, 4)
    assert fw.tolist() == [[True, False, False], [True, False, False], [False] * 3, [False] * 3]
    assert bw.tolist() == [[False, False, True], [False, False, True], [False] * 3, [False] * 3]
    h = torch.tensor([[0.2, 0.2, 0.2], [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.9, 0.9, 7.0]])  # ⟨H⟩ .2 1 .5 .9
    logps = torch.zeros(4, 3, requires_grad=True)
    loss, m = keyword_loss(
        logps,
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        token_entropy=h,
        positive_weight=3.0,
        entropy_filter="always",
        gamma=0.0,
    )
    expected = {
        "gtpo/conflict_token_frac": 4 / 8,  # 4 span tokens / 8 valid tokens of rows with A≠0
        "gtpo/forward_span_len": 2 / 3,  # (1 + 1 + 0) / 3 rows with A≠0
        "gtpo/backward_span_len": 2 / 3,
        "gtpo/protected_negative_frac": 2 / 5,  # λ=0 tokens of A<0 rows / their 5 valid tokens
        "gtpo/filtered_frac": 2 / 4,  # rows 1 and 3 have ⟨H⟩ > ln 2
        "gtpo/mean_entropy": (0.2 + 1.0 + 0.5 + 0.9) / 4,
        "gtpo/mean_lambda": (3 + 1 + 3 + 0 + 1 + 0 + 3 + 2) / 11,
        "gtpo/sign_flipped_frac": 0.0,  # γ = 0: A' = δ·A never changes a sign
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(m[key], torch.tensor(value, dtype=torch.float32), msg=key)
        assert not m[key].requires_grad and m[key].dim() == 0
    torch.testing.assert_close(loss, torch.tensor(-(3 + 1 + 3) / 3 / 4))  # only row 0 is kept with A≠0


def test_metrics_without_spans_or_active_rows_are_zero_not_nan():
    mask = torch.tensor([[1, 1], [1, 0]])
    _, m = keyword_loss(torch.zeros(2, 2), mask, torch.zeros(2), **ENTROPY_OFF)
    assert m["gtpo/conflict_token_frac"] == 0 and m["gtpo/forward_span_len"] == 0
    assert m["gtpo/protected_negative_frac"] == 0 and m["gtpo/mean_lambda"] == 1


# --------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------


def test_group_advantages_match_mean_and_unbiased_std_per_group():
    rng = random.Random(0)
    rewards = [rng.choice([0.0, 1.0, 10.0, 11.0, 20.0]) for _ in range(24)]
    got = group_advantages(torch.tensor(rewards), 6)
    got_none = group_advantages(torch.tensor(rewards), 6, scale="none")
    for g in range(4):
        chunk = rewards[6 * g : 6 * g + 6]
        mu, sd = statistics.mean(chunk), statistics.stdev(chunk)
        for j, r in enumerate(chunk):
            assert got[6 * g + j].item() == pytest.approx((r - mu) / (sd + 1e-4), rel=1e-5, abs=1e-6)
            assert got_none[6 * g + j].item() == pytest.approx(r - mu, abs=1e-5)


def test_group_advantages_of_equal_rewards_are_zero():
    assert group_advantages(torch.full((8,), 3.0), 4).tolist() == [0.0] * 8


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((torch.ones(5), 2), {}, "not a multiple of group_size=2"),
        ((torch.ones(4), 1), {}, "group_size >= 2"),
        ((torch.ones(4), 2), dict(scale="batch"), "unknown advantage scale 'batch'; valid: group, none"),
        ((torch.tensor([1.0, math.nan]), 2), {}, "rewards must be finite"),
        ((torch.ones(4), 0), {}, "group_size must be a positive int"),
    ],
)
def test_group_advantages_reject_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(*args, **kwargs)


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------

M = torch.ones(2, 3, dtype=torch.bool)
S = torch.zeros(2, 3, dtype=torch.bool)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(entropy_filter="sometimes"),
            "unknown entropy_filter mode 'sometimes'; valid: always, auto, negative_only, never",
        ),
        (dict(entropy_term="bonus"), "unknown entropy_term 'bonus'; valid: advantage, differentiable, none"),
        (dict(combine="max"), "unknown combine mode 'max'"),
        (dict(advantages=torch.tensor([1.0, math.inf])), "advantages must be finite"),
        (dict(advantages=torch.ones(3)), "advantages has 3 entries"),
        (dict(completion_mask=torch.ones(2, 4)), "completion_mask has shape"),
        (dict(completion_mask=torch.tensor([[0, 1, 2], [1, 1, 1]])), "only 0/1"),
        (dict(token_entropy=torch.zeros(2, 3), entropy_filter="auto", initial_entropy=math.nan), "finite entropy"),
        (dict(forward_span=S), "pass both forward_span and backward_span"),
        (dict(forward_span=S, backward_span=S[:, :2]), "backward_span must have the shape"),
        (dict(forward_span=S.float(), backward_span=S.float()), "must be bool"),
        (dict(old_per_token_logps=torch.zeros(3, 3)), "old_per_token_logps must have the shape"),
        (dict(epsilon_low=-0.1), "must be >= 0"),
        (dict(gamma=math.nan), "gamma must be a finite number"),
        (dict(positive_weight=-2.0), "positive_weight must be finite and >= 0"),
        (dict(token_entropy=torch.zeros(2, 3), entropy_filter="auto", initial_entropy=[0.1, 0.2]), "scalar"),
        (dict(token_entropy=torch.zeros(2, 3), entropy_filter="auto", initial_entropy=torch.ones(2)), "scalar"),
    ],
)
def test_gtpo_loss_rejects_bad_input_with_a_clear_message(kwargs, message):
    args = dict(
        per_token_logps=torch.zeros(2, 3),
        completion_mask=M,
        advantages=torch.tensor([1.0, -1.0]),
        entropy_filter="never",
        gamma=0.0,
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        keyword_loss(**args)


# --------------------------------------------------------------------------------------------------
# Dtypes and devices
# --------------------------------------------------------------------------------------------------


def test_bfloat16_inputs_give_a_float32_loss_close_to_float32_and_bfloat16_gradients():
    mask, adv, fw, bw, h = entropy_batch(seed=9)
    logps16 = leaf_logps(mask, dtype=torch.bfloat16)
    kwargs = dict(forward_span=fw, backward_span=bw, entropy_filter="always", gamma=0.1)
    loss16, m16 = keyword_loss(logps16, mask.int(), adv.bfloat16(), token_entropy=h.bfloat16(), **kwargs)
    logps32 = logps16.detach().float().requires_grad_()
    loss32, _ = keyword_loss(logps32, mask, adv.bfloat16().float(), token_entropy=h.bfloat16().float(), **kwargs)
    assert loss16.dtype == torch.float32 and all(v.dtype == torch.float32 for v in m16.values())
    torch.testing.assert_close(loss16, loss32)
    loss16.backward()
    loss32.backward()
    assert logps16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logps16.grad.float(), logps32.grad.bfloat16().float())


def test_core_never_copies_tensors_to_the_host(monkeypatch):
    mask, adv, fw, bw, h = entropy_batch(seed=10)
    ids = torch.randint(0, 2, mask.shape)

    def forbidden(*args, **kwargs):
        raise AssertionError("device→host copy")

    for name in ("item", "tolist", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    logits = torch.randn(*mask.shape, 7, requires_grad=True)
    ent = token_entropy(logits)
    fw, bw = conflict_spans(ids, mask, adv, 6)
    conflict_weights(fw, bw, adv, combine="product")
    mean_h = mean_completion_entropy(ent, mask)
    keep = entropy_keep_mask(mean_h, adv, mode="auto", initial_entropy=torch.tensor(0.3))
    shift_advantages(adv, mean_h, keep, 0.1)
    group_advantages(torch.rand(12), 6)
    logps = leaf_logps(mask)
    for term in ("advantage", "differentiable"):
        loss, metrics = keyword_loss(
            logps,
            mask,
            adv,
            forward_span=fw,
            backward_span=bw,
            token_entropy=ent,
            old_per_token_logps=logps.detach() * 0.9,
            entropy_filter="auto",
            initial_entropy=0.5,
            entropy_term=term,
            gtpo_aggregation="reference",
        )
        loss.backward()
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        token_entropy=ent.detach(),
        entropy_filter="never",
        gtpo_aggregation="dapo",
        token_normalizer=mask.sum() / 2,
        group_size=6,
    )  # a tensor normalizer stays on device
    loss.backward()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loss_on_cuda_in_bfloat16_equals_cpu():
    mask, adv, fw, bw, h = entropy_batch(seed=11)
    kwargs = dict(entropy_filter="always", gamma=0.1)
    logps = leaf_logps(mask)
    loss, metrics = keyword_loss(logps, mask, adv, forward_span=fw, backward_span=bw, token_entropy=h, **kwargs)
    logps_c = logps.detach().cuda().requires_grad_()
    loss_c, metrics_c = keyword_loss(
        logps_c,
        mask.cuda(),
        adv.cuda(),
        forward_span=fw.cuda(),
        backward_span=bw.cuda(),
        token_entropy=h.cuda(),
        **kwargs,
    )
    assert loss_c.is_cuda and all(v.is_cuda for v in metrics_c.values())
    torch.testing.assert_close(loss_c.cpu(), loss)
    loss.backward()
    loss_c.backward()
    torch.testing.assert_close(logps_c.grad.cpu(), logps.grad)
    logits = torch.randn(4, 9, 1000, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(token_entropy(logits).cpu(), token_entropy(logits.cpu()), rtol=1e-4, atol=1e-4)


def test_gtpo_loss_has_one_form_and_refuses_the_old_ones_in_one_line():
    """`gtpo_loss(LossInputs, LossSettings)` is the loss's one entry point (issue 40): the keyword form and
    `policy_loss` are gone, and calling the old way says how to call it. The dataclasses share no field, so the tests'
    `keyword_loss` shorthand cannot route a keyword to the wrong one."""
    from dataclasses import fields

    import gtpo.core
    from gtpo.core import LossInputs, LossSettings, gtpo_loss

    inputs, settings = {f.name for f in fields(LossInputs)}, {f.name for f in fields(LossSettings)}
    assert inputs.isdisjoint(settings)
    assert not hasattr(gtpo.core, "policy_loss")
    logps, adv = torch.zeros(2, 3), torch.tensor([1.0, -1.0])
    with pytest.raises(TypeError, match=r"gtpo_loss takes \(LossInputs, LossSettings\), built by keyword"):
        gtpo_loss(logps, M)
    for old_call in (lambda: gtpo_loss(logps, M, adv), lambda: gtpo_loss(LossInputs(logps, M, adv), gamma=0.0)):
        with pytest.raises(TypeError):
            old_call()
    loss, _ = gtpo_loss(LossInputs(logps, M, adv), LossSettings(entropy_filter="never", gamma=0.0))
    assert loss.item() == 0.0


def test_weights_of_one_inside_the_spans_make_the_correction_a_no_op():
    """λ = 1 for both signs inside the spans (positive_weight = negative_weight = 1) is no correction at all: the loss
    and its gradient equal those without spans, and so does the ablation with only the forward or backward side."""
    torch.manual_seed(0)
    mask = torch.ones(4, 5, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    fw = torch.zeros(4, 5, dtype=torch.bool)
    fw[:, :2] = True
    bw = torch.zeros(4, 5, dtype=torch.bool)
    bw[:, -1] = True
    base = torch.randn(4, 5)
    plain_logps = base.clone().requires_grad_()
    plain, _ = keyword_loss(plain_logps, mask, adv, entropy_filter="never", gamma=0.0)
    plain.backward()
    for sides in ("both", "forward", "backward"):
        logps = base.clone().requires_grad_()
        loss, _ = keyword_loss(
            logps, mask, adv, forward_span=fw, backward_span=bw, positive_weight=1.0, negative_weight=1.0,
            span_sides=sides, entropy_filter="never", gamma=0.0,
        )  # fmt: skip
        loss.backward()
        assert loss.item() == pytest.approx(plain.item(), abs=1e-7)
        torch.testing.assert_close(logps.grad, plain_logps.grad)
    with_correction, _ = keyword_loss(
        base.clone(), mask, adv, forward_span=fw, backward_span=bw, entropy_filter="never", gamma=0.0
    )
    assert abs(with_correction.item() - plain.item()) > 1e-3  # the control: the paper's λ does change it
