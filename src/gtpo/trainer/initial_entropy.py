"""⟨H⟩_ini (Eq. 6): the policy's mean completion entropy before training, measured once and kept.

The measurement samples one completion for each of the first N training prompts through TRL's own
generation entry point (`GRPOTrainer._generate`: a `rollout_func`, vLLM, paged/continuous batching or
transformers generation, with the training sampling settings), drops truncated completions when
`mask_truncated_completions` is set (as TRL does for the loss), scores them with the same fused forward
the loss uses (so ⟨H⟩_ini and the per-completion ⟨H⟩_i are the same quantity: temperature-1 entropy by
default, see `gtpo.forward.untempered`), and averages ⟨H⟩_i over the completions. The model is in eval mode for
the measurement (no dropout: ⟨H⟩_ini is a property of the initial policy, not of a dropout draw) and back
in its previous mode after. Generation runs with one completion per prompt (`num_generations` is 1 for
the call) and the generation metrics it logs are discarded. Prompts are spread over ranks; each rank runs
the same number of batches so that collective generation (vLLM server, ZeRO-3) stays in step. The CPU and
CUDA RNGs are forked, so with transformers generation on CPU/CUDA measuring leaves the training samples
exactly as if ⟨H⟩_ini had been given in the config (not so with a vLLM server, which samples in its own
process, or other accelerators' RNGs).

The value lives in `gtpo_state.json` in every checkpoint and is read back on resume.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os

import torch

from gtpo import core
from gtpo.forward import untempered

logger = logging.getLogger(__name__)

STATE_FILE = "gtpo_state.json"


def first_rows(dataset, n: int) -> list[dict]:
    """The dataset's first `n` rows, in dataset order (not the shuffled training order)."""
    if hasattr(dataset, "select") and hasattr(dataset, "__len__"):
        return list(dataset.select(range(min(n, len(dataset)))))
    return list(itertools.islice(iter(dataset), n))  # IterableDataset


def first_prompts(dataset, n: int) -> list:
    """The `prompt` of the dataset's first `n` rows, in dataset order."""
    return [row["prompt"] for row in first_rows(dataset, n)]


@contextlib.contextmanager
def _measuring(trainer):
    """Eval mode, one completion per prompt, and TRL's generation metrics restored afterwards."""
    model = trainer.model
    was_training = model.training
    saved_metrics = {mode: {k: list(v) for k, v in values.items()} for mode, values in trainer._metrics.items()}
    saved_counts = {name: getattr(trainer, name) for name in ("num_generations", "num_generations_eval")}
    tokens_seen = trainer.state.num_input_tokens_seen
    model.eval()
    try:
        for name in saved_counts:
            setattr(trainer, name, 1)
        yield
    finally:
        for name, value in saved_counts.items():
            setattr(trainer, name, value)
        for mode, values in trainer._metrics.items():
            values.clear()
            values.update(saved_metrics.get(mode, {}))
        trainer.state.num_input_tokens_seen = tokens_seen
        model.train(was_training)


def _images(rows: list[dict]):
    """The rows' images as TRL's `_generate_and_score_completions` reads them (None for text-only data)."""
    if "images" in rows[0]:
        images = [row.get("images") for row in rows]
    elif "image" in rows[0]:
        images = [[row["image"]] if row.get("image") is not None else None for row in rows]
    else:
        return None
    return None if all(not imgs for imgs in images) else images


def _multimodal_kwargs(trainer, prompts, images, completion_len: int) -> dict:
    """Forward inputs of a vision-language batch, built as TRL's `_generate_and_score_completions` builds them."""
    from trl.data_utils import apply_chat_template

    texts = [
        apply_chat_template({"prompt": p}, trainer.processing_class, **trainer.chat_template_kwargs)["prompt"]
        for p in prompts
    ]
    inputs = trainer.processing_class(images=images, text=texts, padding=True, return_tensors="pt")
    inputs = {
        k: v.to(trainer.accelerator.device) for k, v in inputs.items() if k not in ("input_ids", "attention_mask")
    }
    for key in ("token_type_ids", "mm_token_type_ids"):  # zeros over the completion, as TRL
        if key in inputs:
            inputs[key] = torch.cat([inputs[key], inputs[key].new_zeros(len(prompts), completion_len)], dim=1)
    inputs["num_images"] = [len(imgs) if imgs else 0 for imgs in images]
    return inputs


@torch.no_grad()
def measure_initial_entropy(trainer, rows: list) -> float:
    """Mean over the completions sampled for `rows` of ⟨H⟩_i (token-mean entropy of a completion), in nats.

    `rows` are dataset rows (dicts with a `prompt`, and `image`/`images` for vision-language data), or bare
    prompts.
    """
    from trl.data_utils import prepare_multimodal_messages
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import pad

    if not rows:
        raise ValueError("cannot measure ⟨H⟩_ini: the training dataset has no rows; set GTPOConfig.initial_entropy.")
    rows = [row if isinstance(row, dict) else {"prompt": row} for row in rows]
    accelerator = trainer.accelerator
    device = accelerator.device
    n, world, rank = len(rows), accelerator.num_processes, accelerator.process_index
    # Every call to the generation entry point gets the row count of a training generation batch
    # (per_device_train_batch_size × steps_per_generation), since a rollout_func may assume it: each rank
    # takes prompts rank, rank + world, ... up to whole calls; indices past n repeat earlier prompts with
    # weight 0, so every call is full and all ranks run the same collective calls. (Training's rows hold
    # each prompt G times; here each prompt once, which is what Eq. 6's mean over prompts needs.)
    chunk = max(1, trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation)
    per_rank = math.ceil(math.ceil(n / world) / chunk) * chunk
    indices = [rank + world * j for j in range(per_rank)]
    pad_id = trainer._tokenizer.pad_token_id
    stop_ids = [*trainer.eos_token_ids, pad_id]
    untempered_on = bool(getattr(trainer.args, "untempered_entropy", False))

    # [Σ ⟨H⟩_i, count] over the completions that count, then the same over every non-empty completion: the
    # fallback when mask_truncated_completions masks them all (then the loss is 0 too, but Eq. 6 needs a value).
    total = torch.zeros(4, device=device, dtype=torch.float64)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), _measuring(trainer):
        for start in range(0, per_rank, chunk):
            batch_idx = indices[start : start + chunk]
            batch = [rows[i % n] for i in batch_idx]
            prompts = [row["prompt"] for row in batch]
            images = _images(batch)
            if images is not None:
                pairs = zip(prompts, images, strict=False)
                prompts = [prepare_multimodal_messages(p, images=imgs) for p, imgs in pairs]
            # TRL's generation entry point, as in training (rollout_func, vLLM, paged generation).
            prompt_ids, completion_ids, *_ = trainer._generate(prompts)
            if len(completion_ids) % len(batch):
                raise ValueError(
                    f"generation returned {len(completion_ids)} completions for {len(batch)} prompts; "
                    "⟨H⟩_ini needs the same number per prompt (set GTPOConfig.initial_entropy)"
                )
            per_prompt = len(completion_ids) // len(batch)
            trainer.model.eval()  # TRL's continuous-batching path switches the model back to train mode

            prompt_t = [torch.tensor(ids) for ids in prompt_ids]
            completion_t = [torch.tensor(ids if len(ids) else [pad_id]) for ids in completion_ids]
            p_ids = pad(prompt_t, padding_value=pad_id, padding_side="left").to(device)
            p_mask = pad([torch.ones_like(t) for t in prompt_t], padding_value=0, padding_side="left").to(device)
            c_ids = pad(completion_t, padding_value=pad_id, padding_side="right").to(device)
            # An empty completion has no ⟨H⟩_i; a truncated one is masked out when TRL masks it for the loss.
            kept = [
                len(ids) > 0 and not (trainer.mask_truncated_completions and ids[-1] not in stop_ids)
                for ids in completion_ids
            ]
            # Every non-empty completion is scored (the fallback below needs the truncated ones); `kept` weighs.
            c_mask = pad(
                [torch.full((max(len(ids), 1),), int(len(ids) > 0)) for ids in completion_ids],
                padding_value=0,
                padding_side="right",
            ).to(device)
            forward_kwargs = {}
            if images is not None:
                forward_kwargs = _multimodal_kwargs(trainer, prompts, images, c_ids.size(1))
            with (
                disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs),
                untempered.untempered_entropy(untempered_on),
            ):
                _, entropies, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model,
                    torch.cat([p_ids, c_ids], dim=1),
                    torch.cat([p_mask, c_mask], dim=1),
                    c_ids.size(1),
                    batch_size=trainer.args.per_device_train_batch_size,
                    compute_entropy=True,
                    **forward_kwargs,
                )
            mean_h = core.mean_completion_entropy(entropies.float(), c_mask)  # (B,)
            weight = torch.tensor(
                [float(i < n) for i in batch_idx for _ in range(per_prompt)], device=device, dtype=torch.float64
            )
            nonempty = weight * torch.tensor(
                [len(ids) > 0 for ids in completion_ids], device=device, dtype=torch.float64
            )
            weight = weight * torch.tensor(kept, device=device, dtype=torch.float64)
            total += torch.stack(
                [(mean_h.double() * weight).sum(), weight.sum(), (mean_h.double() * nonempty).sum(), nonempty.sum()]
            )
    total = accelerator.reduce(total, reduction="sum")
    if total[1] == 0 and total[3] > 0:
        logger.warning(
            "⟨H⟩_ini: every sampled completion was truncated and mask_truncated_completions masks them; "
            "measured over the %d truncated completions instead (raise max_completion_length, or set "
            "GTPOConfig.initial_entropy)",
            int(total[3]),
        )
        return float(total[2] / total[3])
    if total[1] == 0:
        raise ValueError("cannot measure ⟨H⟩_ini: every sampled completion was empty; set GTPOConfig.initial_entropy.")
    return float(total[0] / total[1])


def measure_before_first_step(trainer) -> None:
    """⟨H⟩_ini of Eq. 6 for a `GTPOTrainer` about to take its first step: measured on its first
    ``initial_entropy_prompts`` training prompts, stored on the trainer with where it came from, and logged."""
    n = trainer.args.initial_entropy_prompts
    if trainer.train_dataset is None:
        raise ValueError(
            "⟨H⟩_ini is measured on training prompts, but there is no train_dataset; set "
            "GTPOConfig.initial_entropy, or entropy_filter to a mode other than 'auto'"
        )
    prompts = first_rows(trainer.train_dataset, n)
    if len(prompts) < n:
        logger.warning(
            "⟨H⟩_ini: the training set has %d prompts, fewer than initial_entropy_prompts=%d", len(prompts), n
        )
    trainer.initial_entropy = measure_initial_entropy(trainer, prompts)
    trainer._initial_entropy_source = "measured"
    trainer._initial_entropy_prompts = len(prompts)
    active = trainer.initial_entropy < core.LN2  # Eq. 6's gate (core.entropy_keep_mask, mode "auto")
    logger.info(
        "⟨H⟩_ini = %.4f nats on the first %d training prompts: the entropy filter (Eq. 6) is %s",
        trainer.initial_entropy,
        len(prompts),
        "on" if active else "off",
    )


def save_state(directory: str, state: dict) -> None:
    """Write GTPO's trainer state (⟨H⟩_ini and how it was obtained) beside a checkpoint.

    Atomic (temporary file, then rename), so a kill leaves the whole file or none; the trainer writes it
    before Trainer's own files, whose last, trainer_state.json, marks a checkpoint complete (gtpo.runs.folder).
    """
    path = os.path.join(directory, STATE_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(state, f, indent=2)
    os.replace(path + ".tmp", path)


def load_state(directory: str) -> dict | None:
    """GTPO's state from a checkpoint directory, or None when the checkpoint has none."""
    path = os.path.join(directory, STATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)
