"""Start-up checks on how accelerate set the run up, against what its launcher was asked for.

A sharded accelerate config can silently give an unsharded run. Measured with accelerate 1.15 (docs/recipes.md,
"Several processes, several machines"):

- `accelerate launch --config_file configs/accelerate/fsdp.yaml` with `GTPOConfig(use_cpu=True)` starts two ranks
  with `ACCELERATE_USE_FSDP=true` in their environment, but accelerate turns FSDP on only for accelerator
  back-ends (MULTI_GPU, MULTI_XPU, ...): on CPU the ranks run plain DDP (MULTI_CPU), each with the whole model.
  That is seen here, and logged in one line.
- `accelerate launch --config_file fsdp.yaml --cpu` (or zero2/zero3.yaml) starts one plain process whose
  environment is the same as with ddp.yaml and `--cpu`: nothing in the process says a sharded config was asked
  for, so that case cannot be seen from inside the run (the docs say so).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

logger = logging.getLogger(__name__)

# The environment flag accelerate's launcher sets for each sharded config, and the distributed type that honours it.
_SHARDED_REQUESTS = {
    "ACCELERATE_USE_FSDP": ("FSDP", "FSDP"),
    "ACCELERATE_USE_DEEPSPEED": ("DeepSpeed", "DEEPSPEED"),
}


def unsharded_fallback(env: Mapping[str, str], distributed_type: str, num_processes: int) -> str | None:
    """The line to log when the launcher asked for FSDP or DeepSpeed and accelerate set up neither.

    Args:
        env: the process environment (accelerate's launcher passes the config's choice as ACCELERATE_USE_*).
        distributed_type: the name of `accelerator.distributed_type` (e.g. "MULTI_CPU", "FSDP", "NO").
        num_processes: `accelerator.num_processes`.

    Returns:
        One line naming what was asked for and what runs instead, or None when they agree (or nothing was asked).
    """
    for flag, (label, honoured_by) in _SHARDED_REQUESTS.items():
        if env.get(flag, "false").lower() != "true" or distributed_type == honoured_by:
            continue
        layout = "one process" if num_processes == 1 else f"{num_processes} processes, each with the whole model"
        return (
            f"accelerate was launched for {label} ({flag}=true) but set up {distributed_type} on "
            f"{layout}: nothing is sharded (accelerate shards only on GPUs/accelerators; use_cpu=True or no GPU "
            f"turns {label} off); launch on GPUs to shard, or with configs/accelerate/ddp.yaml to say what runs"
        )
    return None


def warn_if_unsharded(accelerator) -> None:
    """Log `unsharded_fallback`'s line, once per process, when a sharded launch runs unsharded.

    Args:
        accelerator: the trainer's `accelerate.Accelerator`, after it has been set up.
    """
    kind = accelerator.distributed_type
    line = unsharded_fallback(os.environ, getattr(kind, "name", str(kind)), accelerator.num_processes)
    if line is not None:
        logger.warning(line)
