"""Advantages that are zero up to float rounding (gtpo.core.advantage_signs): no part in conflict detection,
no effect on λ, δ (negative_only) or the metrics' "A≠0"; checked against exact integer arithmetic on the
rewards, the plain-loop spans of test_core.py and a Python restatement of the tolerance."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from gtpo.core import (
    ZERO_ADVANTAGE_RTOL,
    advantage_signs,
    conflict_spans,
    conflict_weights,
    entropy_keep_mask,
    group_advantages,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_core import reference_spans  # noqa: E402

from loss_helpers import keyword_loss  # noqa: E402

# Partial-credit rewards on a 0.1 grid, G = 8: rows 1 and 5 equal the group mean 0.4, yet float32
# (R − mean)/(std + 1e-4) gives them A ≈ −1.07e-7 instead of 0 (found by search, asserted below).
NOISY_REWARDS = [0.0, 0.4, 0.2, 0.2, 0.9, 0.4, 0.5, 0.6]


def grid_groups(seed: int, n_groups: int, group_size: int = 8):
    """Random 0.1-grid rewards, their float32 advantages, and the exact-zero version of the same advantages.

    Exactness comes from integer arithmetic on the tenths: R_i = mean_g R iff 10·R_i·G = Σ_g 10·R_j.
    """
    rng = random.Random(seed)
    tenths = [rng.randrange(11) for _ in range(n_groups * group_size)]
    rewards = torch.tensor([t / 10 for t in tenths])
    noisy = group_advantages(rewards, group_size)  # (N,)
    exact = noisy.clone()
    for g in range(n_groups):
        chunk = tenths[g * group_size : (g + 1) * group_size]
        for j, t in enumerate(chunk):
            if t * group_size == sum(chunk):
                exact[g * group_size + j] = 0.0
    return noisy, exact


def random_ids(seed: int, n: int, max_len: int = 6, vocab: int = 2):
    rng = random.Random(seed)
    ids = torch.zeros(n, max_len, dtype=torch.long)
    mask = torch.zeros(n, max_len, dtype=torch.bool)
    for i in range(n):
        length = rng.randint(1, max_len)
        ids[i, :length] = torch.tensor([rng.randrange(vocab) for _ in range(length)])
        mask[i, :length] = True
    return ids, mask


def test_spans_on_noisy_zero_advantages_equal_spans_on_exact_zeros():
    noisy, exact = grid_groups(seed=0, n_groups=300)
    rounding = (exact == 0) & (noisy != 0)
    assert rounding.sum() >= 10 and noisy[rounding].abs().max() < 1e-6  # the batch has noisy zeros
    ids, mask = random_ids(seed=1, n=noisy.shape[0])
    fw, bw = conflict_spans(ids, mask, noisy, 8)
    ref_fw, ref_bw = reference_spans(ids.tolist(), mask.tolist(), exact.tolist(), 8)
    assert fw.tolist() == ref_fw and bw.tolist() == ref_bw
    exact_fw, exact_bw = conflict_spans(ids, mask, exact, 8)
    assert torch.equal(fw, exact_fw) and torch.equal(bw, exact_bw)
    # The control: taking the noisy signs literally (the plain loop on the noisy values) changes spans.
    naive_fw, naive_bw = reference_spans(ids.tolist(), mask.tolist(), noisy.tolist(), 8)
    assert naive_fw != ref_fw or naive_bw != ref_bw


def noisy_group():
    adv = group_advantages(torch.tensor(NOISY_REWARDS), 8)
    assert adv[1] != 0 and adv[5] != 0 and adv[1].abs() < 1e-6  # rounding, not a genuine advantage
    # Row 4 (A>0) shares its first token with row 1 (reward = mean); nothing else conflicts.
    ids = torch.tensor([[8, 8], [5, 7], [8, 8], [8, 8], [5, 6], [8, 8], [3, 3], [3, 3]])
    return ids, torch.ones(8, 2, dtype=torch.bool), adv


def test_positive_row_lambda_is_unchanged_by_a_row_whose_reward_equals_the_mean():
    ids, mask, adv = noisy_group()
    fw, bw = conflict_spans(ids, mask, adv, 8)
    assert not fw.any() and not bw.any()
    lam = conflict_weights(fw, bw, adv, group_size=8)
    assert lam[4].tolist() == [1.0, 1.0]
    # Independent: the plain loop with row 1's exact advantage 0 finds no span; with its noisy sign it would
    # put row 4's shared first token in a positive span (λ = 2 there).
    exact = adv.clone()
    exact[[1, 5]] = 0.0
    assert reference_spans(ids.tolist(), mask.tolist(), exact.tolist(), 8)[0][4] == [False, False]
    assert reference_spans(ids.tolist(), mask.tolist(), adv.tolist(), 8)[0][4] == [True, False]


def test_noisy_zero_rows_do_not_count_as_rows_with_nonzero_advantage_in_metrics_or_negative_only():
    ids, mask, adv = noisy_group()
    fw, bw = conflict_spans(ids, mask, adv, 8)
    h = torch.full((8, 2), 2.0)  # every ⟨H⟩_i above ln 2
    keep = entropy_keep_mask(h.mean(-1), adv, mode="negative_only", group_size=8)
    # negative_only drops the high-entropy rows with A<0 (0, 2, 3) only; rows 1, 5 count as A = 0.
    assert keep.tolist() == [False, True, False, False, True, True, True, True]
    _, m = keyword_loss(
        torch.zeros(8, 2),
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        token_entropy=h,
        entropy_filter="negative_only",
        gamma=0.0,
        group_size=8,
    )
    # No spans, so the span length per A≠0 row is 0 over 6 rows; δ: 3 of 8 dropped.
    assert m["gtpo/forward_span_len"] == 0 and m["gtpo/filtered_frac"] == pytest.approx(3 / 8)
    fw[0, 0] = fw[4, 0] = True  # spans given by hand: 2 span tokens over the 6 A≠0 rows' 12 tokens
    _, m = keyword_loss(
        torch.zeros(8, 2),
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        token_entropy=h,
        entropy_filter="negative_only",
        gamma=0.0,
        group_size=8,
    )
    assert m["gtpo/conflict_token_frac"] == pytest.approx(2 / 12)
    assert m["gtpo/forward_span_len"] == pytest.approx(2 / 6)


def python_signs(values, group_size):
    """The documented rule, restated: 0 iff |A_i| ≤ 1e-6·max(1, max_g |A_j|), else the sign."""
    out = []
    for g0 in range(0, len(values), group_size):
        group = values[g0 : g0 + group_size]
        tol = 1e-6 * max([1.0] + [abs(v) for v in group])
        out += [0 if abs(v) <= tol else (1 if v > 0 else -1) for v in group]
    return out


def test_signs_follow_the_documented_tolerance_over_many_magnitudes():
    rng = random.Random(3)
    values = [rng.choice([-1, 1]) * 10 ** rng.uniform(-9, 3) for _ in range(4000)]
    values = [0.0 if rng.random() < 0.05 else v for v in values]
    got = advantage_signs(torch.tensor(values, dtype=torch.float64), 8)
    assert got.dtype == torch.int8 and got.tolist() == python_signs(values, 8)
    assert ZERO_ADVANTAGE_RTOL == 1e-6


def test_genuinely_small_advantages_keep_their_sign():
    # Above the group's tolerance (1e-6 here): a small but real advantage is not zeroed...
    adv = torch.tensor([3e-6, -3e-6, 2e-5, -2e-5, 1e-3, -1e-3, 0.0, 0.0])
    assert advantage_signs(adv, 8).tolist() == [1, -1, 1, -1, 1, -1, 0, 0]
    # ...and takes part in conflict detection as before (token 5 shared by a + and a − row).
    ids = torch.tensor([[5], [5]])
    fw, _ = conflict_spans(ids, torch.ones(2, 1, dtype=torch.bool), torch.tensor([3e-6, -3e-6]), 2)
    assert fw.all()
    # Unnormalized advantages scale the tolerance: 5e-4 in a group whose largest |A| is 1000 is rounding
    # level of R − mean at rewards ~1000 (float32 ulp there is 6e-5), 2e-3 is not.
    assert advantage_signs(torch.tensor([1000.0, -1000.0, 5e-4, 2e-3]), 4).tolist() == [1, -1, 0, 1]


@pytest.mark.parametrize("scale", ["group", "none"])
def test_a_group_with_rewards_0_and_1e_minus_3_keeps_every_sign(scale):
    # Rewards 0 and 1e-3 (a tiny but real difference): every A_i is ±(1e-3)/2 / (std + 1e-4) ≈ ±0.74 ("group")
    # or ±5e-4 ("none"), far above tol_g, so every row counts as A≠0 and a shared token conflicts.
    adv = group_advantages(torch.tensor([0.0, 1e-3, 0.0, 1e-3]), 4, scale=scale)
    assert advantage_signs(adv, 4).tolist() == [-1, 1, -1, 1]
    fw, _ = conflict_spans(torch.full((4, 1), 7), torch.ones(4, 1, dtype=torch.bool), adv, 4)
    assert fw.all()


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.tensor([1.0, 2.0, 3.0]), 2), "N=3 advantages is not a multiple of group_size=2"),
        ((torch.tensor([1.0, float("nan")]), 2), "advantages must be finite"),
        ((torch.tensor([1, 0]), 2), "advantages must be a floating tensor"),
        ((torch.tensor([1.0, 0.0]), 0), "group_size must be a positive int"),
    ],
)
def test_advantage_signs_rejects_bad_input_with_a_clear_message(args, message):
    with pytest.raises(ValueError, match=message):
        advantage_signs(*args)


# --------------------------------------------------------------------------------------------------
# gtpo/sign_flipped_frac
# --------------------------------------------------------------------------------------------------


def test_sign_flipped_frac_counts_kept_positive_rows_the_shift_makes_negative_over_kept_nonzero_rows():
    # γ = 0.1, δ keeps ⟨H⟩ ≤ 1.5. Row by row, A' = A − 0.1·⟨H⟩:
    #   0: A=0.05, ⟨H⟩=1.0 → −0.05 flipped      1: A=0.5, ⟨H⟩=1.0 → 0.4
    #   2: A=−1.0, ⟨H⟩=0.2 → −1.02               3: A=1e-8 (zero up to rounding), ⟨H⟩=0.3: not counted
    #   4: A=0.04, ⟨H⟩=0.5 → −0.01 flipped      5: A=0.02, ⟨H⟩=3.0 → filtered (δ=0): not counted
    # Kept rows with A≠0: 0, 1, 2, 4; flipped among them: 0, 4 → 2/4.
    adv = torch.tensor([0.05, 0.5, -1.0, 1e-8, 0.04, 0.02])
    h = torch.tensor([1.0, 1.0, 0.2, 0.3, 0.5, 3.0]).unsqueeze(-1).expand(6, 2)
    mask = torch.ones(6, 2, dtype=torch.bool)
    common = dict(token_entropy=h, entropy_filter="always", entropy_threshold=1.5, gamma=0.1)
    _, m = keyword_loss(torch.zeros(6, 2), mask, adv, **common)
    assert m["gtpo/sign_flipped_frac"].item() == pytest.approx(2 / 4)
    # Without the advantage shift nothing flips.
    for term in ("none", "differentiable"):
        _, m = keyword_loss(torch.zeros(6, 2), mask, adv, entropy_term=term, **common)
        assert m["gtpo/sign_flipped_frac"] == 0
