#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run (CI has no GPU; run this by hand on a machine with one):
#   1. the gpu-marked tests: spans and weights on CUDA, the loss on CUDA, the LM head's Triton kernels
#      (gtpo.trainer.head_kernels; the CPU tests mock them) against TRL's run twice, the packed layout against TRL's
#      padded one on CUDA, with the dense mask and with FlexAttention's block mask (transformers' compiled kernels);
#   2. the LM-head benchmark at Qwen2.5-1.5B's head shape (bf16), at T = 0.7: TRL's kernel once, twice, ours once;
#   3. the step's forward + backward (bf16, CUDA events, 30 repetitions: each arm's ratio to TRL's in the same
#      repetition, its median with a 95 % interval and spread), TRL against GTPO, at the paper-vocabulary shape
#      (T = 0.7) and at Qwen2.5-1.5B's whole config (T = 0.7 and 1), with a profile of GTPO's two layouts at
#      T = 0.7 (in the logs), and at Qwen2.5-3B's whole config (T = 0.7, completions of 256-512 tokens); with
#      GPU_CHECKS_BASELINE=SHA the 1.5B T = 0.7 run adds that commit's GTPO arm (needs the git history here; a device
#      copy without it takes GPU_CHECKS_BASELINE_SRC=DIR, a folder holding that version's gtpo/, made beforehand with
#      `mkdir -p DIR && git archive SHA src/gtpo | tar -x --strip-components=1 -C DIR`); then the packed layout's
#      attention by FlexAttention's block mask (the arm gtpo-flex, opt-in in gtpo, never measured): at Qwen2.5-1.5B's
#      config beside trl, gtpo and gtpo-padded with its profile, at 3B's beside trl and gtpo (T = 0.7), each under
#      `timeout 150` (transformers compiles flex attention in the warm-up repetition, for a time not yet measured);
#   4. `gtpo train` (tiny model, T = 0.7, 3 steps) and `gtpo eval` on its adapter, on CUDA;
#   5. a decoding token step at Qwen2.5-1.5B's config (bf16, 8 and 64 rows): `decode` against the fixed-shape path,
#      eager and replayed as a CUDA graph, each against its floor, one read of the weights at the read bandwidth
#      measured first, with evaluation's per-row sampler and training's multinomial one (issues 39 and 47), and the
#      counter-based sampler whose draw is recorded inside the replayed step (issue 58); the whole decode over its
#      steps, the steady replayed step (full decode minus half, both graphs kept) and each graph's capture cost; then
#      a profile of one warm graph decode at 64 rows (per-row sampler), by device and by host time.
#   Not in the default run, named in GPU_CHECKS: `eval-job`: a whole `gtpo eval` job (SmolLM2-135M,
#      offline, 100 synthetic test problems x 8 samples x 96 tokens, bf16) three ways, each a fresh process, 2
#      repetitions taking turns (benchmarks/bench_eval_job.py): as shipped (CUDA graphs), `--cuda_graphs false`, and
#      the backend on `model.generate`; and `gen-step`: one training step's generation against TRL's `generate` on
#      the same GPU, inside whole steps of both trainers (benchmarks/bench_step.py, Qwen2.5-1.5B's config, random
#      weights, G = 8, 256 tokens forced, 1 warm-up + 2 measured steps; its "generation gtpo / TRL" line). Each under
#      `timeout` (200 and 270 s), so the two fit 8 minutes in sequence (estimated, not yet measured).
#   `compile`: the decoding step of 5. with the model's forward compiled
#      by inductor before capture (the arm compiled-graph beside the uncompiled one, 8 and 64 rows, 3 repetitions;
#      the compile adds minutes): does fusing the step's ~1,265 kernels bring it under 3x the floor? And `fsdp`,
#      `zero2`, `zero3` (issue 46): 3 GTPO steps of the tiny model
#      on one GPU under configs/accelerate/fsdp.yaml (FSDP2), zero2.yaml, zero3.yaml, on replayed completions, against
#      the unsharded run: loss, gradient norm and GTPO's metrics per step and the reloaded saved model, within the
#      tolerance tests/scripts/sharded_worker.py states (float32); 3 minutes each at most (timeout 180). DeepSpeed is
#      installed from .whl/ when missing (a wheel without compiled ops; docs/recipes.md says how to build it).
# Time, measured on one H100 on 2026-11-28 (docs/measurements/gpu-h100-20261128/status.txt): tests 43 s, e2e 46 s,
#   decode 154 s, step about 160 s (the 3B run's seconds were cut off; head not run, about 1 minute by earlier logs),
#   fsdp + zero2 + zero3 209 s: over 10 minutes in one sequential call. Either two calls, or the sharded groups in
#   one process beside "tests e2e" in another (different LOG_DIRs; they share no port) and then the timed groups
#   alone, as that run did (its README has the commands). status.txt records each step's seconds.
# Usage, from the repository root, with gtpo's dependencies importable by $PYTHON (default python3):
#   bash scripts/gpu_checks.sh [LOG_DIR]          # logs to LOG_DIR (default .gpu-checks/), a summary printed last
#   GPU_CHECKS="tests e2e" bash scripts/gpu_checks.sh   # only some groups: tests, head, step, e2e, decode
#   GPU_CHECKS="fsdp zero2 zero3" bash scripts/gpu_checks.sh   # the sharded checks (with .whl/ on the machine)
#   GPU_CHECKS="eval-job gen-step" bash scripts/gpu_checks.sh  # what the user sees: eval job, training's generation
#   GPU_CHECKS_DRY_RUN=1 bash scripts/gpu_checks.sh             # print the commands only (tests/test_gpu_checks_harness.py)
# Every figure it prints carries the device's name; compare arms only within one run.
set -u
log_dir=${1:-.gpu-checks}
python=${PYTHON:-python3}
mkdir -p "$log_dir"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

groups=" ${GPU_CHECKS:-tests head step e2e decode} "
want() { [[ $groups == *" $1 "* ]]; }

dry_run=${GPU_CHECKS_DRY_RUN:-}
step() {  # step NAME COMMAND...: run, log to LOG_DIR/NAME.log, remember the exit status
    local name=$1 started=$SECONDS
    shift
    echo "== $name: $*"
    if [[ -n $dry_run ]]; then echo "$name rc=dry-run" >>"$log_dir/status.txt"; return 0; fi
    "$@" 2>&1 | tee "$log_dir/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "$name rc=$rc seconds=$((SECONDS - started))" >>"$log_dir/status.txt"
}

: >"$log_dir/status.txt"
[[ -n $dry_run ]] || "$python" - <<'EOF' 2>&1 | tee "$log_dir/versions.log"
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
want tests && step tests "$python" -m pytest -m gpu -q -p no:cacheprovider -o addopts="-ra --strict-markers" \
    tests/core/test_core.py tests/core/test_core_loss.py tests/forward/test_lm_head.py \
    tests/trainer/test_shared_prefix.py tests/trainer/test_packed_flex.py tests/test_graph_decode.py \
    tests/test_counter_sampler.py
want head && step head-logprob "$python" benchmarks/bench_head.py --reps 20
want head && step head-differentiable "$python" benchmarks/bench_head.py --reps 20 --backward differentiable
want head && step head-16k "$python" benchmarks/bench_head.py --tokens 16384 --reps 10
# The step: 30 repetitions give each ratio's median a 95 % interval of about ±2 % where one ratio scatters by 5 %.
# The paper-vocabulary shape runs at T = 0.7 only (a 2-layer model on a GPU measures launches, not the step).
want step && step step-t07 "$python" benchmarks/bench_loss_step.py --shape paper-vocab --temperature 0.7 --reps 30 \
    --profile gtpo gtpo-padded
want step && step qwen-t07 "$python" benchmarks/bench_loss_step.py --shape qwen1.5b --temperature 0.7 --reps 30 \
    --profile gtpo gtpo-padded ${GPU_CHECKS_BASELINE:+--baseline-commit "$GPU_CHECKS_BASELINE"} \
    ${GPU_CHECKS_BASELINE_SRC:+--baseline-src "$GPU_CHECKS_BASELINE_SRC"}
want step && step qwen-t1 "$python" benchmarks/bench_loss_step.py --shape qwen1.5b --temperature 1.0 --reps 30
want step && step qwen3b-t07 "$python" benchmarks/bench_loss_step.py --shape qwen3b --temperature 0.7 --reps 30
# FlexAttention's block mask for the packed layout (GTPO_PACKED_ATTENTION=flex, set by the arm): its line says how
# often flex attention ran, or why the arm fell back to the dense mask.
want step && step qwen-flex timeout 150 "$python" benchmarks/bench_loss_step.py --shape qwen1.5b --temperature 0.7 \
    --reps 30 --arms trl gtpo gtpo-padded gtpo-flex --profile gtpo-flex
want step && step qwen3b-flex timeout 150 "$python" benchmarks/bench_loss_step.py --shape qwen3b --temperature 0.7 \
    --reps 20 --arms trl gtpo gtpo-flex
# 4. End to end on CUDA with the command a user runs: GTPO training of the tiny model (dtype auto: bf16 on a GPU) at
#    T = 0.7, then the transformers evaluation backend on the trained adapter.
want e2e && rm -rf "$log_dir/e2e-run" "$log_dir/e2e-eval"
want e2e && step e2e-train "$python" -m gtpo.cli train --model_name_or_path tiny --max_steps 3 --num_generations 4 \
    --per_device_train_batch_size 4 --max_completion_length 24 --initial_entropy_prompts 2 --num_examples 16 \
    --temperature 0.7 --output_dir "$log_dir/e2e-run"
want e2e && step e2e-eval "$python" -m gtpo.cli eval --model "$log_dir/e2e-run/model" --task synthetic -n 4 --limit 8 \
    --max-new-tokens 24 --output-dir "$log_dir/e2e-eval" --no-progress --seed 7
want e2e && step e2e-check "$python" - "$log_dir" <<'EOF_CHECK'
import json, math, sys
from pathlib import Path
run = Path(sys.argv[1]) / "e2e-run"
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
steps = [row for row in rows if "reward" in row]
assert [row["step"] for row in steps] == [1, 2, 3], [row.get("step") for row in steps]
assert all(math.isfinite(row["loss"]) for row in steps), [row["loss"] for row in steps]
record = json.loads((run / "run.json").read_text())
print("e2e train: 3 steps, losses", [row["loss"] for row in steps], "| dtype", record.get("recipe", {}).get("dtype"),
      "| bf16", record["args"]["GTPOConfig"].get("bf16"))
results = sorted((Path(sys.argv[1]) / "e2e-eval").rglob("results.json"))
assert results, "no results.json from gtpo eval"
print("e2e eval:", results[0].read_text()[:300].replace("\n", " "))
EOF_CHECK
want decode && step decode-graph "$python" benchmarks/bench_decode_graph.py --rows 8 64 --tokens 128 --profile
want decode && step decode-graph-multinomial "$python" benchmarks/bench_decode_graph.py --rows 8 64 --tokens 128 \
    --sampler multinomial --reps 2
want decode && step decode-graph-counter "$python" benchmarks/bench_decode_graph.py --rows 8 64 --tokens 128 \
    --sampler counter --reps 2
want compile && step decode-compiled "$python" benchmarks/bench_decode_graph.py --rows 8 64 --tokens 128 \
    --compile inductor --reps 3
# What the user sees: a whole `gtpo eval` job three ways, and training's generation against TRL's.
want eval-job && step eval-job timeout 200 "$python" benchmarks/bench_eval_job.py --model smollm2 --limit 100 -n 8 \
    --max_new_tokens 96 --reps 2 --output_dir "$log_dir/eval-job"
want gen-step && step gen-step timeout 270 "$python" benchmarks/bench_step.py --model qwen1.5b-shape --device cuda \
    --steps 2 --warmup 1 --completion-length 256
# 6. Sharded training on one GPU (opt-in groups fsdp, zero2, zero3): reference, sharded run, comparison.
for sharded in fsdp zero2 zero3; do
    want $sharded && rm -rf "${log_dir:?}/$sharded"
    want $sharded && step "$sharded" timeout 180 "$python" tests/scripts/sharded_worker.py check "$sharded" \
        "$log_dir/$sharded"
done

if [[ -n $dry_run ]]; then cat "$log_dir/status.txt"; exit 0; fi
echo "== summary"
cat "$log_dir/versions.log"
want tests && tail -n 4 "$log_dir/tests.log"
for name in head-logprob head-differentiable head-16k step-t07 qwen-t07 qwen-t1 qwen3b-t07 qwen-flex qwen3b-flex; do
    [[ -f $log_dir/$name.log ]] || continue
    echo "-- $name"
    grep -E "^(device|forward|roofline|trl|gtpo|MEASUREMENT)" "$log_dir/$name.log"
done
want e2e && grep -h -E "^e2e|Error|error:" "$log_dir"/e2e-*.log | tail -n 8
want decode && grep -h -E "^(device|[0-9]+ rows|MEASUREMENT)" "$log_dir"/decode-graph*.log
want compile && grep -h -E "^(device|[0-9]+ rows|MEASUREMENT)" "$log_dir"/decode-compiled.log
want eval-job && grep -h -E "^(device|gtpo eval|graphs|eager|generate) " "$log_dir/eval-job.log"
want gen-step && grep -h -E "^(model|median step|floors|gtpo step parts|grpo step parts|generation|gtpo/grpo)" \
    "$log_dir/gen-step.log"
for sharded in fsdp zero2 zero3; do
    want $sharded && grep -h -E "^(DistributedType|step [0-9]|reloaded|sharded check|  )" "$log_dir/$sharded.log"
done
cat "$log_dir/status.txt"
