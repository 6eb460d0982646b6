"""Loss aggregations of gtpo.core.gtpo_loss (sequence = grpo, bnpo, dr_grpo, dapo): TRL 1.16's
`_compute_loss` formulas written out independently here, composed with λ, δ and the entropy shift;
invariance to the micro-batch split (gradient accumulation) and to splitting over two ranks (DDP mean)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from gtpo.core import conflict_weights

sys.path.insert(0, str(Path(__file__).parent))
from test_core_loss import entropy_batch, leaf_logps  # noqa: E402

from loss_helpers import keyword_loss  # noqa: E402

EPS_LOW, EPS_HIGH, MAX_LEN = 0.2, 0.28, 20


def trl_loss(logps, old, mask, adv, loss_type, *, max_completion_length=MAX_LEN, num_items=None, processes=1):
    """TRL 1.16 GRPOTrainer._compute_loss, β = 0, token-level ratios, before its accumulation scaling."""
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
    a = adv.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
    m = mask.float()
    if loss_type == "grpo":
        return ((per_token_loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * m).sum() / m.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * m).sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":
        return (per_token_loss * m).sum() / (torch.tensor(float(num_items)).clamp(min=1.0) / processes)
    raise AssertionError(loss_type)


def kwargs_for(aggregation, mask):
    if aggregation == "dr_grpo":
        return dict(max_completion_length=MAX_LEN)
    if aggregation == "dapo":
        return dict(token_normalizer=mask.sum().float())  # one process: all the batch's valid tokens
    return {}


@pytest.mark.parametrize("aggregation", ["grpo", "sequence", "bnpo", "dr_grpo", "dapo"])
def test_aggregation_with_unit_weights_equals_trls_formula_in_value_and_gradient(aggregation):
    mask, adv, _, _, _ = entropy_batch(seed=2)
    logps = leaf_logps(mask, seed=3)
    old = logps.detach() + 0.3 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(4))
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        old_per_token_logps=old,
        entropy_filter="never",
        gamma=0.0,
        gtpo_aggregation=aggregation,
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
        **kwargs_for(aggregation, mask),
    )
    ref_logps = logps.detach().clone().requires_grad_()
    loss_type = "grpo" if aggregation == "sequence" else aggregation
    expected = trl_loss(ref_logps, old, mask, adv, loss_type, num_items=mask.sum().item())
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(logps.grad, ref_logps.grad)


def gtpo_token_loss(logps, mask, adv, fw, bw, h, gamma, threshold):
    """−λ·r·A' per valid token, λ from the original signs, A' = δ·(A − γ⟨H⟩) (Eqs. 5–7), r = 1 with gradient."""
    mean_h = (h * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    a_used = torch.where(mean_h <= threshold, adv - gamma * mean_h, 0.0)
    lam = conflict_weights(fw, bw, adv)
    ratio = torch.exp(logps - logps.detach())
    return -(ratio * a_used.unsqueeze(-1) * lam) * mask.float()


@pytest.mark.parametrize("aggregation", ["bnpo", "dr_grpo", "dapo"])
def test_aggregation_composes_with_lambda_filter_and_entropy_shift_only_the_normalization_differs(aggregation):
    mask, adv, fw, bw, h = entropy_batch(seed=5)
    logps = leaf_logps(mask, seed=6)
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        forward_span=fw,
        backward_span=bw,
        token_entropy=h,
        entropy_filter="always",
        gamma=0.3,
        gtpo_aggregation=aggregation,
        **kwargs_for(aggregation, mask),
    )
    ref_logps = logps.detach().clone().requires_grad_()
    token_loss = gtpo_token_loss(ref_logps, mask, adv, fw, bw, h, 0.3, 0.6931471805599453)
    denominator = {"bnpo": mask.sum(), "dr_grpo": mask.shape[0] * MAX_LEN, "dapo": mask.sum()}[aggregation]
    expected = token_loss.sum() / denominator
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(logps.grad, ref_logps.grad)


def split_losses(aggregation, parts, logps, mask, adv, fw, bw, h, **extra):
    """gtpo_loss on row slices of one batch; returns the losses."""
    out = []
    for rows in parts:
        out.append(
            keyword_loss(
                logps[rows],
                mask[rows],
                adv[rows],
                forward_span=fw[rows],
                backward_span=bw[rows],
                token_entropy=h[rows],
                entropy_filter="always",
                gamma=0.1,
                gtpo_aggregation=aggregation,
                **extra,
            )[0]
        )
    return out


def full_and_grad(aggregation, logps, mask, adv, fw, bw, h, **extra):
    loss = split_losses(aggregation, [slice(None)], logps, mask, adv, fw, bw, h, **extra)[0]
    (grad,) = torch.autograd.grad(loss, logps)
    return loss, grad


def test_dapo_micro_batches_of_any_size_sum_to_the_whole_batch_loss():
    mask, adv, fw, bw, h = entropy_batch(seed=7)
    logps = leaf_logps(mask, seed=8)
    tokens = mask.sum().float()  # TRL's num_items_in_batch: the whole (generation) batch's valid tokens
    full, full_grad = full_and_grad("dapo", logps, mask, adv, fw, bw, h, token_normalizer=tokens)
    parts = [slice(0, 5), slice(5, 17), slice(17, 36)]  # unequal micro-batches
    pieces = split_losses("dapo", parts, logps, mask, adv, fw, bw, h, token_normalizer=tokens)
    total = sum(pieces)
    (grad,) = torch.autograd.grad(total, logps)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(grad, full_grad)


def test_dr_grpo_equal_micro_batches_averaged_as_trl_accumulates_give_the_whole_batch_loss():
    mask, adv, fw, bw, h = entropy_batch(seed=9)
    logps = leaf_logps(mask, seed=10)
    full, full_grad = full_and_grad("dr_grpo", logps, mask, adv, fw, bw, h, max_completion_length=MAX_LEN)
    parts = [slice(0, 12), slice(12, 24), slice(24, 36)]
    pieces = split_losses("dr_grpo", parts, logps, mask, adv, fw, bw, h, max_completion_length=MAX_LEN)
    total = sum(pieces) / len(parts)  # TRL: each micro-batch's loss / current_gradient_accumulation_steps
    (grad,) = torch.autograd.grad(total, logps)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(grad, full_grad)


@pytest.mark.parametrize("aggregation", ["dapo", "dr_grpo"])
def test_two_ranks_averaged_by_ddp_give_the_single_process_gradient(aggregation):
    mask, adv, fw, bw, h = entropy_batch(seed=11)
    logps = leaf_logps(mask, seed=12)
    single = dict(token_normalizer=mask.sum().float()) if aggregation == "dapo" else dict(max_completion_length=MAX_LEN)
    _, full_grad = full_and_grad(aggregation, logps, mask, adv, fw, bw, h, **single)
    # Two ranks of 18 rows; dapo's normalizer is the global token count / num_processes, as TRL passes it.
    per_rank = dict(token_normalizer=mask.sum().float() / 2) if aggregation == "dapo" else single
    ranks = split_losses(aggregation, [slice(0, 18), slice(18, 36)], logps, mask, adv, fw, bw, h, **per_rank)
    grads = [torch.autograd.grad(loss, logps)[0] for loss in ranks]
    torch.testing.assert_close((grads[0] + grads[1]) / 2, full_grad)  # DDP: mean of the ranks' gradients


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(gtpo_aggregation="dr_grpo"),
            "gtpo_aggregation='dr_grpo' divides by N × max_completion_length: pass max_completion_length",
        ),
        (dict(gtpo_aggregation="dr_grpo", max_completion_length=0), "got 0"),
        (dict(gtpo_aggregation="dapo"), "gtpo_aggregation='dapo' divides by the valid tokens .* pass token_normalizer"),
        (dict(gtpo_aggregation="dapo", token_normalizer=torch.tensor(0.0)), "got 0.0"),
        (dict(gtpo_aggregation="dapo", token_normalizer=float("inf")), "got inf"),
        (dict(gtpo_aggregation="dapo", token_normalizer=torch.ones(2)), "shape \\(2,\\)"),
        (
            dict(gtpo_aggregation="bnpo", token_normalizer=3.0),
            "token_normalizer is used only by gtpo_aggregation='dapo'",
        ),
        (dict(gtpo_aggregation="sequence", max_completion_length=8), "used only by gtpo_aggregation='dr_grpo'"),
        (
            dict(gtpo_aggregation="token"),
            "unknown gtpo_aggregation 'token'; valid: bnpo, cispo, dapo, dr_grpo, grpo, luspo, reference, sapo, "
            "sequence, vespo",
        ),
    ],
)
def test_aggregation_normalizers_missing_or_misplaced_are_rejected_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keyword_loss(
            torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([1.0, -1.0]), entropy_filter="never", gamma=0.0, **kwargs
        )


class _Accelerator:
    """One process: TRL's reduce/gather are identities."""

    num_processes = 1
    sync_gradients = True

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather


def trl_compute_loss(loss_type, logps, old, mask, adv, accumulation=2, steps_per_generation=2):
    """TRL 1.16's own GRPOTrainer._compute_loss, run unbound on a stub trainer whose model returns `logps`."""
    from collections import defaultdict
    from types import SimpleNamespace

    from trl.trainer.grpo_trainer import GRPOTrainer

    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
        use_vllm=False,
        args=SimpleNamespace(delta=None, steps_per_generation=steps_per_generation),
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=accumulation,
        max_completion_length=MAX_LEN,
        accelerator=_Accelerator(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
    )
    n, t = mask.shape
    inputs = dict(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.zeros(n, t, dtype=torch.long),
        completion_mask=mask.long(),
        advantages=adv,
        old_per_token_logps=old,
        num_items_in_batch=mask.sum(),
    )
    return GRPOTrainer._compute_loss(stub, None, inputs)


@pytest.mark.parametrize("aggregation", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_aggregation_with_unit_weights_equals_trls_own_compute_loss_after_its_accumulation_scaling(aggregation):
    # TRL divides grpo/bnpo/dr_grpo by the accumulation steps and dapo by num_items·accumulation/steps_per_generation;
    # GTPOTrainer applies the same outer scaling to core's loss (trainer.py), restated here with accumulation = 2.
    mask, adv, _, _, _ = entropy_batch(seed=13)
    logps = leaf_logps(mask, seed=14)
    old = logps.detach() + 0.3 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(15))
    loss, _ = keyword_loss(
        logps,
        mask,
        adv,
        old_per_token_logps=old,
        entropy_filter="never",
        gamma=0.0,
        gtpo_aggregation=aggregation,
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
        **kwargs_for(aggregation, mask),
    )
    loss = loss / (2 / 2 if aggregation == "dapo" else 2)  # accumulation 2, steps_per_generation 2
    ref_logps = logps.detach().clone().requires_grad_()
    expected = trl_compute_loss(aggregation, ref_logps, old, mask, adv)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(logps.grad, ref_logps.grad)
