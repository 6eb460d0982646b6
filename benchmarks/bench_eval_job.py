"""A whole `gtpo eval` job, as a user runs it, three ways on the same machine:

- ``graphs``: `gtpo eval` as shipped (on a GPU each decoding step replayed as a CUDA graph);
- ``eager``: `gtpo eval --cuda_graphs false` (the eager `decode`; on a CPU the same as ``graphs``);
- ``generate``: the transformers backend on ``model.generate`` (``TransformersBackend(fast=False)``, the path
  before `gtpo.decoding.sampling.decode` and what TRL's transformers generation runs), every row until the
  longest of its batch ends.

Each (arm, repetition) is a fresh process running ``gtpo eval`` into an empty folder (so nothing resumes), timed from
before its imports to its exit: the whole job, model load and grading included. Arms take turns in an order rotated
each repetition. The per-sample seeds make the arms' samples the same up to float rounding of another batch shape;
how many differ from ``graphs``' is printed.

    python benchmarks/bench_eval_job.py                                   # performance.md's evaluation job
    python benchmarks/bench_eval_job.py --limit 100 --reps 2              # study A's held-out size
    python benchmarks/bench_eval_job.py --model tiny --limit 2 -n 2 --max_new_tokens 8 --reps 1 --in-process
    python benchmarks/bench_eval_job.py --dry-run                         # the commands only

Printed: the device, then per arm the median whole-job seconds (each repetition's in brackets), its ratio to
``generate``'s and to ``graphs``', and the samples that differ. ``--in-process`` runs every job in this process
(imports and the first model load then count once; for tests and a quick look, not for figures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("graphs", "eager", "generate")
ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="gtpo eval --model")
    parser.add_argument("--task", default="synthetic", help="gtpo eval --task (one)")
    parser.add_argument("--limit", type=int, default=25, help="problems (docs/performance.md's evaluation job: 25)")
    parser.add_argument("-n", type=int, default=8, help="samples per problem")
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--dtype", default=None, help="gtpo eval --dtype (default: its own, bf16 on a GPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each arm")
    parser.add_argument("--output_dir", default=".bench-eval-job", help="scratch folder, emptied per job")
    parser.add_argument("--in-process", action="store_true", help="no fresh process per job (not for figures)")
    parser.add_argument("--dry-run", action="store_true", help="print each job's command and stop")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    return parser.parse_known_args(argv)


def eval_argv(options, arm: str, folder: Path) -> list[str]:
    """`gtpo eval`'s arguments for one job of ``arm`` into ``folder``."""
    argv = ["eval", "--model", options.model, "--task", options.task, "--split", "test", "-n", str(options.n),
            "--limit", str(options.limit), "--max_new_tokens", str(options.max_new_tokens), "--seed",
            str(options.seed), "--backend", "transformers", "--output_dir", str(folder), "--no_progress"]  # fmt: skip
    if options.dtype:
        argv += ["--dtype", options.dtype]
    if arm == "eager":
        argv += ["--cuda_graphs", "false"]
    return argv


def run_job(arm: str, argv: list[str]) -> None:
    """Run `gtpo eval` with ``argv`` in this process; the ``generate`` arm's backend decodes with ``generate``."""
    import gtpo.eval.backends as backends
    from gtpo.cli.main import main

    factory = backends.BACKENDS["transformers"]
    if arm == "generate":
        backends.BACKENDS["transformers"] = lambda m, d, s, **k: backends.TransformersBackend(m, d, fast=False)
    try:
        status = main(argv)
    finally:
        backends.BACKENDS["transformers"] = factory
    if status != 0:
        raise SystemExit(f"gtpo {' '.join(argv)} exited with {status}")


def timed_job(options, arm: str, folder: Path) -> float:
    """Seconds of one whole job of ``arm`` into the emptied ``folder``."""
    shutil.rmtree(folder, ignore_errors=True)
    argv = eval_argv(options, arm, folder)
    if options.in_process:
        start = time.perf_counter()
        run_job(arm, argv)
        return time.perf_counter() - start
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--child", arm, "--", *argv], check=True, env=env)
    return time.perf_counter() - start


def samples(folder: Path, task: str) -> dict:
    rows = [json.loads(line) for line in (folder / task / "samples.jsonl").read_text().splitlines()]
    return {(str(r["problem_id"]), r["sample_index"]): r["text"] for r in rows}


def device_line() -> str:
    import torch

    if torch.cuda.is_available():
        return f"device {torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return f"device CPU, {torch.get_num_threads()} torch threads (torch {torch.__version__})"


def main(argv=None) -> None:
    options, rest = parse_args(argv)
    if options.child:
        run_job(options.child, [a for a in rest if a != "--"])
        return
    if rest:
        raise SystemExit(f"unknown arguments {rest}")
    scratch = Path(options.output_dir)
    if options.dry_run:
        for arm in options.arms:
            print(f"{arm}: gtpo " + " ".join(eval_argv(options, arm, scratch / arm)))
        return
    print(device_line(), flush=True)
    seconds = {arm: [] for arm in options.arms}
    texts = {}
    for rep in range(options.reps):
        shift = rep % len(options.arms)
        for arm in options.arms[shift:] + options.arms[:shift]:
            seconds[arm].append(timed_job(options, arm, scratch / arm))
            texts[arm] = samples(scratch / arm, options.task)
            print(f"  rep {rep + 1} {arm}: {seconds[arm][-1]:.2f} s", flush=True)
    median = {arm: statistics.median(times) for arm, times in seconds.items()}
    print(
        f"gtpo eval --model {options.model} --task {options.task} -n {options.n} --limit {options.limit} "
        f"--max_new_tokens {options.max_new_tokens}: {len(next(iter(texts.values())))} samples, {options.reps} "
        f"repetitions{' in one process (not a figure)' if options.in_process else ', each a fresh process'}"
    )
    reference = texts[options.arms[0]]
    for arm in options.arms:
        ratios = [f"{median[arm] / median[other]:.3f}x {other}" for other in ("generate", "graphs")
                  if other in median and other != arm]  # fmt: skip
        differ = sum(reference.get(key) != text for key, text in texts[arm].items())
        each = ", ".join(f"{t:.2f}" for t in seconds[arm])
        against = "; " + ", ".join(ratios) if ratios else ""
        first = options.arms[0]
        print(f"{arm:9s} whole job {median[arm]:.2f} s [{each}]{against}; {differ} samples differ from {first}'s")


if __name__ == "__main__":
    main()
