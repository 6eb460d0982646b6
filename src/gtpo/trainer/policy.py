"""The policy a training run starts from and ends with: load it (LoRA / 4-bit as TRL's ModelConfig says),
train it with a TRL trainer while the run folder records the outcome, save the final model.

`gtpo train` (GTPOTrainer) and `gtpo sft` (TRL's SFTTrainer) both go through :func:`train_policy`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gtpo.errors import UsageError, user_input

logger = logging.getLogger(__name__)


def check_model_name(model_args, script_name: str) -> None:
    """Fail before anything slow when the model is missing (ValueError naming the valid choices)."""
    from gtpo.models import OFFLINE_MODELS, model_problem, resolve_model

    if not model_args.model_name_or_path:
        raise UsageError(
            f"{script_name}: give model_name_or_path: a hub id, a local directory, or one of {list(OFFLINE_MODELS)}"
        )
    name = model_args.model_name_or_path
    if name not in OFFLINE_MODELS and not Path(resolve_model(name).path).exists() and (why := model_problem(name)):
        raise UsageError(
            f"model {name!r} is not a local folder and the hub cannot give it ({why}); give a hub id "
            f"such as 'Qwen/Qwen2.5-3B-Instruct' (cached, when offline), a local folder, or one of "
            f"{list(OFFLINE_MODELS)}"
        )


def load_policy(model_args, script_name: str):
    """Model and tokenizer for training; LoRA/4-bit as ModelConfig says. Fails early on a bad model name."""
    import torch
    from trl import get_quantization_config

    from gtpo.models import cpu_computes_bf16, load_model, load_tokenizer

    check_model_name(model_args, script_name)
    kwargs = {}
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if model_args.model_revision and model_args.model_revision != "main":
        kwargs["revision"] = model_args.model_revision
    quantization = get_quantization_config(model_args)
    if quantization is not None:
        from accelerate import PartialState

        kwargs["quantization_config"] = quantization
        kwargs["device_map"] = {"": PartialState().local_process_index}
    dtype = model_args.dtype
    if dtype == "auto":
        dtype = auto_dtype()
        logger.info("%s: dtype auto -> %s", script_name, str(dtype).removeprefix("torch."))
    if (
        str(dtype).removeprefix("torch.") == "bfloat16"
        and not torch.cuda.is_available()
        and cpu_computes_bf16() is False
    ):
        logger.warning(
            "%s: --dtype bfloat16 on a CPU without bfloat16 units (no AVX512-BF16 or AMX): torch computes it in "
            "software, about 10x slower than float32 here (a SmolLM2 step: 350 s against 26-55 s); pass --dtype "
            "float32 unless you need bf16's numbers",
            script_name,
        )
    model = load_model(model_args.model_name_or_path, dtype=dtype, **kwargs)
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    return model, tokenizer


def auto_dtype():
    """What ``dtype: auto`` trains in: bfloat16 where the hardware computes it (a CUDA GPU with bf16, a CPU with
    AVX512-BF16 or AMX units), else float32. On a CPU without bf16 units torch emulates bf16 in software, about
    10x slower than float32 (a SmolLM2 step: 350 s against 26-55 s on this project's AMD EPYC)."""
    import torch

    from gtpo.models import cpu_computes_bf16

    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_computes_bf16() else torch.float32


def save_final(trainer, tokenizer, run_dir: Path, base: str) -> Path:
    """Save the trained model (the LoRA adapter when PEFT is on), its tokenizer and its model card in
    ``run_dir/model``: an ordinary HF folder (:mod:`gtpo.trainer.artifact`).

    An adapter trained on an offline model names that model's cached folder as its base (``base_model_name_or_path``),
    so ``AutoPeftModelForCausalLM.from_pretrained(run_dir / "model")`` loads it offline, without gtpo.
    """
    from peft import PeftModel

    from gtpo.trainer import artifact

    final_dir = run_dir / "model"
    trainer.save_model(str(final_dir))
    if trainer.args.process_index == 0:
        tokenizer.save_pretrained(final_dir)
        adapter_config = final_dir / "adapter_config.json"
        if isinstance(trainer.model, PeftModel) and adapter_config.is_file():
            config = json.loads(adapter_config.read_text())
            config["base_model_name_or_path"] = artifact.adapter_base_for(base)
            adapter_config.write_text(json.dumps(config, indent=2))
        artifact.write_model_card(final_dir, run_dir, trainer, base, trainer.args.hub_model_id)
    return final_dir


def train_policy(
    trainer_class,
    dataset,
    training_args,
    model_args,
    run_dir: Path,
    script_name: str,
    prepare: Callable | None = None,
    **trainer_kwargs,
) -> dict:
    """Load the policy, build ``trainer_class`` on ``dataset``, train (resuming as ``training_args`` says)
    and save the final model in ``run_dir/model``; ``run.json`` ends finished, or failed with the error.

    ``prepare(trainer)`` runs before training (e.g. to attach a callback ahead of the loggers);
    ``trainer_kwargs`` go to the trainer (e.g. ``reward_funcs``). Returns {"model_dir": Path, "wall": seconds}.
    """
    from trl import get_peft_config

    from gtpo.runs.folder import recording_status, train
    from gtpo.runs.metrics_log import MetricsLogger

    # transformers' Trainer would create the hub repository now and upload the whole run folder at every save;
    # gtpo uploads model/ alone, once, after training (gtpo.trainer.artifact).
    push = training_args.push_to_hub
    training_args.push_to_hub = False
    with recording_status(run_dir, training_args.process_index == 0):
        with user_input():  # the model and the trainer's refusals of the settings given
            model, tokenizer = load_policy(model_args, script_name)
            trainer = trainer_class(
                model=model,
                **trainer_kwargs,
                args=training_args,
                train_dataset=dataset,
                processing_class=tokenizer,
                peft_config=get_peft_config(model_args),
                callbacks=[MetricsLogger(run_dir)],
            )
        if prepare is not None:
            prepare(trainer)
        start = time.time()
        train(trainer, training_args.resume_from_checkpoint)
        wall = time.time() - start
        model_dir = save_final(trainer, tokenizer, run_dir, model_args.model_name_or_path)
    training_args.push_to_hub = push
    if push and training_args.process_index == 0:
        from gtpo.trainer.artifact import push_model

        repo_id = training_args.hub_model_id or Path(run_dir).name
        push_model(
            model_dir,
            repo_id,
            token=training_args.hub_token,
            private=training_args.hub_private_repo,
            revision=training_args.hub_revision,
        )
        print(f"{script_name}: pushed {model_dir} to https://huggingface.co/{repo_id}")
    return {"model_dir": model_dir, "wall": wall}
