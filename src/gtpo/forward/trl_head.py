"""TRL's fused LM head behind one door: the TRL modules whose private names the forward relies on, imported here and
checked at import, and the one patch of TRL's LM-head kernel (`HeadPatch`).

The forward reaches into TRL's fused head (TRL's kernel and its tile sizes, the Triton kernel module's helpers, the
module global TRL's fused forward looks its kernel up in). Every such name is listed once, below, and :func:`check`
verifies, when this module is imported, that each exists: a TRL outside the pin fails then, in one line naming the
first missing piece and the supported versions, not deep inside a forward. The trainer's own TRL names (GRPOTrainer's
hooks, the trainer module) are `gtpo.trainer.trl_adapter`'s, which checks these too. The other forward modules take
these TRL modules from here (``trl_utils``, ``trl_kernel``).
"""

from __future__ import annotations

import contextlib
from types import ModuleType

import torch
import trl
import trl.trainer.utils as trl_utils
from trl.kernels import chunked_logprob as trl_kernel

SUPPORTED = "trl==1.16.*"

# Module-level names the forward reads or patches, by module (the module object is passed to `problem`).
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    # the fused LM head: the kernel TRL's `_fused_forward` looks up at call time (patched through `HeadPatch` by
    # gtpo.forward.untempered and the packed layout), and its vocabulary tile size (gtpo.forward.lm_head tiles alike)
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
}

# The module global TRL's fused forward looks up at call time (trl/trainer/utils.py, `_fused_forward`).
KERNEL_NAME = "_ChunkedLogProbFunction"


class HeadPatch:
    """The one stand-in for TRL's fused LM-head kernel while gtpo needs more of it, with `apply`'s signature.

    Two callers configure it, through :func:`fused_head`: `gtpo.forward.untempered` sets ``entropy`` (a policy whose
    ``apply(kernel, ...)`` returns the temperature-1 entropy, and what else GTPO's settings ask of the head), and
    the packed layout (`gtpo.forward.packing`) sets ``scored`` to its packed rows. ``scored``: (N,) bool, the
    positions that carry a label; where TRL's kernel receives every position (devices without Triton) only those are
    projected, and the outputs are scattered back (zeros elsewhere, as TRL zeroes them).
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


def modules() -> dict[str, ModuleType]:
    """The TRL modules of :data:`PRIVATE_NAMES`, by name."""
    return {"trl.trainer.utils": trl_utils, "trl.kernels.chunked_logprob": trl_kernel}


def missing(names: dict[str, tuple[str, ...]], found: dict[str, ModuleType]) -> str | None:
    """The first of ``names`` (module name -> names) that its module in ``found`` lacks, as one phrase, or None."""
    for module_name, module_names in names.items():
        for name in module_names:
            if not hasattr(found[module_name], name):
                return f"{module_name}.{name} is missing"
    return None


def unsupported(found: str, version: str | None = None) -> ImportError:
    """The one-line error for a TRL that lacks what gtpo relies on (``found``, one phrase)."""
    version = trl.__version__ if version is None else version
    return ImportError(
        f"gtpo needs {SUPPORTED}: in the installed trl {version}, {found}. Install a supported TRL "
        f"(pip install '{SUPPORTED}'), or use gtpo's own environment (make test / scripts/setup.sh)."
    )


def check(found: dict[str, ModuleType] | None = None, version: str | None = None) -> None:
    """Raise ImportError, in one line, if a name of :data:`PRIVATE_NAMES` is missing."""
    problem = missing(PRIVATE_NAMES, modules() if found is None else found)
    if problem is not None:
        raise unsupported(problem, version)


check()
