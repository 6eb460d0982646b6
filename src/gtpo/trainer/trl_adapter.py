"""TRL behind one adapter: the TRL names gtpo's trainer relies on, imported here and checked at import.

gtpo pins ``trl==1.16.*``. It reaches into TRL's private machinery in a few places: GRPOTrainer's private hooks it
overrides and the trainer module's optional imports (here), and the fused LM head's kernel, tile sizes and the Triton
kernel module's helpers (`gtpo.forward.trl_head`, the forward's own door, which checks its names when it is
imported). Every such name is listed once, and :func:`check` verifies, when gtpo's trainer is imported, that each
exists, the forward's included (and that each overridden hook has the parameters gtpo's override assumes): a TRL
outside the pin fails then, in one line naming the first missing piece and the supported versions, not deep inside a
training step. The other trainer modules take the trainer module from here (``trl_grpo``).
"""

from __future__ import annotations

import inspect
from types import ModuleType

import trl.trainer.grpo_trainer as trl_grpo

from gtpo.forward import trl_head

# Module-level names gtpo reads or patches, by module (the module object is passed to `check`): the forward's, and
# the trainer module's optional imports the completion record's wandb/trackio tables go through.
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {**trl_head.PRIVATE_NAMES, "trl.trainer.grpo_trainer": ("pd",)}

# GRPOTrainer's private hooks that GTPOTrainer overrides or calls, with the parameters gtpo's code assumes.
HOOKS: dict[str, str] = {
    "_generate_and_score_completions": "self, inputs",
    "_compute_loss": "self, model, inputs",
    "_get_per_token_logps_and_entropies": (
        "self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, "
        "pixel_values, image_grid_thw, num_images, pixel_attention_mask, spatial_shapes, num_tiles, image_sizes, "
        "token_type_ids, mm_token_type_ids, image_position_ids"
    ),
    "_prepare_inputs": "self, generation_batch",
    "_generate_single_turn": "self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images",
    "_save_checkpoint": "self, model, trial",
    "_load_optimizer_and_scheduler": "self, checkpoint",
    "log": "self, logs, start_time",
    "get_gamma_weights": (
        "advantages, log_ratio_per_token, mask, importance_sampling_ratio, k_pos, lambda_pos, k_neg, lambda_neg"
    ),
}


def _modules() -> dict[str, ModuleType]:
    return {**trl_head.modules(), "trl.trainer.grpo_trainer": trl_grpo}


def problem(modules: dict | None = None, trainer_class=None, version: str | None = None) -> str | None:
    """What in the installed TRL differs from what gtpo relies on (one phrase), or None.

    Args:
        modules: module name -> module (default: the imported TRL modules); tests pass stand-ins.
        trainer_class: the class whose hooks are checked (default TRL's GRPOTrainer).
        version: the TRL version named in the message (default ``trl.__version__``).
    """
    modules = _modules() if modules is None else modules
    found = trl_head.missing(PRIVATE_NAMES, modules)
    if found is not None:
        return found
    cls = trl_grpo.GRPOTrainer if trainer_class is None else trainer_class
    for hook, expected in HOOKS.items():
        method = getattr(cls, hook, None)
        if method is None:
            return f"GRPOTrainer.{hook} is missing"
        params = ", ".join(inspect.signature(method).parameters)
        if params != expected:
            return f"GRPOTrainer.{hook}({params}) is not ({expected})"
    return None


def check(modules: dict | None = None, trainer_class=None, version: str | None = None) -> None:
    """Raise ImportError, in one line, if :func:`problem` finds anything."""
    found = problem(modules, trainer_class)
    if found is not None:
        raise trl_head.unsupported(found, version)


check()
