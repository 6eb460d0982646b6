"""Temperature-1 entropy from the forward pass TRL already runs (Sec. 4.2, Eq. 6-7), no second model forward.

TRL scores completions with a fused LM head (`trl.trainer.utils.add_fused_lm_head`): the backbone's hidden
states go through `ChunkedLogProbFunction`, which divides the logits by the sampling `temperature` before
its softmax, so its entropies are those of the *tempered* distribution. The paper's H is the entropy of the
model's own next-token distribution (Sec. 4.2), and the authors' code computes it from untempered logits.

`untempered_entropy(...)` is a context manager that, for the calls made inside it, replaces that kernel with
:func:`gtpo.trainer.lm_head.token_scores`, which folds each logit tile at both temperatures: the log-probs
(and so the importance ratios) stay those of the tempered distribution, and the entropy output is the
temperature-1 one, from the same projection (one pass of the LM head, not two). It carries a gradient only
when the entropy must (`entropy_term="differentiable"`). The tempered entropies are kept on the side
(`Capture.sampling`) for TRL's own `entropy` metric, which keeps TRL's meaning (entropy of the sampling
distribution).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from gtpo.trainer import lm_head
from gtpo.trainer.trl_adapter import trl_utils

# The module global TRL's fused forward looks up at call time (trl/trainer/utils.py, `_fused_forward`).
KERNEL_NAME = "_ChunkedLogProbFunction"


@dataclass
class Capture:
    """What the wrapped kernel saw: the tempered entropy of each call, as TRL's kernel returned it."""

    sampling: list[torch.Tensor] = field(default_factory=list)


class EntropyKernel:
    """Stands in for `ChunkedLogProbFunction` (same `apply` signature); entropy output at temperature 1."""

    def __init__(
        self, kernel, capture: Capture, differentiable: bool, scored: torch.Tensor | None,
        logprobs_at_one: bool = False, entropy_clamp: float | None = None,
    ):  # fmt: skip
        self.kernel, self.capture, self.differentiable = kernel, capture, differentiable
        self.scored = None if scored is None else scored.reshape(-1)  # (B * (L-1),) positions with a label
        # GTPOConfig.logprob_temperature="model" and entropy_clamp (authors_code): log-probs at temperature 1 whatever
        # the sampling temperature, and H with p clamped inside the log, as the authors' code computes them.
        self.logprobs_at_one, self.entropy_clamp = logprobs_at_one, entropy_clamp

    def apply(
        self,
        hidden,
        weight,
        bias,
        targets,
        temperature,
        chunk_size,
        softcap=None,
        logit_scale=1.0,
        outputs=("log_probs", "entropy"),
    ):
        if "entropy" not in outputs or set(outputs) - {"log_probs", "entropy"}:
            # Nothing to replace, or fields the single-pass head does not compute: TRL's kernel as is.
            return self.kernel.apply(
                hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale, outputs
            )
        # Where TRL scores every position (devices without Triton), score only those with a label: the
        # prompt's positions would be thrown away (TRL zeroes their outputs).
        keep = self.scored if self.scored is not None and self.scored.numel() == hidden.shape[0] else None
        if keep is not None:
            keep = keep.to(hidden.device)
            hidden, targets = hidden[keep], targets[keep]
        scores = lm_head.token_scores(
            hidden,
            weight,
            bias,
            targets,
            1.0 if self.logprobs_at_one else temperature,
            chunk_size=chunk_size,
            softcap=softcap,
            logit_scale=logit_scale,
            differentiable_entropy=self.differentiable and torch.is_grad_enabled(),
        )  # three (n,)
        entropy = scores.entropy
        if self.entropy_clamp is not None:  # no gradient: authors_code's entropy term is the detached shift
            entropy = lm_head.clamped_entropy(
                hidden, weight, bias, self.entropy_clamp, chunk_size=chunk_size, softcap=softcap,
                logit_scale=logit_scale,
            )  # fmt: skip
        result = (scores.log_probs, entropy, scores.sampling_entropy)
        if keep is not None:
            result = tuple(x.new_zeros(keep.shape).masked_scatter(keep, x) for x in result)  # (N,)
        self.capture.sampling.append(result[2])
        return (result[0], result[1], None, None, None)


@contextlib.contextmanager
def untempered_entropy(
    enabled: bool = True,
    differentiable: bool = False,
    scored: torch.Tensor | None = None,
    *,
    logprobs_at_one: bool = False,
    entropy_clamp: float | None = None,
):
    """Within the block, TRL's fused LM head returns temperature-1 entropies (log-probs stay tempered).

    Yields a `Capture` whose `sampling` list receives the tempered entropy of each kernel call. With
    ``enabled=False`` nothing is patched (TRL's entropies, those of the sampling distribution).
    ``scored``: optional (B, L-1) bool, the positions TRL scores (`scored_positions`), so that the head
    skips the others where TRL's kernel runs over every position. ``logprobs_at_one`` and ``entropy_clamp``:
    `GTPOConfig.logprob_temperature="model"` and `entropy_clamp` (the authors' code's arithmetic).
    """
    capture = Capture()
    if not enabled:
        yield capture
        return
    original = getattr(trl_utils, KERNEL_NAME)
    setattr(
        trl_utils, KERNEL_NAME, EntropyKernel(original, capture, differentiable, scored, logprobs_at_one, entropy_clamp)
    )
    try:
        yield capture
    finally:
        setattr(trl_utils, KERNEL_NAME, original)


def active_capture() -> Capture | None:
    """The `Capture` of the `untempered_entropy` block in force, or None outside one."""
    kernel = getattr(trl_utils, KERNEL_NAME)
    return kernel.capture if isinstance(kernel, EntropyKernel) else None


def scored_positions(attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """(B, L-1) bool: the shifted positions TRL's fused forward scores (label != -100)."""
    scored = attention_mask[:, 1:].bool().clone()  # (B, L-1) label != -100 after the shift
    scored[:, : attention_mask.shape[1] - 1 - logits_to_keep] = False  # prompt labels are -100
    return scored


def completion_layout(flat: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """Scatter one fused-head call's per-token output back to (B, logits_to_keep), zero where not scored.

    TRL's fused forward scores the shifted positions whose label is not -100 (the completion tokens with
    attention 1), either compacted (Triton devices: only those positions) or for every position of
    ``(B, L - 1)`` (elsewhere); this undoes either layout exactly as TRL does for its own outputs.
    """
    batch, length = attention_mask.shape
    scored = scored_positions(attention_mask, logits_to_keep)  # (B, L-1)
    if flat.numel() == scored.numel():
        full = flat.reshape(batch, length - 1).masked_fill(~scored, 0)  # (B, L-1)
    elif flat.numel() == int(scored.sum()):
        full = flat.new_zeros(scored.shape).masked_scatter(scored, flat)  # (B, L-1)
    else:
        raise ValueError(
            f"fused LM head returned {flat.numel()} per-token values for a ({batch}, {length}) batch with "
            f"{int(scored.sum())} scored positions; the TRL version is not the one GTPO was written for (1.16)"
        )
    return full[:, -logits_to_keep:]  # (B, K)
