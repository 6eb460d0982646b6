"""What `GTPOTrainer._compute_loss` hands `gtpo.core.gtpo_loss` beyond GTPO's own inputs: the normalizers of TRL's
loss types, and TRL's token and sequence masks (top-entropy tokens, off-policy sequences), computed with TRL's own
methods so that they mean with GTPO what they mean with GRPO (docs/core.md, "GTPO with more of GRPOConfig")."""

from __future__ import annotations


def aggregation_kwargs(trainer, inputs) -> dict:
    """The normalizers TRL's loss types use, for core's aggregations of the same names."""
    aggregation = trainer.args.core_aggregation
    if aggregation == "dr_grpo":
        return {"max_completion_length": trainer.max_completion_length}
    if aggregation in ("dapo", "cispo", "vespo"):
        # As TRL: valid tokens of the whole (all-rank) generation batch, per rank.
        return {"token_normalizer": inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes}
    return {}


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
    """VESPO's per-sequence gamma weights φ_i (TRL's ``get_gamma_weights``, detached), with A' choosing the
    positive or negative parameters; None for every other loss type.

    Returns:
        None, or (B, 1) φ_i of the sequence ratio Σ_t log(π_θ/π_old) (times vLLM's sampling correction).
    """
    args = trainer.args
    if args.loss_type != "vespo":
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
