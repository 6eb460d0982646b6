"""⟨H⟩_ini (Eq. 6): the policy's mean completion entropy before training, measured once and kept.

The measurement samples one completion for each of the first N training prompts with the trainer's own
generation path (transformers or vLLM, same sampling settings as training), scores it with the same
fused forward the loss uses (so ⟨H⟩_ini and the per-completion ⟨H⟩_i are on the same scale, including
the sampling temperature), and averages ⟨H⟩_i over the N completions. Prompts are spread over ranks;
each rank runs the same number of batches so that collective generation (vLLM server, ZeRO-3) stays
in step. The CPU and CUDA RNGs are forked, so with transformers generation on CPU/CUDA measuring
leaves the training samples exactly as if ⟨H⟩_ini had been given in the config (not so with a vLLM
server, which samples in its own process, or other accelerators' RNGs).

The value lives in `gtpo_state.json` in every checkpoint and is read back on resume.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os

import torch

from gtpo import core, untempered

logger = logging.getLogger(__name__)

STATE_FILE = "gtpo_state.json"


def first_prompts(dataset, n: int) -> list:
    """The `prompt` of the dataset's first `n` rows, in dataset order (not the shuffled training order)."""
    if hasattr(dataset, "select") and hasattr(dataset, "__len__"):
        rows = dataset.select(range(min(n, len(dataset))))
    else:  # IterableDataset
        rows = itertools.islice(iter(dataset), n)
    return [row["prompt"] for row in rows]


@torch.no_grad()
def measure_initial_entropy(trainer, prompts: list) -> float:
    """Mean over `prompts` of ⟨H⟩_i, the token-mean entropy of one sampled completion per prompt, in nats."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import pad

    if not prompts:
        raise ValueError("cannot measure ⟨H⟩_ini: the training dataset has no rows; set GTPOConfig.initial_entropy.")
    if getattr(trainer, "_is_vlm", False):
        raise ValueError(
            "measuring ⟨H⟩_ini supports text-only models; set GTPOConfig.initial_entropy for a vision-language model."
        )
    accelerator = trainer.accelerator
    device = accelerator.device
    n, world, rank = len(prompts), accelerator.num_processes, accelerator.process_index
    per_rank = math.ceil(n / world)
    # Every rank takes `per_rank` prompts; indices past n repeat earlier prompts and get weight 0, so that
    # all ranks run the same collective calls.
    indices = [rank * per_rank + j for j in range(per_rank)]
    chunk = max(1, trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation)
    pad_id = trainer._tokenizer.pad_token_id

    total = torch.zeros(2, device=device, dtype=torch.float64)  # [Σ ⟨H⟩_i, count]
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for start in range(0, per_rank, chunk):
            batch_idx = indices[start : start + chunk]
            batch = [prompts[i % n] for i in batch_idx]
            prompt_ids, images, multimodal_fields = trainer._tokenize_prompts(batch)
            completion_ids, _ = trainer._generate_single_turn(prompt_ids, images, multimodal_fields, 1)

            prompt_t = [torch.tensor(ids) for ids in prompt_ids]
            completion_t = [torch.tensor(ids if len(ids) else [pad_id]) for ids in completion_ids]
            p_ids = pad(prompt_t, padding_value=pad_id, padding_side="left").to(device)
            p_mask = pad([torch.ones_like(t) for t in prompt_t], padding_value=0, padding_side="left").to(device)
            c_ids = pad(completion_t, padding_value=pad_id, padding_side="right").to(device)
            c_mask = pad(
                [torch.full((max(len(ids), 1),), int(len(ids) > 0)) for ids in completion_ids],
                padding_value=0,
                padding_side="right",
            ).to(device)
            untempered_on = bool(getattr(trainer.args, "untempered_entropy", False))
            with disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs), \
                    untempered.untempered_entropy(untempered_on):
                _, entropies, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model,
                    torch.cat([p_ids, c_ids], dim=1),
                    torch.cat([p_mask, c_mask], dim=1),
                    c_ids.size(1),
                    batch_size=trainer.args.per_device_train_batch_size,
                    compute_entropy=True,
                )
            mean_h = core.mean_completion_entropy(entropies.float(), c_mask)  # (B,)
            weight = torch.tensor([float(i < n) for i in batch_idx], device=device, dtype=torch.float64)
            weight = weight * (c_mask.sum(-1) > 0).to(torch.float64)  # an empty completion has no ⟨H⟩_i
            total += torch.stack([(mean_h.double() * weight).sum(), weight.sum()])
    total = accelerator.reduce(total, reduction="sum")
    if total[1] == 0:
        raise ValueError("cannot measure ⟨H⟩_ini: every sampled completion was empty; set GTPOConfig.initial_entropy.")
    return float(total[0] / total[1])


def save_state(directory: str, state: dict) -> None:
    """Write GTPO's trainer state (⟨H⟩_ini and how it was obtained) beside a checkpoint."""
    with open(os.path.join(directory, STATE_FILE), "w") as f:
        json.dump(state, f, indent=2)


def load_state(directory: str) -> dict | None:
    """GTPO's state from a checkpoint directory, or None when the checkpoint has none."""
    path = os.path.join(directory, STATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)
