"""Held-out evaluation's sampling (study A's: 100 synthetic test problems x 8 samples x 96 tokens, SmolLM2-135M): the
transformers backend before issue 30 (``model.generate`` on the batch) against now (`gtpo.sampling.decode`: one
prefill per problem, ended rows dropped), batch by batch, alternating, on the same per-sample seeds.

    python benchmarks/bench_eval.py                  # 100 problems (a trained checkpoint: ~7 min on 2 idle cores)
    python benchmarks/bench_eval.py --quick          # 16 problems
    python benchmarks/bench_eval.py --limit 40 --dtype bfloat16
    python benchmarks/bench_eval.py --model RUN/model --fast-problems-per-batch 32   # a trained model, bigger batches

Each batch holds ``--problems-per-batch`` whole problems (8 x 8 = 64 rows); ``--fast-problems-per-batch`` gives
the fast path another batch size (a row's samples do not depend on its batch: per-sample seeds). Both paths sample
the same problems chunk by chunk (the least common multiple of the two batch sizes), taking turns which goes first,
and their wall times add up. Printed: the CPU, dtype, each path's total time, the
ratio, the row-steps each computed (``generate``: every row until the longest of its batch ends) and the share of
them before EOS (the tokens kept), and how many samples came out differently (float rounding of another batch
shape), and from the first differing token on how many tokens.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import cpu_line  # noqa: E402


def token_difference(tokenizer, a: str, b: str) -> int:
    """Tokens of the longer completion from the first position where the two differ (0 when equal)."""
    x, y = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in (a, b))
    same = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), min(len(x), len(y)))
    return max(len(x), len(y)) - same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--limit", type=int, default=100, help="GSM8K test problems")
    parser.add_argument("-n", type=int, default=8, help="samples per problem")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy (counts near-tie differences)")
    parser.add_argument("--problems-per-batch", type=int, default=8)
    parser.add_argument(
        "--fast-problems-per-batch",
        type=int,
        default=None,
        help="the fast path's batch, when it differs (default: --problems-per-batch)",
    )
    parser.add_argument("--task", default="synthetic", help="study A's held-out task; gsm8k: longer completions")
    parser.add_argument(
        "--source",
        default=None,
        help="the task's data file (default: the task's own source; for gsm8k ../shared/data/gsm8k/test.jsonl)",
    )
    parser.add_argument("--quick", action="store_true", help="16 problems")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.quick:
        args.limit = 16
    if args.threads:
        torch.set_num_threads(args.threads)

    from gtpo.eval.backends import SamplingSettings, TransformersBackend
    from gtpo.eval.runner import load_problems, unit_seed

    print(cpu_line())
    backend = TransformersBackend(args.model, dtype=args.dtype)
    source = args.source
    shared_gsm8k = Path(__file__).resolve().parents[1].parent / "shared/data/gsm8k/test.jsonl"
    if source is None and args.task == "gsm8k" and shared_gsm8k.is_file():
        source = str(shared_gsm8k)  # the offline copy beside the repository (GSM8K's default source is the hub)
    problems = load_problems(args.task, "test", source, limit=args.limit)
    sampling = SamplingSettings(temperature=args.temperature, max_new_tokens=args.tokens)
    sizes = {"generate": args.problems_per_batch, "fast": args.fast_problems_per_batch or args.problems_per_batch}
    chunk = math.lcm(*sizes.values())  # both paths sample the same problems chunk by chunk, taking turns
    seconds = {"generate": 0.0, "fast": 0.0}
    computed = {"generate": 0, "fast": 0}
    kept = {"generate": 0, "fast": 0}
    differ = differ_tokens = 0
    for c, first in enumerate(range(0, len(problems), chunk)):
        problems_c = problems[first : first + chunk]
        order = ("generate", "fast") if c % 2 == 0 else ("fast", "generate")
        out = {"generate": [], "fast": []}
        for path in order:
            backend.fast = path == "fast"
            for b in range(0, len(problems_c), sizes[path]):
                batch = problems_c[b : b + sizes[path]]
                prompts = [p.prompt for p in batch for _ in range(args.n)]
                seeds = [unit_seed(0, p.id, s) for p in batch for s in range(args.n)]
                backend.stats.__init__()
                start = time.perf_counter()
                completions = backend.generate(prompts, seeds, sampling)
                seconds[path] += time.perf_counter() - start
                lengths = [c.length for c in completions]
                kept[path] += sum(lengths)
                computed[path] += backend.stats.row_steps if path == "fast" else max(lengths) * len(lengths)
                out[path].extend(completions)
        differ += sum(a != c for a, c in zip(out["generate"], out["fast"], strict=True))
        differ_tokens += sum(
            token_difference(backend.tokenizer, a.text, c.text)
            for a, c in zip(out["generate"], out["fast"], strict=True)
        )
        print(
            f"  {first + len(problems_c)} problems: generate {seconds['generate']:7.1f} s, "
            f"fast {seconds['fast']:7.1f} s so far",
            flush=True,
        )
    print(
        f"dtype {args.dtype}, temperature {args.temperature}, {len(problems)} {args.task} test problems x {args.n} "
        f"samples x {args.tokens} tokens; problems a batch: generate {sizes['generate']}, fast {sizes['fast']}"
    )
    for path in ("generate", "fast"):
        print(
            f"  {path:8s} {seconds[path]:7.1f} s  row-steps {computed[path]:7d}  before EOS "
            f"{kept[path] / max(computed[path], 1):.0%}"
        )
    ratio = seconds["fast"] / seconds["generate"]
    print(f"  fast / generate wall time {ratio:.2f}x; {differ} samples differ, on {differ_tokens} tokens")


if __name__ == "__main__":
    main()
