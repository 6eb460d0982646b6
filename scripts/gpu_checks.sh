#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run (CI has no GPU; run this by hand on a machine with one):
#   1. the gpu-marked tests: spans and weights on CUDA, the loss on CUDA, the LM head's Triton branch with TRL's
#      real kernels (the CPU tests mock them), the packed layout against TRL's padded one on CUDA;
#   2. the LM-head benchmark at Qwen2.5-1.5B's head shape (bf16), at T = 0.7: TRL's kernel once, twice, ours once;
#   3. the step's forward + backward (bf16), T = 0.7 and 1, TRL against GTPO, at the paper-vocabulary shape and at
#      Qwen2.5-1.5B's whole config, with a profile of GTPO's two layouts at T = 0.7 (in the logs).
# Usage, from the repository root, with gtpo's dependencies importable by $PYTHON (default python3):
#   bash scripts/gpu_checks.sh [LOG_DIR]          # logs to LOG_DIR (default .gpu-checks/), a summary printed last
# Every figure it prints carries the device's name; compare arms only within one run.
set -u
log_dir=${1:-.gpu-checks}
python=${PYTHON:-python3}
mkdir -p "$log_dir"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

step() {  # step NAME COMMAND...: run, log to LOG_DIR/NAME.log, remember the exit status
    local name=$1
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$log_dir/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "$name rc=$rc" >>"$log_dir/status.txt"
}

: >"$log_dir/status.txt"
"$python" - <<'EOF' 2>&1 | tee "$log_dir/versions.log"
import importlib.metadata as metadata, platform, subprocess
import torch
print("gpu:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none", "| torch", torch.__version__,
      "| cuda", torch.version.cuda, "| python", platform.python_version())
for name in ("triton", "transformers", "trl", "peft", "accelerate", "datasets", "pyarrow", "numpy"):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} missing")
subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False)
EOF
step tests "$python" -m pytest -m gpu -q -p no:cacheprovider -o addopts="-ra --strict-markers" \
    tests/core/test_core.py tests/core/test_core_loss.py tests/trainer/test_lm_head.py \
    tests/trainer/test_shared_prefix.py
step head-logprob "$python" benchmarks/bench_head.py --reps 20
step head-differentiable "$python" benchmarks/bench_head.py --reps 20 --backward differentiable
step head-16k "$python" benchmarks/bench_head.py --tokens 16384 --reps 10
step step-t07 "$python" benchmarks/bench_loss_step.py --shape paper-vocab --temperature 0.7 --reps 20 \
    --profile gtpo gtpo-padded
step step-t1 "$python" benchmarks/bench_loss_step.py --shape paper-vocab --temperature 1.0 --reps 20
step qwen-t07 "$python" benchmarks/bench_loss_step.py --shape qwen1.5b --temperature 0.7 --reps 10 \
    --profile gtpo gtpo-padded
step qwen-t1 "$python" benchmarks/bench_loss_step.py --shape qwen1.5b --temperature 1.0 --reps 10

echo "== summary"
cat "$log_dir/versions.log"
tail -n 4 "$log_dir/tests.log"
for name in head-logprob head-differentiable head-16k step-t07 step-t1 qwen-t07 qwen-t1; do
    echo "-- $name"
    grep -E "^(device|forward|roofline|trl|gtpo)" "$log_dir/$name.log"
done
cat "$log_dir/status.txt"
