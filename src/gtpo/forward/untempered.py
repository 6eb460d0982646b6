"""Temperature-1 entropy from the forward pass TRL already runs (Sec. 4.2, Eq. 6-7), no second model forward.

TRL scores completions with a fused LM head (`trl.trainer.utils.add_fused_lm_head`): the backbone's hidden
states go through `ChunkedLogProbFunction`, which divides the logits by the sampling `temperature` before
its softmax, so its entropies are those of the *tempered* distribution. The paper's H is the entropy of the
model's own next-token distribution (Sec. 4.2), and the authors' code computes it from untempered logits.

`untempered_entropy(...)` is a context manager that, for the calls made inside it, replaces that kernel with
:func:`gtpo.forward.lm_head.token_scores`, which folds each logit tile at both temperatures: the log-probs
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

from gtpo.forward import lm_head, trl_head

KERNEL_NAME = trl_head.KERNEL_NAME  # where TRL's fused forward finds its kernel (the patch's place)


@dataclass
class Capture:
    """What the wrapped kernel saw: the tempered entropy of each call, as TRL's kernel returned it."""

    sampling: list[torch.Tensor] = field(default_factory=list)


class EntropyPolicy:
    """What `trl_head.HeadPatch` asks of the head for GTPO: the temperature-1 entropy (and, for `authors_code`,
    log-probs at temperature 1 and a clamped entropy), from one projection per tile (`lm_head.token_scores`)."""

    def __init__(
        self, capture: Capture, differentiable: bool, logprobs_at_one: bool = False, entropy_clamp: float | None = None
    ):
        self.capture, self.differentiable = capture, differentiable
        # GTPOConfig.logprob_temperature="model" and entropy_clamp (authors_code): log-probs at temperature 1 whatever
        # the sampling temperature, and H with p clamped inside the log, as the authors' code computes them.
        self.logprobs_at_one, self.entropy_clamp = logprobs_at_one, entropy_clamp

    def apply(
        self, kernel, hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0,
        outputs=("log_probs", "entropy"),
    ):  # fmt: skip
        if "entropy" not in outputs or set(outputs) - {"log_probs", "entropy"}:
            # Nothing to replace, or fields the single-pass head does not compute: TRL's kernel as is.
            return kernel.apply(hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale, outputs)
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
        self.capture.sampling.append(scores.sampling_entropy)  # (n,) the rows projected: the consumers lay it out
        return (scores.log_probs, entropy, None, None, None)


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
    `GTPOConfig.logprob_temperature="model"` and `entropy_clamp` (the authors' code's arithmetic). The one patch of
    TRL's kernel is `trl_head.HeadPatch`, which the packed layout configures too.
    """
    capture = Capture()
    if not enabled:
        yield capture
        return
    with trl_head.fused_head() as head:
        saved = head.entropy, head.scored
        head.entropy = EntropyPolicy(capture, differentiable, logprobs_at_one, entropy_clamp)
        head.scored = None if scored is None else scored.reshape(-1)  # (B * (L-1),) positions with a label
        try:
            yield capture
        finally:
            head.entropy, head.scored = saved


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
