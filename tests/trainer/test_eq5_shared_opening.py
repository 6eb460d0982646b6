"""What Eq. 5 does to a shared opening, shown exactly with a real model (docs/core.md, "What Eq. 5 does to a shared
opening").

Invariant. In one group, let completions of both signs open with the same K tokens after the same prompt. At each
shared position t < K their contexts are identical, so the gradient of logp_{i,t} (w.r.t. every model parameter) is
one vector g_t for every sharer i, and so is the ratio r_t = exp(logp_t − old_t). With w_j each completion's length
weight (``sequence`` = loss_type grpo: 1/(|o_j|·N); ``dapo``: 1/token_normalizer), the gradient of the loss restricted
to those positions (``token_mask``) is

    Σ_t s_t·g_t,  s_t = −r_t·Σ_{j sharer, not clipped at t} λ_j·A_j·w_j,

where j is clipped at t when A_j > 0 and r_t > 1 + ε, or A_j < 0 and r_t < 1 − ε (min(r·A, clip(r)·A) then takes its
constant branch). On-policy (r ≡ 1, nothing clipped) this is −(Σ_j λ_j·A_j·w_j)·g with g the gradient of
Σ_{t<K} logp_{i,t} of any sharer. So:

- without the correction (λ = 1) the group's update on the opening is S = Σ_j A_j·w_j times one gradient: the
  group's own evidence on it, with its sign, and no conflict between rows;
- with Eq. 5 (λ = 2 on the positives' span tokens, 0 on the negatives') it is 2·Σ_{A_j>0} A_j·w_j > 0 whatever S:
  here S < 0 (the opening fails more often than the group) and Eq. 5 pushes it up; where the whole group shares it,
  S = 0 under Eq. 8 with equal length weights (``dapo``) and Eq. 5 still pushes it up;
- with ``common_prefix_span`` (GTPOConfig.conflict_exclude_common_prefix) it is S again;
- a span token shared only by position (after prefixes that differ), and a backward-span token, have per-row
  gradients that differ (the case the paper argues for), and the option leaves Eq. 5 on them.

Every expected value is written from these formulas with the advantages, lengths, ratios and per-row gradients;
only the loss under test runs `gtpo_loss`. Tolerance: ‖actual − expected‖ ≤ 1e-5 × Σ_t Σ_j |λ_j·A_j·w_j|·r_t·‖g_t‖
(float32 rounding of one batched forward; the sharers' gradients agree to about 1e-9 relative).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from gtpo.core import LossInputs, LossSettings, common_prefix_conflicts, conflict_spans, group_advantages, gtpo_loss

PROMPT = [101, 102, 103, 104, 105]
K = 3  # the shared opening's length
OPENING = [201, 202, 203]
PAD = 0
RTOL = 1e-5  # of the scale of the expected gradient (module docstring)
EPSILON = 0.3  # the clip range under clipping; the perturbed old policy puts r above it, inside and below it
PAPER_LAMBDA = {1: 2.0, -1: 0.0}  # Eq. 5 inside a span: 2 for A > 0, 0 for A < 0 (App. 11, Eq. 19)

# "subset": rows 0-3 (one positive, three negatives) share the opening, so S < 0. Row 0's 301 at position K is
# shared by position only with row 5 (A < 0, another opening): in row 0's forward span, outside its common prefix.
# Rows 2 (A < 0) and 4 (A > 0) end alike (391 392): a backward span with different contexts.
# "whole": all six rows open alike and then differ; Σ_j A_j = 0 (Eq. 8).
SCENARIOS = {
    "subset": dict(
        rows=[
            [*OPENING, 301, 302, 303, 304],
            [*OPENING, 311, 312],
            [*OPENING, 321, 322, 391, 392],
            [*OPENING, 331],
            [241, 242, 243, 344, 391, 392],
            [251, 252, 253, 301, 355],
        ],
        rewards=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        sharers=[0, 1, 2, 3],
    ),
    "whole": dict(
        rows=[
            [*OPENING, 401, 402, 403, 404],
            [*OPENING, 411, 412],
            [*OPENING, 421, 422, 423],
            [*OPENING, 431],
            [*OPENING, 441, 442, 443, 444, 445],
            [*OPENING, 451, 452],
        ],
        rewards=[1.0, 0.0, 0.0, 1.0, 0.0, 1.0],
        sharers=[0, 1, 2, 3, 4, 5],
    ),
}


@pytest.fixture(scope="module")
def models(tiny_model_path):
    """The tiny model in float32 on the CPU, and a perturbed copy of it as the sampling-time (old) policy."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    old = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model, old


class Group:
    """One group: ids, advantages, spans, per-token log-probs (with their graph) and the per-row gradients."""

    def __init__(self, model, old, rows, rewards, sharers):
        self.n, self.t = len(rows), max(len(r) for r in rows)
        self.ids = torch.full((self.n, self.t), PAD, dtype=torch.long)
        self.mask = torch.zeros(self.n, self.t, dtype=torch.long)
        for i, row in enumerate(rows):
            self.ids[i, : len(row)] = torch.tensor(row)
            self.mask[i, : len(row)] = 1
        self.lengths = [len(r) for r in rows]
        self.sharers = sharers
        self.advantages = group_advantages(torch.tensor(rewards), self.n)  # (N,) Eq. 8
        self.a = self.advantages.tolist()
        self.forward, self.backward = conflict_spans(self.ids, self.mask, self.advantages, self.n)
        self.params = list(model.parameters())
        self.logps = self._logps(model)  # (N, T) with its graph
        with torch.no_grad():
            self.old_logps = self._logps(old)  # (N, T)
        self.ratio = torch.exp(self.logps - self.old_logps).detach()  # (N, T)
        self.row_grads = {(i, t): self.grad(self.logps[i, t]) for i in sharers for t in range(K)}  # g_t per row

    def _logps(self, model):
        prompt = torch.tensor(PROMPT).repeat(self.n, 1)
        input_ids = torch.cat([prompt, self.ids], dim=1)
        attention = torch.cat([torch.ones_like(prompt), self.mask], dim=1)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, len(PROMPT) - 1 : -1]  # (N, T, V)
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, self.ids.unsqueeze(-1)).squeeze(-1)  # (N, T)

    def grad(self, scalar) -> torch.Tensor:
        """d scalar / d parameters, flattened."""
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(scalar, self.params, retain_graph=True)])

    def opening_mask(self) -> torch.Tensor:
        mask = torch.zeros(self.n, self.t)
        mask[self.sharers, :K] = 1.0
        return mask

    def weights(self, aggregation: str) -> tuple[list[float], float | None]:
        """w_j by hand, and the token_normalizer passed for dapo."""
        if aggregation == "sequence":
            return [1.0 / (length * self.n) for length in self.lengths], None
        normalizer = float(sum(self.lengths))
        return [1.0 / normalizer] * self.n, normalizer

    def loss_grad(self, aggregation, clipped, variant, token_mask=None):
        _, normalizer = self.weights(aggregation)
        spans = {}
        if variant in ("eq5", "common_prefix"):
            spans = dict(forward_span=self.forward, backward_span=self.backward)
        if variant == "common_prefix":
            spans["common_prefix_span"] = common_prefix_conflicts(
                self.ids, self.mask, self.advantages, self.n, self.forward
            )
        inputs = LossInputs(
            per_token_logps=self.logps,
            completion_mask=self.mask,
            advantages=self.advantages,
            old_per_token_logps=self.old_logps if clipped else None,
            token_mask=self.opening_mask() if token_mask is None else token_mask,
            token_normalizer=normalizer,
            **spans,
        )
        settings = LossSettings(
            entropy_filter="never",
            gamma=0.0,
            gtpo_aggregation=aggregation,
            group_size=self.n,
            epsilon_low=EPSILON,
            epsilon_high=EPSILON,
        )
        loss, _ = gtpo_loss(inputs, settings)
        return self.grad(loss)

    def expected(self, aggregation, clipped, lam):
        """Σ_t s_t·g_t from the clip rule, and its scale Σ_t Σ_j |λ_j A_j w_j|·r_t·‖g_t‖ (for the tolerance)."""
        w, _ = self.weights(aggregation)
        total, scale = 0.0, 0.0
        for t in range(K):
            r = float(self.ratio[self.sharers[0], t]) if clipped else 1.0
            coefficient = 0.0
            for j in self.sharers:
                a = self.a[j]
                clip_binds = clipped and ((a > 0 and r > 1 + EPSILON) or (a < 0 and r < 1 - EPSILON))
                if not clip_binds:
                    coefficient += lam(j) * a * w[j]
                scale += abs(lam(j) * a * w[j]) * r * float(self.row_grads[(self.sharers[0], t)].norm())
            total = total + (-r * coefficient) * self.row_grads[(self.sharers[0], t)]
        return total, scale

    def sign(self, j) -> int:
        return 1 if self.a[j] > 0 else -1


@pytest.fixture(scope="module")
def groups(models):
    model, old = models
    return {name: Group(model, old, **spec) for name, spec in SCENARIOS.items()}


def _close(actual, expected, scale):
    err = float((actual - expected).norm())
    assert err <= RTOL * scale, f"‖actual − expected‖ = {err:.3e} > {RTOL} × {scale:.3e}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_sharers_gradients_and_ratios_at_the_opening_are_one(groups, scenario):
    """(a) Identical contexts: every sharer's gradient of Σ_{t<K} logp, and of each logp_t, is one vector; so is r_t.
    And the opening is exactly the sharers' forward span and common prefix (what the other tests rely on)."""
    group = groups[scenario]
    first = group.sharers[0]
    g = sum(group.row_grads[(first, t)] for t in range(K))
    assert float(g.norm()) > 0
    for i in group.sharers:
        g_i = sum(group.row_grads[(i, t)] for t in range(K))
        assert float((g_i - g).norm()) <= 1e-6 * float(g.norm())
        for t in range(K):
            assert float((group.row_grads[(i, t)] - group.row_grads[(first, t)]).norm()) <= 1e-6 * float(
                group.row_grads[(first, t)].norm()
            )
            assert abs(float(group.ratio[i, t] - group.ratio[first, t])) <= 1e-6
    common = common_prefix_conflicts(group.ids, group.mask, group.advantages, group.n, group.forward)
    assert torch.equal(common, group.opening_mask().bool())
    assert group.forward[group.sharers, :K].all()
    assert {group.sign(j) for j in group.sharers} == {1, -1}


@pytest.mark.parametrize("clipped", [False, True], ids=["on_policy", "clipped"])
@pytest.mark.parametrize("aggregation", ["sequence", "dapo"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_opening_gets_S_without_the_correction_and_twice_the_positives_with_eq5(
    groups, scenario, aggregation, clipped
):
    """(b)-(e): GRPO's update on the opening is S·g, Eq. 5's 2·Σ_{A>0}·g, the common-prefix option's S·g again;
    under clipping, per position, the unclipped rows' sum times r_t."""
    group = groups[scenario]
    w, _ = group.weights(aggregation)

    def one(j):
        return 1.0

    def paper(j):
        return PAPER_LAMBDA[group.sign(j)]

    plain = group.loss_grad(aggregation, clipped, "plain")
    eq5 = group.loss_grad(aggregation, clipped, "eq5")
    common = group.loss_grad(aggregation, clipped, "common_prefix")
    expected_plain, scale_plain = group.expected(aggregation, clipped, one)
    expected_eq5, scale_eq5 = group.expected(aggregation, clipped, paper)
    _close(plain, expected_plain, scale_plain)  # (b), (e)
    _close(eq5, expected_eq5, scale_eq5)  # (c), (e)
    _close(common, expected_plain, scale_plain)  # (d)

    s = sum(group.a[j] * w[j] for j in group.sharers)
    pushed = 2 * sum(group.a[j] * w[j] for j in group.sharers if group.a[j] > 0)
    assert pushed > 0
    if not clipped:  # one scalar times one g: −S·g and −2·Σ_{A>0} A_j·w_j·g with g the gradient of Σ_{t<K} logp
        g = group.grad(group.logps[group.sharers[0], :K].sum())
        _close(plain, -s * g, scale_plain)
        _close(eq5, -pushed * g, scale_eq5)
    if scenario == "subset":  # the opening fails more often than the group: GRPO pushes it down, Eq. 5 up
        assert s < 0
    elif aggregation == "dapo":  # the whole group shares it: S = 0 (Eq. 8, equal weights), and GRPO leaves it
        assert abs(s) <= 1e-6 * pushed
        if not clipped:  # (clipping drops one sign's rows at a position, so there the update is not 0)
            assert float(plain.norm()) <= RTOL * scale_plain
        assert float(eq5.norm()) > 0.1 * scale_eq5 / K
    if clipped:  # the control: clipping acted on this opening, in both directions, away from its edges
        r = [float(group.ratio[group.sharers[0], t]) for t in range(K)]
        assert any(x > 1 + EPSILON + 1e-3 for x in r) and any(x < 1 - EPSILON - 1e-3 for x in r)
        assert all(abs(abs(x - 1) - EPSILON) > 1e-3 for x in r)
        unclipped_plain, _ = group.expected(aggregation, False, one)
        assert float((plain - unclipped_plain).norm()) > 100 * RTOL * scale_plain


def _cosine(a, b) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def test_position_only_and_backward_span_tokens_have_different_gradients(groups):
    """(f) Where the sharers' contexts differ the paper's argument applies: a token shared by position only (row 0's
    and row 5's 301 at position K) and the two rows' shared ending (backward span) have per-row gradients that are
    not parallel; the common-prefix option leaves Eq. 5 on them."""
    group = groups["subset"]
    assert group.ids[0, K] == group.ids[5, K] and group.sign(0) == 1 and group.sign(5) == -1
    assert group.forward[0, K] and not group.forward[5].any()  # in row 0's span only (row 5's first token differs)
    common = common_prefix_conflicts(group.ids, group.mask, group.advantages, group.n, group.forward)
    assert not common[0, K]
    pairs = [((0, K), (5, K))]
    ends = [(2, group.lengths[2] - 1 - r, 4, group.lengths[4] - 1 - r) for r in range(2)]
    for i, ti, j, tj in ends:
        assert group.backward[i, ti] and group.backward[j, tj] and group.ids[i, ti] == group.ids[j, tj]
        pairs.append(((i, ti), (j, tj)))
    assert group.sign(2) == -1 and group.sign(4) == 1
    for (i, ti), (j, tj) in pairs:
        cosine = _cosine(group.grad(group.logps[i, ti]), group.grad(group.logps[j, tj]))
        assert abs(cosine) < 0.999, (i, ti, j, tj, cosine)

    # The option changes λ on the common prefix only: on these tokens its gradient is Eq. 5's, λ = 2 and 0 by hand.
    mask = torch.zeros(group.n, group.t)
    for (i, ti), (j, tj) in pairs:
        mask[i, ti] = mask[j, tj] = 1.0
    mask[5, K] = 0.0  # row 5's 301 is in no span (λ = 1 under every variant)
    w, _ = group.weights("sequence")
    expected, scale = 0.0, 0.0
    for i, t in torch.nonzero(mask).tolist():
        coefficient = PAPER_LAMBDA[group.sign(i)] * group.a[i] * w[i]
        g = group.grad(group.logps[i, t])
        expected = expected - coefficient * g
        scale += abs(coefficient) * float(g.norm())
    with_option = group.loss_grad("sequence", False, "common_prefix", token_mask=mask)
    _close(with_option, expected, scale)
    _close(group.loss_grad("sequence", False, "eq5", token_mask=mask), expected, scale)
    assert float((group.loss_grad("sequence", False, "plain", token_mask=mask) - expected).norm()) > 0.1 * scale
