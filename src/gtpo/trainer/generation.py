"""Training's generation without waste: TRL's transformers path, with each distinct prompt prefilled once per
batch and a completion that has ended no longer computed (`gtpo.decoding.sampling.decode`).

TRL's `GRPOTrainer._generate_single_turn` samples with ``model.generate`` when neither vLLM nor continuous
batching is on: the G rows of a group each prefill the same prompt, and every row is run until the longest one
ends. `GTPOTrainer._generate_single_turn` calls :func:`generate_single_turn`, which replaces that one branch
inside the same contexts TRL opens
(``unwrap_model_for_generation`` with TRL's ``generation_kwargs``, ``torch.no_grad``, the FSDP parameter summon),
with the same generation config and logits processors `generate` would build from it, and returns what TRL
returns: each completion up to and including its first EOS (TRL's ``eos_token_ids``), or
``max_completion_length`` tokens, and no log-probabilities.

A float32 LoRA policy generates with its adapters folded into the base weights (`gtpo.decoding.sampling.merged_lora`:
the base tensors are put back untouched after), which changes the logits only by float rounding.

Sampling is `generate`'s: the softmax of the processed logits drawn by ``torch.multinomial`` on the global
generator (so ``seed`` repeats a run), the argmax when ``do_sample`` is off. The draws differ from `generate`'s
once a row has ended (fewer rows draw), the distribution does not.

Everything else goes to TRL's own method, with one log line saying why (:func:`generation_plan`): vLLM,
continuous batching, images, tools or environments, DeepSpeed/FSDP (their ranks must decode in lock-step),
a model whose ``generate`` is not transformers' own (patched, as TRL's own tests patch it, or overridden; PEFT's
wrapper is looked through to its base model), beam search or other decoding modes, stop strings, a processor that is
not row-wise, a model without a plain key/value cache, or the switch ``fast_generation=False``.

On a device with a step recorder (`gtpo.decoding.graph.graph_recorder`: CUDA) the fast path decodes with fixed shapes
and replays each step as a CUDA graph (`gtpo.decoding.graph.decode_static`, ``cuda_graph_generation``, on by default),
where the model's cache allows; the same :func:`generation_plan` decides it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerationMixin

from gtpo.decoding.graph import decode_static, graph_recorder, supports_fixed_decode
from gtpo.decoding.sampling import (
    ROW_WISE_PROCESSORS,
    decode,
    left_pad,
    merged_lora,
    multinomial_choice,
    supports_fast_decode,
)

logger = logging.getLogger(__name__)

# The GTPOConfig field that switches the fast path off (read with getattr until the config declares it).
SWITCH = "fast_generation"

# transformers' `generate` as defined, captured at import: a later patch of `GenerationMixin.generate` (TRL's own
# tests patch it with unittest.mock to return chosen completions) is seen by comparing with it.
TRANSFORMERS_GENERATE = GenerationMixin.generate


def _peft_generates() -> tuple:
    """PEFT's causal-LM wrapper class and its `generate` as defined at import, or (None, None) without PEFT."""
    try:
        from peft import PeftModel, PeftModelForCausalLM
    except ImportError:
        return None, None
    return PeftModel, PeftModelForCausalLM.generate


PEFT_MODEL, PEFT_GENERATE = _peft_generates()


def config_blocker(generation_config, eos_token_ids) -> str | None:
    """Why a (prepared) generation config cannot use `gtpo.decoding.sampling.decode`, or None."""
    from transformers.generation.configuration_utils import GenerationMode

    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH):
        return f"generation mode {mode.value}"
    if getattr(generation_config, "stop_strings", None):
        return "stop_strings"
    if getattr(generation_config, "max_time", None) is not None:
        return "max_time"
    if generation_config.max_new_tokens is None:
        return "no max_new_tokens"
    if generation_config.cache_implementation not in (None, "dynamic"):
        return f"cache_implementation={generation_config.cache_implementation!r}"
    eos = generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if set(eos) != set(eos_token_ids):
        return f"generation eos_token_id {eos} differs from the trainer's {list(eos_token_ids)}"
    return None


def processors_for(model, generation_config, prompt_ids: torch.Tensor, attention_mask: torch.Tensor):
    """`generate`'s generation config and logits processors for the left-padded ``prompt_ids`` (N, L) and their
    ``attention_mask`` (N, L), built by the model's own methods. Returns (config, processors, why they cannot
    be used, or None)."""
    from transformers import LogitsProcessorList

    config, _ = model._prepare_generation_config(generation_config)
    model._prepare_special_tokens(config, True, device=prompt_ids.device, batch_size=prompt_ids.shape[0])
    processors = model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=prompt_ids.shape[1],
        encoder_input_ids=prompt_ids,
        prefix_allowed_tokens_fn=None,
        logits_processor=LogitsProcessorList(),
        device=prompt_ids.device,
        model_kwargs={"attention_mask": attention_mask},
    )
    odd = [type(p).__name__ for p in processors if type(p).__name__ not in ROW_WISE_PROCESSORS]
    return config, processors, (f"logits processors {odd} are not row-wise" if odd else None)


def generate_blocker(model) -> str | None:
    """None when the ``generate`` TRL's transformers branch would call on ``model`` is transformers'
    `GenerationMixin.generate` as defined (through PEFT's `PeftModelForCausalLM.generate`, which calls its base
    model's), else why not (one line): the fast path replaces that very call, so it may only replace the original."""
    if PEFT_MODEL is not None and isinstance(model, PEFT_MODEL):
        if "generate" in vars(model) or getattr(type(model), "generate", None) is not PEFT_GENERATE:
            return f"{type(model).__name__}.generate is not PEFT's own (patched or overridden)"
        model = model.get_base_model()
    if "generate" in vars(model):
        return f"{type(model).__name__}.generate is patched on the instance"
    if getattr(type(model), "generate", None) is not TRANSFORMERS_GENERATE:
        return f"{type(model).__name__}.generate is not transformers' GenerationMixin.generate (patched or overridden)"
    return None


@dataclass(frozen=True)
class GenerationPlan:
    """How one batch is generated. ``trl_reason``: why TRL's own method generates (None: the fast path).
    ``recorder``: what records the fast path's fixed-shape steps (`gtpo.decoding.graph.decode_static`), or None for
    `gtpo.decoding.sampling.decode`. ``graph_note``: why graphs were wanted and not used (logged once), or None."""

    trl_reason: str | None
    recorder: object = None
    graph_note: str | None = None


def generation_plan(trainer, images=None, multimodal_fields=None, has_tool_images=False) -> GenerationPlan:
    """The one decision of how ``trainer`` generates a batch: TRL's path (and why), or the fast path, with CUDA
    graphs where ``cuda_graph_generation`` is on, the device has a recorder (`gtpo.decoding.graph.graph_recorder`:
    CUDA; a CPU runs `decode`, dropping ended rows) and the model's cache is all full-attention layers."""
    why = _trl_reason(trainer, images, multimodal_fields, has_tool_images)
    if why is not None:
        return GenerationPlan(why)
    if not getattr(trainer.args, "cuda_graph_generation", True):
        return GenerationPlan(None)
    model = trainer.accelerator.unwrap_model(trainer.model)
    recorder = graph_recorder(next(model.parameters()).device)
    if recorder is None:
        return GenerationPlan(None)
    unsupported = supports_fixed_decode(model)
    if unsupported is not None:
        return GenerationPlan(None, graph_note=unsupported)
    return GenerationPlan(None, recorder=recorder)


def fast_generation_blocker(trainer, images=None, multimodal_fields=None, has_tool_images=False) -> str | None:
    """Why ``trainer``'s generation must stay TRL's (one line), or None when the fast path applies
    (:func:`generation_plan`'s ``trl_reason``)."""
    return generation_plan(trainer, images, multimodal_fields, has_tool_images).trl_reason


def _trl_reason(trainer, images, multimodal_fields, has_tool_images) -> str | None:
    """Why ``trainer``'s generation must stay TRL's (one line), or None."""
    if not getattr(trainer.args, SWITCH, True):
        return f"{SWITCH}=False"
    if trainer.use_vllm:
        return "vLLM generates"
    if trainer.use_transformers_continuous_batching:
        return "use_transformers_continuous_batching"
    if images is not None or multimodal_fields or has_tool_images or getattr(trainer, "_is_vlm", False):
        return "vision inputs"
    if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None) is not None:
        return "tools or environments"
    if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False):
        return "DeepSpeed/FSDP ranks decode in lock-step"
    model = trainer.accelerator.unwrap_model(trainer.model)
    return (
        generate_blocker(model)
        or supports_fast_decode(model)
        or config_blocker(trainer.generation_config, trainer.eos_token_ids)
    )


def _log_once(trainer, message: str) -> None:
    """Log ``message`` the first time ``trainer`` meets it (each fallback is said once, not at every batch)."""
    seen = trainer.__dict__.setdefault("_gtpo_generation_fallbacks", set())
    if message not in seen:
        seen.add(message)
        logger.info(message)


def generate_single_turn(
    trainer, trl_generate, prompt_ids, images, multimodal_fields, num_generations, has_tool_images
):
    """`GRPOTrainer._generate_single_turn` for ``trainer``: the fast path where it applies, else ``trl_generate``
    (TRL's own method, bound) after one log line per reason. Returns (completion ids, log-probs or None)."""
    plan = generation_plan(trainer, images, multimodal_fields, has_tool_images)
    why = plan.trl_reason
    if why is None:
        if plan.graph_note is not None:
            _log_once(trainer, f"generation: cuda_graph_generation ignored ({plan.graph_note})")
        completion_ids, why = fast_generate(trainer, prompt_ids, plan.recorder)
        if why is None:
            return completion_ids, None
    _log_once(trainer, f"generation: TRL's path ({why})")
    return trl_generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)


def fast_generate(trainer, prompt_ids: list[list[int]], recorder=None) -> tuple[list[list[int]] | None, str | None]:
    """TRL's transformers branch through `gtpo.decoding.sampling.decode` (or, given a step ``recorder``,
    `gtpo.decoding.graph.decode_static` replaying recorded steps), in the contexts TRL opens. Returns (completion
    ids, None), or (None, why) when the config `generate` would prepare (the model's own generation defaults
    merged in) or one of its processors cannot be used (checked before any compute)."""
    from trl.extras.profiling import profiling_context
    from trl.models import unwrap_model_for_generation

    pad = trainer._tokenizer.pad_token_id
    with (
        profiling_context(trainer, "transformers.generate"),
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
    ):
        device = next(model.parameters()).device
        padded, mask = left_pad(prompt_ids, pad, trainer.pad_to_multiple_of)
        config, processors, why = processors_for(model, trainer.generation_config, padded.to(device), mask.to(device))
        why = why or config_blocker(config, trainer.eos_token_ids)  # the model's own defaults merged in
        if why is not None:
            return None, why
        common = dict(processors=processors, pad_to_multiple_of=trainer.pad_to_multiple_of)
        if recorder is not None:  # generation_plan chose fixed shapes with recorded steps (CUDA graphs)
            common["recorder"] = recorder
        with merged_lora(model):
            completions = (decode_static if recorder is not None else decode)(
                model,
                prompt_ids,
                multinomial_choice(bool(config.do_sample)),
                int(config.max_new_tokens),
                trainer.eos_token_ids,
                pad,
                **common,
            )
    return completions, None
