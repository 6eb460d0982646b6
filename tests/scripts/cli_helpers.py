"""Running the `gtpo` command in a subprocess, as users do (shared by the CLI and compare tests), and the few other
helpers several test files share."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def gtpo_command() -> list[str]:
    """The installed console script when there is one (what users run), else the module."""
    script = Path(sys.executable).with_name("gtpo")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gtpo.cli"]


def run_gtpo(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("GTPO_DEBUG", None)
    return subprocess.run(gtpo_command() + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def tiny_train_args(model: str) -> list[str]:
    """Two GTPO steps of the tiny model: G=2 completions of 6 tokens, ⟨H⟩_ini on 2 prompts."""
    return [
        "train", "--model_name_or_path", model, "--dtype", "float32",
        "--max_steps", "2", "--num_generations", "2", "--per_device_train_batch_size", "2",
        "--max_completion_length", "6", "--initial_entropy_prompts", "2", "--num_examples", "8",
    ]  # fmt: skip


def load_script(name: str):
    """``studies/tools/<name>.py`` imported as a module (the study tools are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "studies" / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flat(text: str) -> str:
    """``text`` with every run of whitespace made one space, so that a sentence a document wraps across lines is found
    as one string (the figure tests look their figures up in the documents so)."""
    return re.sub(r"\s+", " ", text)
