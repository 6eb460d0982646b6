"""TRL behind one adapter: the TRL modules whose private names gtpo relies on, imported here and checked at import.

gtpo pins ``trl==1.16.*``. It reaches into TRL's private machinery in a few places (the fused LM head's kernel and
tile sizes, the Triton kernel module's helpers, GRPOTrainer's private hooks it overrides, the trainer module's
optional imports). Every such name is listed once, below, and :func:`check` verifies, when gtpo's trainer is imported,
that each exists (and that each overridden hook has the parameters gtpo's override assumes): a TRL outside the pin
fails then, in one line naming the first missing piece and the supported versions, not deep inside a training step.
The other trainer modules take these TRL modules from here (``trl_utils``, ``trl_kernel``, ``trl_grpo``).
"""

from __future__ import annotations

import contextlib
import inspect
from types import ModuleType

import torch
import trl
import trl.trainer.grpo_trainer as trl_grpo
import trl.trainer.utils as trl_utils
from trl.kernels import chunked_logprob as trl_kernel

SUPPORTED = "trl==1.16.*"

# Module-level names gtpo reads or patches, by module (the module object is passed to `check`).
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    # the fused LM head: the kernel TRL's `_fused_forward` looks up at call time (patched by gtpo.trainer.untempered
    # and shared_prefix), and its vocabulary tile size (gtpo.trainer.lm_head tiles alike)
    "trl.trainer.utils": ("_ChunkedLogProbFunction", "_CHUNKED_LOGPROB_CHUNK_SIZE", "add_fused_lm_head"),
    # TRL's kernel module: the torch/Triton switch, its fp32 addmm, Triton's jit, the logits transform, tile sizes
    "trl.kernels.chunked_logprob": (
        "ChunkedLogProbFunction",
        "_use_triton",
        "_addmm_fp32",
        "_jit",
        "_transform",
        "_BLOCK_SIZE",
        "TOKEN_CHUNK_SIZE",
    ),  # fmt: skip
    # the trainer module's optional imports the completion record's wandb/trackio tables go through
    "trl.trainer.grpo_trainer": ("pd",),
}

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


# The module global TRL's fused forward looks up at call time (trl/trainer/utils.py, `_fused_forward`).
KERNEL_NAME = "_ChunkedLogProbFunction"


class HeadPatch:
    """The one stand-in for TRL's fused LM-head kernel while gtpo needs more of it, with `apply`'s signature.

    Two callers configure it, through :func:`fused_head`: `gtpo.trainer.untempered` sets ``entropy`` (a policy whose
    ``apply(kernel, ...)`` returns the temperature-1 entropy, and what else GTPO's settings ask of the head), and
    `gtpo.trainer.shared_prefix` sets ``scored`` to its packed rows. ``scored``: (N,) bool, the positions that carry
    a label; where TRL's kernel receives every position (devices without Triton) only those are projected, and the
    outputs are scattered back (zeros elsewhere, as TRL zeroes them).
    """

    def __init__(self, kernel):
        self.kernel = kernel  # TRL's
        self.entropy = None  # None: TRL's kernel computes
        self.scored: torch.Tensor | None = None

    def apply(self, hidden, weight, bias, targets, *args):
        keep = self.scored
        if keep is None or keep.numel() != hidden.shape[0]:  # nothing to skip, or TRL passes the labelled rows only
            return self._apply(hidden, weight, bias, targets, *args)
        keep = keep.to(hidden.device)
        result = self._apply(hidden[keep], weight, bias, targets[keep], *args)
        return tuple(None if x is None else x.new_zeros(keep.shape).masked_scatter(keep, x) for x in result)

    def _apply(self, *args):
        return self.kernel.apply(*args) if self.entropy is None else self.entropy.apply(self.kernel, *args)


@contextlib.contextmanager
def fused_head():
    """The `HeadPatch` in force, installed for the block if none is; callers set its fields and restore them."""
    current = getattr(trl_utils, KERNEL_NAME)
    if isinstance(current, HeadPatch):
        yield current
        return
    patch = HeadPatch(current)
    setattr(trl_utils, KERNEL_NAME, patch)
    try:
        yield patch
    finally:
        setattr(trl_utils, KERNEL_NAME, current)


def _modules() -> dict[str, ModuleType]:
    return {
        "trl.trainer.utils": trl_utils,
        "trl.kernels.chunked_logprob": trl_kernel,
        "trl.trainer.grpo_trainer": trl_grpo,
    }


def problem(modules: dict | None = None, trainer_class=None, version: str | None = None) -> str | None:
    """What in the installed TRL differs from what gtpo relies on (one phrase), or None.

    Args:
        modules: module name -> module (default: the imported TRL modules); tests pass stand-ins.
        trainer_class: the class whose hooks are checked (default TRL's GRPOTrainer).
        version: the TRL version named in the message (default ``trl.__version__``).
    """
    modules = _modules() if modules is None else modules
    for module_name, names in PRIVATE_NAMES.items():
        module = modules[module_name]
        for name in names:
            if not hasattr(module, name):
                return f"{module_name}.{name} is missing"
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
        version = trl.__version__ if version is None else version
        raise ImportError(
            f"gtpo needs {SUPPORTED}: in the installed trl {version}, {found}. Install a supported TRL "
            f"(pip install '{SUPPORTED}'), or use gtpo's own environment (make test / scripts/setup.sh)."
        )


check()
