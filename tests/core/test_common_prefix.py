"""`conflict_exclude_common_prefix`: `gtpo.core.common_prefix_conflicts` and the λ it gives.

Invariants: a token is in the common prefix exactly when its row's whole prefix through it is held, token for token, by
a row with A > 0 and a row with A < 0 of its group, the row itself counting for its own sign (checked against a
brute-force scan of that definition on random groups, which also shows the tokens shared by position only that stay
outside); the common prefix is a leading run inside the forward span; with it λ is 1 there and Eq. 5's everywhere
else, so the loss equals the loss with λ = 1 on those tokens computed by hand.
"""

from __future__ import annotations

import random

import pytest
import torch

from gtpo import core
from gtpo.core import LossInputs, LossSettings, gtpo_loss
from gtpo.core.advantages import ZERO_ADVANTAGE_RTOL


def _pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    t = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (t - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in rows], dtype=torch.bool)
    return ids, mask


def _random_groups(rng: random.Random, groups: int, g: int):
    """Rows of 1-7 tokens from a 3-token vocabulary (so tokens are often shared), advantages of both signs and 0;
    returns (rows, advantages, ids, mask, A, forward, backward)."""
    rows = [[rng.randrange(3) for _ in range(rng.randint(1, 7))] for _ in range(groups * g)]
    adv = [rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0]) for _ in rows]
    ids, mask = _pad(rows)
    a = torch.tensor(adv)
    return (rows, adv, ids, mask, a, *core.conflict_spans(ids, mask, a, g))


def _brute_force_common_prefix(rows, adv, g, forward) -> list[set[int]]:
    """The definition, one position at a time: p is marked when a positive and a negative row hold rows[i][:p+1]."""
    out = []
    for i, row in enumerate(rows):
        group = range(i // g * g, i // g * g + g)
        scale = max(1.0, max(abs(adv[j]) for j in group))
        sign = {j: 0 if abs(adv[j]) <= ZERO_ADVANTAGE_RTOL * scale else (1 if adv[j] > 0 else -1) for j in group}
        marked = set()
        for p in range(int(forward[i].sum())):
            holders = [j for j in group if rows[j][: p + 1] == row[: p + 1]]
            if any(sign[j] > 0 for j in holders) and any(sign[j] < 0 for j in holders):
                marked.add(p)
        out.append(marked)
    return out


@pytest.mark.parametrize("g", [2, 4, 8])
def test_common_prefix_matches_the_definition_on_random_groups(g):
    rng = random.Random(g)
    n_common = n_position_only = 0
    for _ in range(40):
        rows, adv, ids, mask, a, fw, _ = _random_groups(rng, 3, g)
        common = core.common_prefix_conflicts(ids, mask, a, g, fw)
        expected = _brute_force_common_prefix(rows, adv, g, fw)
        for i in range(len(rows)):
            assert set(common[i].nonzero().flatten().tolist()) == expected[i], (rows, adv, i)
            n = len(expected[i])
            assert common[i, :n].all() and not common[i, n:].any()  # a leading run ...
            assert not (common[i] & ~fw[i]).any()  # ... inside the forward span
            n_position_only += int(fw[i].sum()) - n
        n_common += int(common.sum())
    assert n_common > 0
    # With G = 2 a forward span is a run of positions where the one positive and the one negative agree: their common
    # prefix, so nothing is shared by position only. From G = 4 on, both kinds of span token occur (the control).
    assert n_position_only == 0 if g == 2 else n_position_only > 0


def test_common_prefix_ignores_padding_and_rows_with_zero_advantage():
    # Rows 0 (A>0) and 1 (A<0) hold "5 7"; row 1's padding (0) matches row 0's third token 0, and must not count.
    ids = torch.tensor([[5, 7, 0], [5, 7, 0], [5, 7, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    a = torch.tensor([1.0, -1.0, 0.0])
    fw, _ = core.conflict_spans(ids, mask, a, 3)
    common = core.common_prefix_conflicts(ids, mask, a, 3, fw)
    assert common.int().tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 0]]


def test_loss_with_the_common_prefix_is_eq5_with_lambda_one_there():
    # Two groups of 3: rows 0/1 share "5 7" exactly (common prefix); row 0's 9 at position 2 is shared with row 2
    # by position only. The variant's loss equals Eq. 5's loss with λ set to 1 on the common prefix by hand.
    ids = torch.tensor([[5, 7, 9], [5, 7, 8], [6, 7, 9], [4, 4, 4], [4, 3, 4], [2, 2, 4]])
    mask = torch.ones(6, 3, dtype=torch.bool)
    a = torch.tensor([1.0, -0.5, -0.5, 0.8, -0.4, -0.4])
    fw, bw = core.conflict_spans(ids, mask, a, 3)
    common = core.common_prefix_conflicts(ids, mask, a, 3, fw)
    assert common[0].tolist() == [True, True, False] and fw[0, 2]  # the position-only token keeps Eq. 5
    logps = torch.randn(6, 3, generator=torch.Generator().manual_seed(0)).requires_grad_()
    settings = LossSettings(group_size=3, entropy_filter="never", gamma=0.0)
    loss, _ = gtpo_loss(LossInputs(logps, mask, a, fw, bw, common_prefix_span=common), settings)
    (grad,) = torch.autograd.grad(loss, logps)
    lam = core.conflict_weights(fw, bw, a, group_size=3)  # Eq. 5
    lam = torch.where(common, 1.0, lam)  # by hand
    # Eq. 7 with loss_type grpo: -(1/N) Σ_i (1/|o_i|) Σ_t λ·A_i·r, r = exp(logp - sg(logp)) = 1, dr/dlogp = 1.
    torch.testing.assert_close(grad, -lam * a.unsqueeze(-1) / 3 / 6)
    assert torch.equal(core.conflict_weights(fw, bw, a, group_size=3, common_prefix=common), lam)
    assert not torch.equal(lam, core.conflict_weights(fw, bw, a, group_size=3))  # the control: it changes λ


def test_common_prefix_span_is_checked():
    mask = torch.ones(2, 2, dtype=torch.bool)
    a = torch.tensor([1.0, -1.0])
    with pytest.raises(ValueError, match="common_prefix_span needs forward_span"):
        gtpo_loss(LossInputs(torch.zeros(2, 2), mask, a, common_prefix_span=mask))
    with pytest.raises(ValueError, match="common_prefix_span must be a bool"):
        gtpo_loss(LossInputs(torch.zeros(2, 2), mask, a, mask, mask, common_prefix_span=mask.float()))


def _brute_force_push_against_group(rows, adv, g, forward, backward, lam) -> float:
    """`push_against_group` from its definition, one span token at a time (U, S and n summed over the sharers)."""
    pushed = against = 0.0
    for i, row in enumerate(rows):
        group = range(i // g * g, i // g * g + g)
        scale = max(1.0, max(abs(adv[j]) for j in group))
        a = {j: 0.0 if abs(adv[j]) <= ZERO_ADVANTAGE_RTOL * scale else adv[j] for j in group}
        tol = g * ZERO_ADVANTAGE_RTOL * scale
        aligned = [(p, lambda j, p=p: p) for p in range(int(forward[i].sum()))]  # position p in every row
        aligned += [(len(row) - 1 - r, lambda j, r=r: len(rows[j]) - 1 - r) for r in range(int(backward[i].sum()))]
        for p, at in aligned:
            sharers = [j for j in group if 0 <= at(j) < len(rows[j]) and rows[j][at(j)] == row[p]]
            u = sum(float(lam[j, at(j)]) * a[j] for j in sharers)
            s = sum(a[j] for j in sharers)
            if u > tol:
                pushed += u / len(sharers)
                against += u / len(sharers) if s < -tol else 0.0
    return against / pushed if pushed > 0 else 0.0


@pytest.mark.parametrize("g", [2, 4, 8])
def test_push_against_group_matches_its_definition_on_random_groups(g):
    rng = random.Random(100 + g)
    seen_against = seen_zero = 0
    for _ in range(30):
        rows, adv, ids, mask, a, fw, bw = _random_groups(rng, 2, g)
        for lam in (core.conflict_weights(fw, bw, a, group_size=g), torch.ones(ids.shape)):
            value = float(core.push_against_group(ids, mask, a, g, fw, bw, lam))
            assert value == pytest.approx(_brute_force_push_against_group(rows, adv, g, fw, bw, lam), abs=1e-6)
            seen_against += value > 0
            seen_zero += value == 0
    assert seen_against > 0 and seen_zero > 0  # the control: both outcomes occur
