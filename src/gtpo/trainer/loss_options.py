"""What `GTPOTrainer._compute_loss` hands `gtpo.core.gtpo_loss` beyond GTPO's own inputs, and what it logs: the
`LossSettings` read from the config, the normalizers of TRL's loss types (from `gtpo.core.registry`), TRL's token
and sequence masks (top-entropy tokens, off-policy sequences) computed with TRL's own methods so that they mean with
GTPO what they mean with GRPO (docs/core.md, "GTPO with more of GRPOConfig"), and the loss-side metrics."""

from __future__ import annotations

import numpy
import torch

from gtpo import core


def token_normalizer(trainer, inputs):
    """The token-sum normalisers' divisor (the registry's `needs="token_normalizer"`), else None: as TRL, the valid
    tokens of the whole (all-rank) generation batch, per rank."""
    if core.registry.normaliser_of(gtpo_aggregation(trainer.args)).needs != "token_normalizer":
        return None
    return inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes


def token_mask(trainer, inputs, per_token_logps, old_per_token_logps, entropies, loss_advantages):
    """TRL's top-entropy token mask times its off-policy sequence mask, or None when neither is on.

    Args:
        trainer: the GTPOTrainer (its args, and TRL's ``get_high_entropy_mask`` / ``get_off_policy_mask``).
        inputs: the micro-batch (``completion_mask``, and ``sampling_per_token_logps`` under vLLM).
        per_token_logps: (B, T) current log-probabilities.
        old_per_token_logps: (B, T) at sampling time, or None (on-policy).
        entropies: (B, T) token entropies of the sampling distribution (TRL's, for its quantile).
        loss_advantages: (B,) A' of Eq. 7, the advantage GTPO's loss weights.

    Returns:
        None, or a (B, T) / (B, 1) 0/1 float mask: with ``top_entropy_quantile`` < 1 the tokens at or above the
        quantile of the whole batch's valid-token entropies (gathered over ranks, as TRL); with
        ``off_policy_mask_threshold`` the sequences kept by DeepSeek-V3.2's rule, keep if A' >= 0 or the mean
        KL from the sampling policy is at most the threshold (A', not A: a completion GTPO pushes down through
        the entropy shift counts as pushed down).
    """
    args, mask = trainer.args, inputs["completion_mask"]
    result = None
    if args.top_entropy_quantile < 1.0:
        result = trainer.get_high_entropy_mask(entropies.detach(), mask, 1 - args.top_entropy_quantile)  # (B, T)
    if args.off_policy_mask_threshold is not None:
        old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        off_policy = trainer.get_off_policy_mask(
            advantages=loss_advantages.reshape(-1, 1),
            per_token_logps=per_token_logps,
            sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
            mask=mask,
            off_policy_threshold=args.off_policy_mask_threshold,
        )  # (B, 1)
        result = off_policy if result is None else result * off_policy
    return result


def sequence_weights(trainer, inputs, per_token_logps, old_per_token_logps, loss_advantages):
    """Per-sequence weights φ_i for a surrogate that declares it reads them (`Surrogate.needs_sequence_weights`:
    VESPO's gamma weights, TRL's ``get_gamma_weights``, detached, with A' choosing the positive or negative
    parameters); None for every other loss type.

    Returns:
        None, or (B, 1) φ_i of the sequence ratio Σ_t log(π_θ/π_old) (times vLLM's sampling correction).
    """
    args = trainer.args
    registry = core.registry
    if not registry.SURROGATES[registry.LOSS_TYPES[args.loss_type].surrogate].needs_sequence_weights:
        return None
    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    return trainer.get_gamma_weights(
        advantages=loss_advantages.reshape(-1, 1),
        log_ratio_per_token=per_token_logps.detach() - old,
        mask=inputs["completion_mask"],
        importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
        k_pos=args.vespo_k_pos,
        lambda_pos=args.vespo_lambda_pos,
        k_neg=args.vespo_k_neg,
        lambda_neg=args.vespo_lambda_neg,
    )  # (B, 1)


def applied_lambda(args, batch: dict):
    """λ as the loss applies it (Eq. 5, or the guard's, with any common prefix left to the group) on a gathered
    generation batch (`GTPOTrainer._gathered_spans`' dict: ids, mask, advantages, spans, and the guard's ``contested``
    and the ``common_prefix`` tokens when those options are on). (N, T) float."""
    mask = batch["mask"].bool()
    extra = {key: None if batch.get(key) is None else batch[key] & mask for key in ("contested", "common_prefix")}
    return core.conflict_weights(
        batch["forward"] & mask, batch["backward"] & mask, batch["advantages"].float(),
        args.conflict_positive_weight, args.conflict_combine, group_size=batch["group_size"],
        negative_weight=args.conflict_negative_weight, sides=args.conflict_span_sides, **extra,
    )  # fmt: skip


def gtpo_aggregation(args) -> str:
    """The reduction `core.gtpo_loss` applies (`LossSettings.gtpo_aggregation`): the config's `gtpo_aggregation` with
    TRL's loss_type "grpo" (Eq. 7's "sequence" or the authors' "reference"), else the loss_type's own."""
    return args.gtpo_aggregation if args.loss_type == "grpo" else args.loss_type


def loss_settings(trainer) -> core.LossSettings:
    """`gtpo.core.LossSettings` from the config (⟨H⟩_ini as measured or restored)."""
    args = trainer.args
    normaliser = core.registry.normaliser_of(gtpo_aggregation(args))
    return core.LossSettings(
        positive_weight=args.conflict_positive_weight,
        negative_weight=args.conflict_negative_weight,
        span_sides=args.conflict_span_sides,
        conflict_count=args.conflict_count,
        combine=args.conflict_combine,
        entropy_filter=args.entropy_filter,
        entropy_threshold=args.entropy_threshold,
        initial_entropy=trainer.initial_entropy,
        gamma=args.entropy_gamma,
        entropy_term=args.entropy_term,
        gtpo_aggregation=gtpo_aggregation(args),
        surrogate=core.registry.LOSS_TYPES[args.loss_type].surrogate,
        epsilon_low=trainer.epsilon_low,
        epsilon_high=trainer.epsilon_high,
        max_completion_length=trainer.max_completion_length if normaliser.needs == "max_completion_length" else None,
        delta=args.delta,
        importance_sampling_level=args.importance_sampling_level,
        beta=args.beta,
        kl_bias_correction=bool(args.use_bias_correction_kl),
        sapo_temperatures=(args.sapo_temperature_pos, args.sapo_temperature_neg),
    )


def log_metrics(trainer, mode, metrics, per_token_logps, old_per_token_logps, entropies, mask, advantages):
    """GTPO's metrics (mean over ranks), plus TRL's loss-side `entropy` and `clip_ratio/*` with TRL's formulas.

    One gather and one host read for all of them (on a GPU each is a sync of a step that small models leave waiting on
    the host). ``metrics`` values are 0-d tensors, or plain numbers that are the same on every rank (logged as their
    float32 value, as a gathered tensor would give them, without a host-to-device copy)."""
    device = per_token_logps.device
    mask = mask.to(per_token_logps.dtype)
    token_sums = [(entropies.detach() * mask).sum()]
    clipped = old_per_token_logps is not None
    if clipped:
        coef = torch.exp(per_token_logps.detach() - old_per_token_logps)
        adv = advantages.reshape(-1, 1) if advantages.dim() == 1 else advantages
        low = ((coef < 1 - trainer.epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((coef > 1 + trainer.epsilon_high) & (adv > 0)).to(mask.dtype)
        token_sums += [(x * mask).sum() for x in (low, high, torch.maximum(low, high))]
    # Else on-policy: the ratio is 1 at every token, so TRL's clip ratios are exactly 0 (ε_low, ε_high ≥ 0).
    token_sums.append(mask.sum())
    keys = sorted(k for k, v in metrics.items() if isinstance(v, torch.Tensor))  # same order on every rank
    row = torch.stack([x.float() for x in token_sums] + [metrics[k].to(device).float().reshape(()) for k in keys])
    width = len(token_sums)
    gathered = trainer.accelerator.gather(row.reshape(1, -1)).reshape(-1, row.numel())  # (ranks, width + K)
    totals = gathered[:, :width].sum(dim=0)  # summed over ranks
    values = torch.cat([totals[:-1] / totals[-1].clamp(min=1.0), gathered[:, width:].nanmean(dim=0)]).tolist()
    token_means, means = values[: width - 1], values[width - 1 :]
    entropy, clip_means = token_means[0], (token_means[1:] if clipped else [0.0, 0.0, 0.0])
    names = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
    for key, value in zip(names, (entropy, *clip_means), strict=True):
        trainer._metrics[mode][key].append(value)
    for key, value in zip(keys, means, strict=True):
        trainer._metrics[mode][key].append(value)
    for key in sorted(k for k, v in metrics.items() if not isinstance(v, torch.Tensor)):
        trainer._metrics[mode][key].append(float(numpy.float32(metrics[key])))
