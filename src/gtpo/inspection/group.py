"""``gtpo inspect``: one group of completions through GTPO's eyes (the paper's Fig. 9 on your own model).

It samples G completions of one prompt (or reads a recorded group), grades them with the project's
rewards, computes the advantages as training does (TRL's ``scale_rewards``), the forward and backward
conflict spans (Sec. 5.1), λ under ``union`` and ``product`` (Eq. 5/21), the per-token entropy at
temperature 1 (Sec. 4.2), ⟨H⟩_i and δ_i (Eq. 6), and A'_i = δ_i(A_i − γ⟨H⟩_i) (Eq. 7). Rendering (terminal,
PNG, JSON) lives in ``gtpo.inspection.render``; the command in ``gtpo.cli.inspect``. Usage: docs/inspect.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from gtpo import core
from gtpo.core import paper
from gtpo.errors import InvalidInput

logger = logging.getLogger(__name__)

SCALE_REWARDS = ("group", "batch", "none")
# Recipe keys that `gtpo inspect` takes from a training recipe (the flags of the same meaning win).
RECIPE_KEYS = {
    "model_name_or_path": "model",
    "task": "task",
    "split": "split",
    "source": "source",
    "column_map": "column_map",
    "few_shot": "few_shot",
    "num_generations": "num_generations",
    "temperature": "temperature",
    "max_completion_length": "max_completion_length",
    "scale_rewards": "scale_rewards",
    "reward_funcs": "reward_funcs",
    "conflict_combine": "combine",
    "conflict_positive_weight": "positive_weight",
    "conflict_guard": "guard",
    "entropy_filter": "entropy_filter",
    "entropy_threshold": "entropy_threshold",
    "entropy_gamma": "gamma",
    "initial_entropy": "initial_entropy",
    "dtype": "dtype",
    "top_p": "top_p",
    "top_k": "top_k",
}
DEFAULTS = dict(
    model="smollm2",
    task="synthetic",
    split="train",
    source=None,
    column_map=None,
    few_shot=None,
    num_generations=8,
    temperature=1.0,
    max_completion_length=96,
    scale_rewards="group",
    reward_funcs=["format", "accuracy"],
    combine="union",
    positive_weight=paper.POSITIVE_WEIGHT,
    guard=False,
    entropy_filter="auto",
    entropy_threshold=paper.ENTROPY_THRESHOLD,
    gamma=paper.GAMMA,
    initial_entropy=None,
    dtype="float32",
    top_p=1.0,
    top_k=0,
)


def group_advantages(rewards: Tensor, scale_rewards: str = "group") -> Tensor:
    """A_i of one group as TRL 1.16 computes them (Eq. 8): R_i − mean(R), divided by (std(R) + 1e-4)
    unless ``scale_rewards="none"`` (the authors' code); with one group ``group`` and ``batch`` coincide, so both
    are :func:`gtpo.core.group_advantages` with ``scale="group"``.

    Args:
        rewards: (G,) one group's rewards.
        scale_rewards: TRL's ``scale_rewards``: "group", "batch" or "none".

    Returns:
        (G,) float32 advantages.

    >>> group_advantages(torch.tensor([20.0, 0.0]), "none").tolist()
    [10.0, -10.0]
    """
    if scale_rewards not in SCALE_REWARDS:
        raise InvalidInput(f"scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale_rewards!r}")
    rewards = rewards.float()  # (G,)
    return core.group_advantages(rewards, rewards.numel(), scale="none" if scale_rewards == "none" else "group")


@dataclass
class GroupAnalysis:
    """Everything `gtpo inspect` shows about one group of G completions (rows), T positions."""

    rewards: Tensor  # (G,)
    advantages: Tensor  # (G,) A_i, before any entropy shift
    forward: Tensor  # (G, T) bool M^fw
    backward: Tensor  # (G, T) bool M^bw
    lambda_union: Tensor  # (G, T)
    lambda_product: Tensor  # (G, T)
    lambda_guard: Tensor  # (G, T) the stall guard's λ (conflict_guard)
    mask: Tensor  # (G, T) bool valid tokens
    token_entropy: Tensor | None = None  # (G, T) nats, temperature 1
    mean_entropy: Tensor | None = None  # (G,) ⟨H⟩_i
    delta: Tensor | None = None  # (G,) bool δ_i
    shifted: Tensor | None = None  # (G,) A'_i
    initial_entropy: float | None = None


def analyse_group(
    completion_ids: Tensor,
    completion_mask: Tensor,
    rewards: Tensor,
    *,
    scale_rewards: str = "group",
    positive_weight: float = paper.POSITIVE_WEIGHT,
    token_entropy: Tensor | None = None,
    entropy_filter: str = "auto",
    entropy_threshold: float = paper.ENTROPY_THRESHOLD,
    initial_entropy: float | None = None,
    gamma: float = paper.GAMMA,
) -> GroupAnalysis:
    """Advantages, spans, λ (union, product and the stall guard's) and, given per-token entropies, ⟨H⟩_i, δ_i and A'_i.

    ``initial_entropy`` (⟨H⟩_ini of Eq. 6) defaults to the group's own mean ⟨H⟩ when the filter needs it.
    """
    mask = completion_mask.bool()  # (G, T)
    g = completion_ids.shape[0]
    if rewards.shape != (g,):
        raise InvalidInput(f"{g} completions but {tuple(rewards.shape)[0] if rewards.dim() else 1} rewards")
    advantages = group_advantages(rewards, scale_rewards)  # (G,)
    forward, backward = core.conflict_spans(completion_ids, mask, advantages, g)  # (G, T) each
    result = GroupAnalysis(
        rewards=rewards.float(),
        advantages=advantages,
        forward=forward,
        backward=backward,
        lambda_union=core.conflict_weights(forward, backward, advantages, positive_weight, "union"),
        lambda_product=core.conflict_weights(forward, backward, advantages, positive_weight, "product"),
        lambda_guard=core.conflict_weights(
            forward,
            backward,
            advantages,
            group_size=g,
            contested=core.contested_tokens(completion_ids, mask, advantages, g, forward, backward),
        ),
        mask=mask,
    )
    if token_entropy is not None:
        mean = core.mean_completion_entropy(token_entropy, mask)  # (G,)
        needs = getattr(core.ENTROPY_FILTERS.get(entropy_filter), "needs_initial_entropy", False)  # unknown: core says
        if initial_entropy is None and needs:
            initial_entropy = float(mean.mean())  # a stand-in: training measures it on 100 prompts
        delta = core.entropy_keep_mask(
            mean, advantages, mode=entropy_filter, threshold=entropy_threshold, initial_entropy=initial_entropy
        )  # (G,)
        result.token_entropy = torch.where(mask, token_entropy.float(), 0.0)
        result.mean_entropy, result.delta, result.initial_entropy = mean, delta, initial_entropy
        result.shifted = core.shift_advantages(advantages, mean, delta, gamma)  # (G,)
    return result


# ---------------------------------------------------------------------------------------------- the model


def prompt_ids(tokenizer, prompt) -> list[int]:
    """Token ids of a prompt as TRL builds them: chat template with the generation prompt for a list of
    messages, the plain text for a string."""
    if isinstance(prompt, list):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    else:
        text = prompt
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sample_completions(
    model,
    tokenizer,
    prompt,
    *,
    num_generations: int,
    temperature: float,
    max_completion_length: int,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
):
    """G sampled completions: (prompt_ids (P,), completion_ids (G, T), mask (G, T) up to the first EOS)."""
    ids = torch.tensor([prompt_ids(tokenizer, prompt)])  # (1, P)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_new_tokens=max_completion_length,
            num_return_sequences=num_generations,
            pad_token_id=tokenizer.pad_token_id,
        )
    completion = out[:, ids.shape[1] :]  # (G, T)
    return ids[0], completion, _mask_after_eos(completion, tokenizer.eos_token_id)


def _mask_after_eos(completion: Tensor, eos_id: int | None) -> Tensor:
    # As TRL: valid up to and including the first EOS; everything after is padding.
    if eos_id is None:
        return torch.ones_like(completion, dtype=torch.bool)
    is_eos = completion == eos_id  # (G, T)
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion.shape[1])  # (G,)
    return torch.arange(completion.shape[1]) <= first.unsqueeze(1)  # (G, T)


def tokenize_completions(tokenizer, texts: list[str], append_eos: bool = True):
    """A recorded group's completion texts as (G, T) ids and mask; EOS appended, as a terminated
    completion ends in training."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    if append_eos and tokenizer.eos_token_id is not None:
        rows = [r + [tokenizer.eos_token_id] for r in rows]
    t = max(1, max(len(r) for r in rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([r + [pad] * (t - len(r)) for r in rows])  # (G, T)
    mask = torch.tensor([[True] * len(r) + [False] * (t - len(r)) for r in rows])  # (G, T)
    return ids, mask


def completion_entropy(model, prompt: Tensor, completion: Tensor, mask: Tensor) -> Tensor:
    """(G, T) entropy in nats of the model's own next-token distribution at each completion token,
    at temperature 1 (Sec. 4.2: untempered logits, whatever the sampling temperature).

    Computed as training computes it: the backbone's hidden states through TRL's fused LM head with GTPO's
    single-pass head in place (`gtpo.forward.untempered`, `gtpo.forward.lm_head.token_scores`), so a change to
    that function changes `gtpo inspect` too. No (T, V) logits are materialised.
    """
    from trl.trainer.utils import add_fused_lm_head

    from gtpo.forward import untempered

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "_gtpo_fused_lm_head", False):
        add_fused_lm_head(base, temperature=1.0, outputs=("log_probs", "entropy"))  # as GRPOTrainer patches it
        base._gtpo_fused_lm_head = True
    rows = []
    p = prompt.shape[0]
    with torch.no_grad(), untempered.untempered_entropy(True):
        for ids, valid in zip(completion, mask, strict=False):
            n = int(valid.sum())
            full = torch.cat([prompt, ids[:n]]).unsqueeze(0)  # (1, P+n)
            labels = full.clone()
            labels[:, :p] = -100  # score the completion only, as TRL does
            entropy = model(input_ids=full, labels=labels, fused_lm_head=True).entropy  # (1, P+n-1)
            h = torch.zeros(completion.shape[1])
            h[:n] = entropy[0, p - 1 : p - 1 + n]  # position t predicts token t
            rows.append(h)
    return torch.stack(rows)  # (G, T)


def grade(reward_names: list[str], texts: list[str], prompt, answer) -> tuple[Tensor, dict[str, list[float]]]:
    """Total reward per completion (sum over reward functions, TRL's default weights of 1) and each part."""
    from gtpo.tasks import get_reward_funcs

    conversational = isinstance(prompt, list)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    parts = {}
    for name, fn in zip(reward_names, get_reward_funcs(reward_names), strict=False):
        parts[name] = [float(r) for r in fn(completions, answer=[answer] * len(texts), prompts=[prompt] * len(texts))]
    return torch.tensor([sum(p[i] for p in parts.values()) for i in range(len(texts))]), parts
