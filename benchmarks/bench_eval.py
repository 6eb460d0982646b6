"""Held-out evaluation's cost (study A's: 100 synthetic test problems x 8 samples x 96 tokens, SmolLM2-135M), three
arms on the same per-sample seeds, batch by batch, taking turns: the transformers backend before issue 30
(``model.generate`` on the batch), `gtpo.decoding.sampling.decode` at commit 0cb9e55's default batch (8 problems, 64
rows: "fast before") and at today's default (`gtpo.eval.runner.DEFAULT_BATCH_SIZE`: "fast now"); plus the model's
load each way (the GGUF parsed and de-quantised, as at 0cb9e55, against the de-quantised folder
`gtpo.models.load_model` reads now).

    python benchmarks/bench_eval.py                  # 100 problems (a trained checkpoint: ~7 min on 2 idle cores)
    python benchmarks/bench_eval.py --quick          # 16 problems
    python benchmarks/bench_eval.py --limit 25 --no-generate   # issue 39's job, without the slow generate arm
    python benchmarks/bench_eval.py --model RUN/model --fast-problems-per-batch 32   # a trained model, bigger batches

A row's samples do not depend on its batch (per-sample seeds), so the arms must give the same texts; how many came out
differently (float rounding of another batch shape) and from the first differing token on how many tokens is printed.
Printed: the CPU, dtype, each arm's total time, the ratios, the row-steps each computed (``generate``: every row until
the longest of its batch ends) and the share of them before EOS (the tokens kept), then the whole job (load + sampling)
before and now.
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
    parser.add_argument("--problems-per-batch", type=int, default=8, help="generate's and 'fast before''s batch")
    parser.add_argument(
        "--fast-problems-per-batch",
        type=int,
        default=None,
        help="'fast now''s batch (default: gtpo eval's default batch, DEFAULT_BATCH_SIZE rows, in whole problems)",
    )
    parser.add_argument("--no-generate", action="store_true", help="leave out the generate arm (slow)")
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
    from gtpo.eval.runner import DEFAULT_BATCH_SIZE, load_problems, unit_seed

    print(cpu_line())
    load = load_seconds(args.model, args.dtype)
    backend = TransformersBackend(args.model, dtype=args.dtype)
    source = args.source
    shared_gsm8k = Path(__file__).resolve().parents[1].parent / "shared/data/gsm8k/test.jsonl"
    if source is None and args.task == "gsm8k" and shared_gsm8k.is_file():
        source = str(shared_gsm8k)  # the offline copy beside the repository (GSM8K's default source is the hub)
    problems = load_problems(args.task, "test", source, limit=args.limit)
    sampling = SamplingSettings(temperature=args.temperature, max_new_tokens=args.tokens)
    now = args.fast_problems_per_batch or max(DEFAULT_BATCH_SIZE // args.n, 1)
    sizes = {"generate": args.problems_per_batch, "fast before": args.problems_per_batch, "fast now": now}
    if args.no_generate:
        del sizes["generate"]
    arms = list(sizes)
    chunk = math.lcm(*sizes.values())  # the arms sample the same problems chunk by chunk, taking turns
    seconds = dict.fromkeys(arms, 0.0)
    computed = dict.fromkeys(arms, 0)
    kept = dict.fromkeys(arms, 0)
    differ = differ_tokens = 0
    for c, first in enumerate(range(0, len(problems), chunk)):
        problems_c = problems[first : first + chunk]
        order = arms[c % len(arms) :] + arms[: c % len(arms)]
        out = {arm: [] for arm in arms}
        for arm in order:
            backend.fast = arm != "generate"
            for b in range(0, len(problems_c), sizes[arm]):
                batch = problems_c[b : b + sizes[arm]]
                prompts = [p.prompt for p in batch for _ in range(args.n)]
                seeds = [unit_seed(0, p.id, s) for p in batch for s in range(args.n)]
                backend.stats.__init__()
                start = time.perf_counter()
                completions = backend.generate(prompts, seeds, sampling)
                seconds[arm] += time.perf_counter() - start
                lengths = [c.length for c in completions]
                kept[arm] += sum(lengths)
                computed[arm] += backend.stats.row_steps if arm != "generate" else max(lengths) * len(lengths)
                out[arm].extend(completions)
        reference = out[arms[0]]
        for arm in arms[1:]:
            differ += sum(a != c for a, c in zip(reference, out[arm], strict=True))
            differ_tokens += sum(
                token_difference(backend.tokenizer, a.text, c.text) for a, c in zip(reference, out[arm], strict=True)
            )
        so_far = ", ".join(f"{arm} {seconds[arm]:7.1f} s" for arm in arms)
        print(f"  {first + len(problems_c)} problems: {so_far} so far", flush=True)
    print(
        f"dtype {args.dtype}, temperature {args.temperature}, {len(problems)} {args.task} test problems x {args.n} "
        f"samples x {args.tokens} tokens; problems a batch: "
        + ", ".join(f"{arm} {size}" for arm, size in sizes.items())
    )
    for arm in arms:
        print(
            f"  {arm:11s} {seconds[arm]:7.1f} s  row-steps {computed[arm]:7d}  before EOS "
            f"{kept[arm] / max(computed[arm], 1):.0%}"
        )
    ratios = [f"{arm} / generate {seconds[arm] / seconds['generate']:.2f}x" for arm in arms[1:] if "generate" in arms]
    ratios.append(f"fast now / fast before {seconds['fast now'] / seconds['fast before']:.2f}x")
    print("  " + "; ".join(ratios) + f"; {differ} samples differ from {arms[0]}'s, on {differ_tokens} tokens")
    before, after = load["gguf"] + seconds["fast before"], load["folder"] + seconds["fast now"]
    print(
        f"  model load: GGUF {load['gguf']:.1f} s, de-quantised folder {load['folder']:.1f} s; whole job (load + "
        f"sampling) before {before:.1f} s, now {after:.1f} s: {after / before:.2f}x"
    )


def load_seconds(model: str, dtype: str) -> dict[str, float]:
    """Seconds to load ``model`` (and its tokenizer) as commit 0cb9e55 did (the GGUF) and as `load_model` does now;
    for a model without a GGUF the two are the same load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gtpo.models import load_model, load_tokenizer, resolve_model

    source = resolve_model(model)
    times = {}
    start = time.perf_counter()
    AutoTokenizer.from_pretrained(source.path, **source.kwargs())
    AutoModelForCausalLM.from_pretrained(source.path, dtype=getattr(torch, dtype), **source.kwargs())
    times["gguf"] = time.perf_counter() - start
    start = time.perf_counter()
    load_tokenizer(model)
    load_model(model, dtype=dtype)
    times["folder"] = time.perf_counter() - start
    return times


if __name__ == "__main__":
    main()
