"""One decoding step of SmolLM2-135M by the number of rows in the batch: how much of a step is fixed (reading the
weights) and how much each row adds, which decides how large an evaluation batch should be.

    python benchmarks/bench_decode_step.py                       # float32, rows 1, 8, 16, 64, 200
    python benchmarks/bench_decode_step.py --model RUN/model --dtype bfloat16 --rows 1 64

For each row count: a 150-token prompt prefilled into a cache, then ``--steps`` single-token forwards (the median is
printed) with each cache, taking turns step by step: transformers' `DynamicCache` (each step concatenates, copying the
layer's cache) and `gtpo.decoding.sampling.preallocated_cache` (what `decode` uses: each step written in place); then
the per-row Gumbel-max sampler of `gtpo eval` on that step's logits
(`gtpo.eval.samplers.per_row_sampler`), and dropping one row from the cache (`DynamicCache.batch_select_indices`,
what `gtpo.decoding.sampling.decode` does when a row ends). The last line fits step = fixed + per-row x rows by least
squares over the row counts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import cpu_line  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 64, 200])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--prompt", type=int, default=150, help="prompt tokens in the cache")
    args = parser.parse_args()

    from transformers import DynamicCache

    from gtpo.decoding.sampling import preallocated_cache
    from gtpo.eval.backends import SamplingSettings, TransformersBackend
    from gtpo.eval.samplers import per_row_sampler

    print(cpu_line())
    model = TransformersBackend(args.model, dtype=args.dtype).model
    print(f"dtype {args.dtype}, attention {model.config._attn_implementation}, prompt {args.prompt} tokens")
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 1000, (1, args.prompt), generator=generator)
    steps = {}
    for rows in args.rows:
        caches = {"dynamic": DynamicCache(config=model.config), "preallocated": preallocated_cache(model, args.steps)}
        ids = prompt.repeat(rows, 1)
        times = {name: [] for name in caches}
        with torch.inference_mode():
            for cache in caches.values():
                model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, logits_to_keep=1)
            tokens = torch.randint(100, 1000, (rows, 1), generator=generator)
            for step in range(args.steps):
                mask = torch.ones(rows, args.prompt + step + 1, dtype=torch.long)
                position = torch.full((rows, 1), args.prompt + step)
                order = list(caches) if step % 2 == 0 else list(reversed(caches))
                for name in order:
                    start = time.perf_counter()
                    out = model(
                        input_ids=tokens,
                        attention_mask=mask,
                        position_ids=position,
                        past_key_values=caches[name],
                        use_cache=True,
                    )
                    times[name].append(time.perf_counter() - start)
            sampler = per_row_sampler(list(range(rows)), SamplingSettings(temperature=1.0, max_new_tokens=1), "cpu")
            logits = out.logits[:, -1].float()
            start = time.perf_counter()
            sampler.choose(logits)
            sample = time.perf_counter() - start
            drop = {}
            for name, cache in caches.items():
                start = time.perf_counter()
                cache.batch_select_indices(torch.arange(max(rows - 1, 1)))
                drop[name] = time.perf_counter() - start
        medians = {name: statistics.median(t) for name, t in times.items()}
        steps[rows] = medians["preallocated"]
        ratio = medians["preallocated"] / medians["dynamic"]
        print(
            f"  rows {rows:4d}: forward {1e3 * medians['dynamic']:7.1f} ms with DynamicCache, "
            f"{1e3 * medians['preallocated']:7.1f} ms preallocated ({ratio:.2f}x; "
            f"median of {args.steps}); sampler {1e3 * sample:6.1f} ms; dropping a row {1e3 * drop['dynamic']:6.1f} / "
            f"{1e3 * drop['preallocated']:6.1f} ms"
        )
    if len(steps) >= 2:
        xs = list(steps)
        slope, intercept = statistics.linear_regression(xs, [1e3 * t for t in steps.values()])
        print(f"forward (preallocated) ~ {intercept:.1f} ms + {slope:.2f} ms x rows (least squares over {xs})")


if __name__ == "__main__":
    main()
