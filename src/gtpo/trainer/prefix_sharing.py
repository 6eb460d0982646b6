"""GRPOTrainer's scoring hook with each prompt encoded once: the packed layout (`gtpo.forward.packing`) where it can
run and pays off, TRL's padded one otherwise, the reason logged once.

Every log-prob TRL computes goes through `GRPOTrainer._get_per_token_logps_and_entropies`: the loss, the old
log-probs, the reference model's (beta > 0) and GTPO's ⟨H⟩_ini. `GTPOTrainer` overrides it with
:func:`per_token_logps_and_entropies` for both algorithms, so that GTPO-vs-GRPO comparisons run on the same layout.
What packing is, and why its numbers are TRL's, is `gtpo.forward.packing`'s; which layout costs less,
`gtpo.forward.layout_choice`'s; the packed layout's attention by FlexAttention's block mask (opt-in,
``GTPO_PACKED_ATTENTION=flex``), `gtpo.forward.flex`'s. What is here reads the trainer: its settings
(`use_prefix_sharing`), its sharding, its accelerator, and the notes it has already logged.
"""

from __future__ import annotations

import logging

import torch

from gtpo.forward import flex
from gtpo.forward.layout_choice import ATTENTION_ENV, LAYOUT_ENV, choose_layout, layout_override, packed_attention
from gtpo.forward.packing import MASKED_ATTENTION, PackedBatch, host_copy, layout_problem, pack, scoring_only

logger = logging.getLogger(__name__)


def per_token_logps_and_entropies(
    trainer, padded, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
    extra,
):  # fmt: skip
    """`GRPOTrainer._get_per_token_logps_and_entropies` with each distinct prompt encoded once per micro-batch.

    Every log-prob TRL computes goes through that method: the loss, the old log-probs, the reference model's
    (beta > 0) and GTPO's ⟨H⟩_ini. Where packing cannot apply, would cost more, or would leave no position to run,
    ``padded`` (TRL's method) scores the batch, and the reason is logged once. Used by `GTPOTrainer` for both
    algorithms, so that GTPO-vs-GRPO comparisons run on the same layout.

    Args:
        trainer: the GTPOTrainer. padded: TRL's bound method, for the fallback.
        model, input_ids (B, L), attention_mask (B, L), logits_to_keep (K), batch_size, compute_entropy,
        compute_aux_loss, extra (the vision inputs): TRL's arguments.

    Returns:
        TRL's (log-probs (B, K), entropies (B, K) or None, aux loss or None).
    """
    reason = problem(trainer, model, compute_aux_loss, extra)
    if reason is None and not _packing_can_pay_off(trainer, model, input_ids, logits_to_keep, batch_size):
        # Decided from the shapes alone, before the layout checks and `pack`, whose host syncs are what a
        # host-bound GPU step would lose (4.8 ms of a 24 ms step at the paper-vocabulary shape on an H100).
        reason = _padded_reason("packing cannot save its own cost at this model's size on this device")
    on_host = None if reason is not None else host_copy(input_ids, attention_mask, logits_to_keep)
    reason = reason or layout_problem(on_host[:, input_ids.shape[1] - logits_to_keep :], logits_to_keep)
    if reason is not None:
        _note(trainer, reason)
        return padded(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **extra
        )
    unwrapped = trainer.accelerator.unwrap_model(model)
    mask_dtype = None if unwrapped.config._attn_implementation == "sdpa" else unwrapped.dtype
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
        packed = pack(ids, mask, logits_to_keep, mask_dtype=mask_dtype, on_host=on_host[start : start + batch_size])
        if packed.length == 0:
            # One-token prompts (empty prefixes) and no unmasked completion token (mask_truncated_completions
            # masks truncated rows): nothing to run, and a model cannot take a 0-length sequence. TRL's padded
            # forward gives this batch's numbers (0, with a zero gradient through the graph) and keeps every rank's
            # forward and backward in step. `length` is a host int, so the check adds no sync.
            _note(trainer, "a micro-batch of one-token prompts with no completion token to score packs into nothing")
            logps, entropies, _ = padded(model, ids, mask, logits_to_keep, None, compute_entropy)
        elif choose_layout(unwrapped.config, *ids.shape, packed.length, ids.device.type) == "padded":
            _note(trainer, _padded_reason("packing would cost more than padding for this batch's lengths"))
            logps, entropies, _ = padded(model, ids, mask, logits_to_keep, None, compute_entropy)
        else:
            args = (trainer, model, packed, mask, logits_to_keep)
            attention = _flex_mask(trainer, unwrapped, packed)
            logps, entropies = packed_logps(*args) if attention is None else packed_logps(*args, attention)
        all_logps.append(logps)
        all_entropies.append(entropies)
    entropies = torch.cat(all_entropies) if compute_entropy else None
    return torch.cat(all_logps), entropies, None


def _packing_can_pay_off(trainer, model, input_ids, logits_to_keep, batch_size) -> bool:
    """Whether packing could be chosen even at its best (one prompt, one-token completions): from shapes only."""
    config = trainer.accelerator.unwrap_model(model).config
    rows, length = input_ids.shape
    rows = min(rows, batch_size or rows)
    best_packed_length = length - logits_to_keep - 1 + rows
    return choose_layout(config, rows, length, best_packed_length, input_ids.device.type) == "packed"


def _flex_mask(trainer, unwrapped, packed: PackedBatch):
    """FlexAttention's block mask for this packed batch where the user asked for it (:data:`ATTENTION_ENV`) and it
    can run, else None: the dense mask, with the reason logged once."""
    if packed_attention() != "flex":
        return None
    reason = flex.problem(unwrapped, packed.input_ids.device.type, torch.is_grad_enabled())
    if reason is not None:
        _note(trainer, reason, f"{ATTENTION_ENV}=flex off", "the packed layout's dense mask")
        return None
    return flex.block_mask(packed)


def _padded_reason(by_cost: str) -> str:
    """Why :func:`choose_layout` said "padded": the user's :data:`LAYOUT_ENV`, or ``by_cost``."""
    return f"{LAYOUT_ENV}=padded" if layout_override() == "padded" else by_cost


def packed_logps(trainer, model, packed: PackedBatch, attention_mask, logits_to_keep, attention=None):
    """(B, K) log-probs and entropies of one packed micro-batch, in TRL's padded layout; ``attention``: the
    packed layout's mask in another form (FlexAttention's block mask), else its dense one."""
    with scoring_only(packed.scored) as head, trainer.accelerator.autocast():
        capture = None if head.entropy is None else head.entropy.capture  # `untempered`'s, if its policy is on
        seen = len(capture.sampling) if capture is not None else 0
        output = model(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask if attention is None else attention,
            position_ids=packed.position_ids,
            shift_labels=packed.shift_labels,
            fused_lm_head=True,
        )
    if not trainer.__dict__.get("_prefix_sharing_announced"):
        trainer._prefix_sharing_announced = True
        logger.info(
            "prefix sharing: %d rows (%d distinct prompts) packed into %d positions, against %d padded "
            "(use_prefix_sharing=False for TRL's layout)%s",
            attention_mask.size(0), packed.prompts, packed.input_ids.size(1), attention_mask.numel(),
            "" if attention is None else f"; attention by FlexAttention's block mask ({ATTENTION_ENV}=flex)",
        )  # fmt: skip
    if capture is not None:  # the tempered entropies `untempered` set aside, into TRL's (B, L-1) layout
        for index in range(seen, len(capture.sampling)):
            flat = capture.sampling[index]
            if flat.numel() != packed.length:  # the scored positions only: laid out by index (no host sync)
                flat = flat.new_zeros(packed.length).index_copy(0, packed.scored_index, flat)
            full = flat.new_zeros(attention_mask.size(0), attention_mask.size(1) - 1)
            full[:, -logits_to_keep:] = packed.unpack(flat)
            capture.sampling[index] = full.reshape(-1)
    entropies = None if output.entropy is None else packed.unpack(output.entropy)
    return packed.unpack(output.log_probs), entropies


def problem(trainer, model, compute_aux_loss, extra) -> str | None:
    """Why the packed layout cannot run for this model and these inputs, or None."""
    if not getattr(trainer.args, "use_prefix_sharing", True):
        return "use_prefix_sharing=False"
    if any(value is not None for value in extra.values()):
        return "vision-language inputs"
    if compute_aux_loss:
        return "the MoE load-balancing loss takes a 2D attention mask"
    if getattr(trainer, "is_fsdp_enabled", False) or getattr(trainer, "is_deepspeed_enabled", False):
        return "FSDP and DeepSpeed are not tested with the packed layout"
    unwrapped = trainer.accelerator.unwrap_model(model)
    peft_config = getattr(unwrapped, "active_peft_config", None)
    if peft_config is not None and peft_config.is_prompt_learning:
        return "prompt-learning PEFT adds virtual tokens to every row"
    config = unwrapped.config
    text = config.get_text_config()
    if config.is_encoder_decoder:
        return "an encoder-decoder model"
    if config._attn_implementation not in MASKED_ATTENTION:
        return f"attn_implementation={config._attn_implementation!r} ignores custom 4D masks (sdpa or eager do not)"
    if any(kind != "full_attention" for kind in getattr(text, "layer_types", None) or ()):
        return "layers with sliding or chunked attention"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "sliding-window attention"
    return None


def _note(trainer, reason: str, what: str = "prefix sharing off", instead: str = "TRL's padded layout") -> None:
    noted = trainer.__dict__.setdefault("_prefix_sharing_notes", set())
    if reason not in noted:
        noted.add(reason)
        logger.info("%s (%s): %s scores this batch", what, reason, instead)
