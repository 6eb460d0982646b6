"""Checks `gtpo eval` makes before it creates anything, and the clean-up of a run that never started.

Every failure here is a `ValueError` whose message names the flag or file and how to fix it: the CLI
prints it as one line and exits 2 (README, "Errors").
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from gtpo.errors import InvalidInput

logger = logging.getLogger(__name__)


def check_model(model: str) -> None:
    """`model` is a local path, an offline name, or a hub repo that exists (cached or reachable).

    Checked before the run folder is made, so a typo (``smollm`` for ``smollm2``) leaves nothing behind.
    A hub id costs one small metadata look-up (``config.json`` or, for an adapter, ``adapter_config.json``).
    """
    from gtpo.models import OFFLINE_MODELS, resolve_model

    source = resolve_model(model)  # raises for a local-looking path that does not exist
    if Path(source.path).exists():
        return
    from transformers.utils import cached_file

    reasons = []
    for name in ("config.json", "adapter_config.json"):
        try:
            if cached_file(source.path, name, _raise_exceptions_for_missing_entries=False) is not None:
                return
        except (OSError, ValueError) as err:  # not found, no network, gated
            reasons.append(str(err).strip().splitlines()[0])
    reason = reasons[0] if reasons else "no config.json or adapter_config.json in the hub cache or on the hub"
    raise InvalidInput(
        f"--model {model!r} is not a local path, not an offline name {list(OFFLINE_MODELS)}, and not a hub model "
        f"that can be loaded ({reason}). Check the name, or give a checkpoint directory."
    )


def check_output_dir(run_dir: Path) -> None:
    """`run_dir` (OUTPUT_DIR/TASK) is, or can become, a writable folder. Creates nothing."""
    for parent in (run_dir, *run_dir.parents):
        if parent.exists():
            if not parent.is_dir():
                raise InvalidInput(f"--output_dir: {parent} is a file, not a folder; choose another --output_dir")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise InvalidInput(
                    f"--output_dir: cannot write in {parent} (permission denied); choose another --output_dir"
                )
            return


@contextlib.contextmanager
def removed_if_never_started(run_dir: Path, samples_file: str):
    """Create `run_dir`; if the block fails before any sample is on disk, remove what it created.

    A run that never produced a sample (model failed to load, bad data) must not leave a folder that a
    later run would have to match its settings against.
    """
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInput(
            f"--output_dir: cannot create {run_dir} ({err.strerror or err}); choose another --output_dir"
        ) from None
    try:
        yield
    except BaseException:
        samples = run_dir / samples_file
        if created and not (samples.exists() and samples.stat().st_size > 0):
            top = created[-1]  # the outermost folder this run created
            logger.info("removing %s: the run stopped before its first sample", top)
            shutil.rmtree(top, ignore_errors=True)
        raise
