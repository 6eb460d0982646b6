"""What the default γ realization A' = A − γ⟨H⟩_i (⟨H⟩ detached, the authors' code) does, as docs/core.md states:
it updates a group whose rewards are all equal, and on a confident policy one step raises the entropy
(paper Sec. 6.2), where the differentiable +γ⟨H⟩ term lowers it. Gradients checked against hand formulas."""

from __future__ import annotations

import torch

from gtpo.core import token_entropy
from loss_helpers import keyword_loss  # noqa: E402

GAMMA = 0.1


def one_step(entropy_term: str):
    """A one-token policy with logits (4, 0, 0) (p₀ ≈ 0.965), G = 2 completions both sampling token 0, equal
    rewards (A = 0). Returns the logits' gradient, the entropy before and after one SGD step of rate 1."""
    z = torch.tensor([4.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    logits = z.expand(2, 1, 3)  # (N=2, T=1, V=3)
    logps = torch.log_softmax(logits, dim=-1)[..., 0]  # (2, 1) both completions are token 0
    loss, _ = keyword_loss(
        logps,
        torch.ones(2, 1),
        torch.zeros(2),
        token_entropy=token_entropy(logits),
        entropy_filter="never",
        gamma=GAMMA,
        entropy_term=entropy_term,
    )
    (grad,) = torch.autograd.grad(loss, z)
    with torch.no_grad():
        return grad, token_entropy(z).item(), token_entropy(z - grad).item()


def hand_values():
    p = torch.softmax(torch.tensor([4.0, 0.0, 0.0], dtype=torch.float64), dim=-1)
    h = -(p * p.log()).sum()
    return p, h


def test_default_shift_updates_an_all_equal_reward_group_and_raises_a_confident_policys_entropy():
    grad, before, after = one_step("advantage")
    p, h = hand_values()
    # Loss = −(1/2) Σ_i A'_i log p₀ with A' = −γH: gradient γH(e₀ − p) ≠ 0 although every A = 0.
    torch.testing.assert_close(grad, GAMMA * h * (torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64) - p))
    assert after > before  # the sampled (likely) token is pushed down: the distribution flattens
    none_grad, _, _ = one_step("none")
    assert torch.equal(none_grad, torch.zeros(3, dtype=torch.float64))  # GRPO's update of this group: none


def test_differentiable_entropy_term_lowers_a_confident_policys_entropy():
    grad, before, after = one_step("differentiable")
    p, h = hand_values()
    torch.testing.assert_close(grad, GAMMA * (-p * (p.log() + h)))  # γ ∂H/∂z_k = −γ p_k (ln p_k + H)
    assert after < before
