"""A decoding token step on a GPU: `gtpo.sampling.decode` against `gtpo.graph_decode.decode_static`, eager and
replayed as a CUDA graph, beside one read of the weights (issue 39, item 4: target <= 3x that read at 64 rows).

    python benchmarks/bench_decode_graph.py                       # Qwen2.5-1.5B's config, random weights, bf16, CUDA
    python benchmarks/bench_decode_graph.py --rows 8 64 --tokens 128

Random weights rarely sample EOS, so every row runs all ``--tokens`` steps in every arm (the same work). Arms take
turns per row count; each figure is the median over ``--reps`` of the whole decode's time divided by its steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gtpo.graph_decode import decode_static
    from gtpo.sampling import decode, per_row_choice

    device = torch.device("cuda")
    config = Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, head_dim=128, tie_word_embeddings=True, eos_token_id=0, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    params = list(model.parameters())
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        [p.sum() for p in params]
    torch.cuda.synchronize()
    read = (time.perf_counter() - start) / 5
    print(
        f"device {torch.cuda.get_device_name()}, bf16, Qwen2.5-1.5B config; one read of the weights {1e3 * read:.2f} ms"
    )
    arms = {
        "decode": lambda p, s: decode(model, p, per_row_choice(s, device=device), args.tokens, [0], 1),
        "static-eager": lambda p, s: decode_static(
            model, p, per_row_choice(s, device=device), args.tokens, [0], 1, use_graph=False
        ),
        "static-graph": lambda p, s: decode_static(model, p, per_row_choice(s, device=device), args.tokens, [0], 1),
    }
    for rows in args.rows:
        prompts = [list(range(2, 2 + args.prompt))] * rows
        seeds = list(range(rows))
        times = {name: [] for name in arms}
        outputs = {}
        for _ in range(args.reps):
            for name, run in arms.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                outputs[name] = run(prompts, seeds)
                torch.cuda.synchronize()
                steps = max(len(c) for c in outputs[name])
                times[name].append((time.perf_counter() - start) / steps)
        same = outputs["static-graph"] == outputs["static-eager"]
        line = ", ".join(f"{name} {1e3 * statistics.median(t):.2f} ms" for name, t in times.items())
        ratio = statistics.median(times["static-graph"]) / read
        print(f"{rows} rows, {args.tokens} tokens: a token step {line}; graph / weight read {ratio:.2f}x; graph "
              f"tokens == eager static tokens: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
