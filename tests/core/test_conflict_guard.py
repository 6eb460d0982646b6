"""The stall guard (`conflict_guard`, issue 38): `gtpo.core.contested_tokens` and the λ it gives.

Invariants: a span token is contested exactly when the advantages of the group's completions holding the same token at
the same aligned position sum to < 0 (checked against a brute-force scan of the definition on random groups); under
the guard λ is 0 on contested tokens of either sign and 1 everywhere else; on a group with no contested token the
guard is the loss without the correction, and on a group with no conflict at all it is Eq. 5's loss, bit for bit.
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


def _brute_force_contested(rows, adv, g, forward, backward) -> list[set[int]]:
    """The definition, one position at a time: S = Σ_j A_j over group rows j with the same aligned token."""
    out = []
    for i, row in enumerate(rows):
        group = range(i // g * g, i // g * g + g)
        scale = max(1.0, max(abs(adv[j]) for j in group))
        signed = [0.0 if abs(adv[j]) <= ZERO_ADVANTAGE_RTOL * scale else adv[j] for j in group]
        tol = g * ZERO_ADVANTAGE_RTOL * scale
        marked = set()
        for p in range(int(forward[i].sum())):
            s = sum(a for j, a in zip(group, signed, strict=True) if p < len(rows[j]) and rows[j][p] == row[p])
            if s < -tol:
                marked.add(p)
        for r in range(int(backward[i].sum())):
            tok = row[len(row) - 1 - r]
            s = sum(
                a
                for j, a in zip(group, signed, strict=True)
                if r < len(rows[j]) and rows[j][len(rows[j]) - 1 - r] == tok
            )
            if s < -tol:
                marked.add(len(row) - 1 - r)
        out.append(marked)
    return out


@pytest.mark.parametrize("g", [2, 4, 8])
def test_contested_tokens_match_the_definition_on_random_groups(g):
    rng = random.Random(g)
    n_contested = 0
    for trial in range(40):
        groups = 3
        rows = [[rng.randrange(3) for _ in range(rng.randint(1, 7))] for _ in range(groups * g)]
        rewards = torch.tensor([float(rng.randrange(3)) for _ in rows])
        adv = core.group_advantages(rewards, g) if trial % 2 else torch.randn(len(rows))  # Eq. 8, or any reals
        ids, mask = _pad(rows)
        fw, bw = core.conflict_spans(ids, mask, adv, g)
        got = core.contested_tokens(ids, mask, adv, g, fw, bw)
        want = _brute_force_contested(rows, adv.tolist(), g, fw, bw)
        assert [set(got[i].nonzero().flatten().tolist()) for i in range(len(rows))] == want
        assert not (got & ~(fw | bw)).any()  # only span tokens
        n_contested += int(got.sum())
    assert n_contested > 0  # the control: random groups do contest some tokens


def test_the_stall_pattern_gets_no_push_instead_of_a_doubled_one():
    """E's stalled groups, in tokens (docs/studies/mechanism.md): positives 0-1 open with the format tag (7), positive
    2 opens with the restated question (5 5 6) that negatives 3-6 also open with; rewards 1,1,1,0,0,0,0,0."""
    rows = [[7, 1, 9], [7, 2, 9], [5, 5, 6, 3], [5, 5, 6, 4], [5, 5, 6, 8], [5, 5, 6, 4, 4], [5, 5, 6, 1], [2, 8]]
    adv = core.group_advantages(torch.tensor([1.0, 1, 1, 0, 0, 0, 0, 0]), 8)
    a_pos, a_neg = adv[0].item(), adv[3].item()  # 5/8 and -3/8 of the reward, over the same std
    assert a_pos + 4 * a_neg < 0  # by hand: S on the shared opening is one positive against four negatives
    ids, mask = _pad(rows)
    fw, bw = core.conflict_spans(ids, mask, adv, 8)
    assert fw.sum(-1).tolist() == [0, 0, 3, 3, 3, 3, 3, 0]  # the restated question is the forward span
    contested = core.contested_tokens(ids, mask, adv, 8, fw, bw)
    paper = core.conflict_weights(fw, bw, adv, group_size=8)
    guard = core.conflict_weights(fw, bw, adv, group_size=8, contested=contested)
    assert paper[2, :3].tolist() == [2.0] * 3 and paper[3, :3].tolist() == [0.0] * 3
    assert guard[2:7, :3].eq(0).all() and guard[:2].eq(1).all()  # no push on the opening; the tag keeps λ = 1
    # The net push Σ_i λ_i,t A_i on the shared opening, per token: Eq. 5 promotes it, GRPO lowers it, the guard
    # leaves it alone (0), while the positives' own opening (the tag) keeps GRPO's push 2·a_pos.
    push = lambda lam: (lam[:, 0] * adv * fw[:, 0]).sum().item()  # noqa: E731
    assert push(paper) == pytest.approx(2 * a_pos) and push(torch.ones_like(paper)) == pytest.approx(a_pos + 4 * a_neg)
    assert push(guard) == 0.0
    assert (guard[:2, 0] * adv[:2]).sum().item() == pytest.approx(2 * a_pos)


def test_tokens_the_group_favours_keep_grpo_update():
    """A shared token whose sharers' advantages sum to >= 0 (two positives and one negative, or a tie) is not
    contested: λ = 1 for both signs, GRPO's update, instead of Eq. 5's 2 and 0."""
    rows = [[5, 1], [5, 2], [5, 3], [6, 4]]
    adv = core.group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4)  # S on token 5 = a - a + a > 0
    ids, mask = _pad(rows)
    fw, bw = core.conflict_spans(ids, mask, adv, 4)
    contested = core.contested_tokens(ids, mask, adv, 4, fw, bw)
    assert fw[:3, 0].all() and not contested.any()
    assert core.conflict_weights(fw, bw, adv, group_size=4, contested=contested).eq(1).all()
    tie = core.group_advantages(torch.tensor([1.0, 0.0]), 2)  # one positive, one negative: S = 0 up to rounding
    ids, mask = _pad([[5, 1], [5, 2]])
    fw, bw = core.conflict_spans(ids, mask, tie, 2)
    assert fw[:, 0].all() and not core.contested_tokens(ids, mask, tie, 2, fw, bw).any()


def test_backward_spans_are_aligned_from_each_end():
    rows = [[1, 9, 8], [2, 2, 9, 8], [9, 8]]  # "9 8" ends all three at different positions
    adv = torch.tensor([0.5, -1.0, -1.0])
    ids, mask = _pad(rows)
    fw, bw = core.conflict_spans(ids, mask, adv, 3)
    contested = core.contested_tokens(ids, mask, adv, 3, fw, bw)
    assert bw.sum(-1).tolist() == [2, 2, 2]
    assert [row.nonzero().flatten().tolist() for row in contested] == [[1, 2], [2, 3], [0, 1]]


def _inputs(rows, adv, contested=True, spans=True):
    ids, mask = _pad(rows)
    g = len(rows)
    fw, bw = core.conflict_spans(ids, mask, adv, g)
    logps = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) - 2
    c = core.contested_tokens(ids, mask, adv, g, fw, bw) if contested else None
    return dict(per_token_logps=logps.requires_grad_(), completion_mask=mask, advantages=adv,
                forward_span=fw if spans else None, backward_span=bw if spans else None, contested_span=c)  # fmt: skip


def _loss_and_grad(**kwargs):
    kwargs = dict(kwargs)
    kwargs["per_token_logps"] = kwargs["per_token_logps"].detach().clone().requires_grad_()
    loss, _ = gtpo_loss(LossInputs(**kwargs), LossSettings(entropy_filter="never", gamma=0.0))
    loss.backward()
    return loss.item(), kwargs["per_token_logps"].grad


def test_guard_loss_is_the_definition_and_changes_nothing_where_nothing_is_contested():
    rows = [[7, 1, 9], [7, 2, 9], [5, 5, 6, 3], [5, 5, 6, 3], [5, 5, 6, 8], [5, 5, 6, 4, 4], [5, 5, 6, 1], [2, 8]]
    adv = core.group_advantages(torch.tensor([1.0, 1, 1, 0, 0, 0, 0, 0]), 8)
    inputs = _inputs(rows, adv)
    assert inputs["contested_span"].any()  # the control: this group contests its opening
    # By definition: the guard is Eq. 5 with M := contested tokens and both weights 0.
    contested = inputs["contested_span"]
    definition = dict(inputs, forward_span=contested, backward_span=torch.zeros_like(contested), contested_span=None)
    loss, grad = _loss_and_grad(**inputs)
    ref_loss, _ = gtpo_loss(
        LossInputs(**{**definition, "per_token_logps": definition["per_token_logps"].detach()}),
        LossSettings(entropy_filter="never", gamma=0.0, positive_weight=0.0, negative_weight=0.0),
    )
    assert loss == ref_loss.item()
    # No contested token: the guard's loss is the loss without the correction, bit for bit.
    tie = core.group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4)
    rows = [[5, 1], [6, 2], [5, 3], [6, 4]]  # each opening held by one positive and one negative: S = 0
    inputs = _inputs(rows, tie)
    assert inputs["forward_span"].any() and not inputs["contested_span"].any()
    guarded = _loss_and_grad(**inputs)
    plain = _loss_and_grad(**dict(inputs, forward_span=None, backward_span=None, contested_span=None))
    assert guarded[0] == plain[0] and torch.equal(guarded[1], plain[1])
    # No conflict at all: nothing differs from Eq. 5 (the paper's GTPO), bit for bit.
    rows = [[5, 1], [6, 2], [7, 3], [8, 4]]
    inputs = _inputs(rows, tie)
    assert not inputs["forward_span"].any() and not inputs["backward_span"].any()
    guarded = _loss_and_grad(**inputs)
    paper = _loss_and_grad(**dict(inputs, contested_span=None))
    assert guarded[0] == paper[0] and torch.equal(guarded[1], paper[1])


def test_contested_span_inputs_are_checked():
    inputs = _inputs([[5, 1], [5, 2]], torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="needs forward_span and backward_span"):
        gtpo_loss(LossInputs(**dict(inputs, forward_span=None, backward_span=None)))
    with pytest.raises(ValueError, match="contested_span must be a bool tensor"):
        gtpo_loss(LossInputs(**dict(inputs, contested_span=inputs["contested_span"].float())))
    with pytest.raises(ValueError, match="contested_span must have the shape"):
        gtpo_loss(LossInputs(**dict(inputs, contested_span=inputs["contested_span"][:, :1])))
