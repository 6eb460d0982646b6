"""Shared fixtures. Tests never reach a hub: offline mode is forced before anything imports transformers."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys

import pytest

# Helpers shared by tests in several folders (trainer_helpers, cli_helpers, golden_run) live in tests/scripts.
sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Real GSM8K / MATH-500 files beside the checkout (../shared/data); never copied into the repo."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real test data not found at {SHARED_DATA}: clone the project with ../shared beside it")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """Directory of the tiny local Llama + tokenizer (built once, cached under $GTPO_CACHE)."""
    from gtpo.models import tiny_model_dir

    return str(tiny_model_dir())
