"""A decoding token step on a GPU: `gtpo.decoding.sampling.decode` against `gtpo.decoding.graph.decode_static`,
eager and replayed as a CUDA graph, against its floor, one read of the weights at the device's measured read bandwidth
(issue 39, item 4 and issue 47, item 1: target <= 3x that floor at 8 and 64 rows).

    python benchmarks/bench_decode_graph.py                       # Qwen2.5-1.5B's config, random weights, bf16, CUDA
    python benchmarks/bench_decode_graph.py --rows 8 64 --tokens 128 --sampler multinomial
    python benchmarks/bench_decode_graph.py --shape tiny --rows 2 --tokens 8 --reps 1   # a CPU smoke run

The floor: the read bandwidth is measured once (the faster of a warm reduction and a warm copy of a buffer the
weights' size, up to 1 GiB, timed with CUDA events: `floors.read_bandwidth`), and one read of the weights is their
bytes over it. A step under that floor is a measurement bug: it is printed as one (MEASUREMENT BUG, exit status 1),
never as a ratio below 1. Random weights rarely sample EOS, so every row runs all ``--tokens`` steps in every arm
(the same work). Arms take turns per row count; each figure is the median over ``--reps`` of the whole decode's
time (CUDA events) divided by its steps, so it includes the prefill and, for the graph, its capture.

The steady-state replayed step (issue 47's target) is read without touching the library's loop: the graph arm
also decodes half as many tokens (``static-graph-half``, a second shape whose graph is kept beside the first), and
from the second repetition on (both graphs kept from the first, so no capture, the same prefill) each repetition
gives (time of the full decode - time of the half) / (steps - half steps): the prefill and the call's fixed costs
cancel, what is left is a replayed step with its sampling and host work.

``--compile BACKEND`` adds an arm, ``compiled-graph``: the same fixed-shape decode with the model's forward passed
through ``torch.compile(model, backend=BACKEND, dynamic=False)`` before the step is captured (inductor on a GPU
fuses the step's elementwise kernels: RMSNorm, the rotary embedding, SiLU, the residual adds). Its figure is the
whole decode over its steps, the median over the repetitions (the first compiles and captures: run 3 or more), and
the line says whether its tokens equal the uncompiled graph's (fused kernels round differently, so they need not).

Samplers (``--sampler``): ``per-row`` (`sampling.per_row_choice`, one seeded generator a row, as evaluation's
per-sample seeds), ``multinomial`` (`sampling.multinomial_choice`, training's draw on the global generator) and
``counter`` (`counter.counter_choice`: noise hashed from seed, step and index on the device, the draw recorded inside
the replayed step, so a replay returns the tokens).

The capture's cost: each line ends with the seconds the graph arms spent recording their steps in the first
repetition (`DecodeStats.capture_seconds`: the warm-up step and the capture, synchronised on both ends), one graph per
shape (``static-graph`` and ``static-graph-half`` are two shapes), and none later (the graphs are kept).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from floors import Stopwatch, any_bug, floor_ratio_text, parameter_bytes, probe_bytes, profile_ops, read_bandwidth

SHAPES = {  # Qwen2.5-1.5B's config (its config.json); `tiny` only checks that the benchmark runs
    "qwen1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2, head_dim=128),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
}  # fmt: skip


def _model(shape: str, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], tie_word_embeddings=True, eos_token_id=0, pad_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(dtype).eval()


def _choose(sampler: str, seeds: list[int], device: torch.device):
    from gtpo.decoding.counter import counter_choice
    from gtpo.decoding.sampling import multinomial_choice, per_row_choice

    if sampler == "counter":
        return counter_choice(seeds, device=device)
    return per_row_choice(seeds, device=device) if sampler == "per-row" else multinomial_choice(True)


SAMPLERS = ("per-row", "multinomial", "counter")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen1.5b")
    parser.add_argument(
        "--sampler", choices=SAMPLERS, default="per-row",
        help="per-row: a seeded generator a row (evaluation's default); multinomial: the global generator (training's);"
        " counter: noise hashed from (seed, step, index), drawn inside the replayed step",
    )  # fmt: skip
    parser.add_argument(
        "--compile", default=None, metavar="BACKEND",
        help="add the arm compiled-graph: the model's forward through torch.compile(backend=BACKEND) before capture",
    )  # fmt: skip
    parser.add_argument(
        "--profile", action="store_true",
        help="after the timing, profile one warm static-graph decode at the last row count (torch.profiler: the top "
        "ops by device time, then by host time), to show where a replayed step's time goes",
    )  # fmt: skip
    args = parser.parse_args(argv)
    from gtpo.decoding.graph import decode_static
    from gtpo.decoding.sampling import DecodeStats, decode

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = _model(args.shape, device, dtype)
    weight_bytes = parameter_bytes(model)
    bandwidth = read_bandwidth(device.type, probe_bytes(weight_bytes), dtype)
    floor = weight_bytes / bandwidth
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(
        f"device {name}, {str(dtype).removeprefix('torch.')}, {args.shape} config, sampler {args.sampler}; read "
        f"bandwidth {bandwidth / 1e9:.0f} GB/s (faster of a warm reduction and copy of "
        f"{probe_bytes(weight_bytes) / 2**20:.0f} MiB); weights {weight_bytes / 1e9:.4g} GB, so one read of the "
        f"weights (the floor) {1e3 * floor:.3f} ms"
    )
    stats: dict[str, DecodeStats] = {}  # each arm's, of the repetition running (the capture's cost)
    arms = {
        "decode": lambda p, s: decode(model, p, _choose(args.sampler, s, device), args.tokens, [0], 1),
        "static-eager": lambda p, s: decode_static(
            model, p, _choose(args.sampler, s, device), args.tokens, [0], 1, use_graph=False
        ),
        "static-graph": lambda p, s: decode_static(
            model, p, _choose(args.sampler, s, device), args.tokens, [0], 1, stats=stats["static-graph"]
        ),
        "static-graph-half": lambda p, s: decode_static(
            model, p, _choose(args.sampler, s, device), args.tokens // 2, [0], 1, stats=stats["static-graph-half"]
        ),
    }
    if args.compile:
        compiled = torch.compile(model, backend=args.compile, dynamic=False)
        arms["compiled-graph"] = lambda p, s: decode_static(
            compiled, p, _choose(args.sampler, s, device), args.tokens, [0], 1, stats=stats["compiled-graph"]
        )
    watch = Stopwatch(device.type)
    printed = []
    for rows in args.rows:
        prompts = [list(range(2, 2 + args.prompt))] * rows
        seeds = list(range(rows))
        calls = {name: [] for name in arms}  # (seconds, steps) of each call
        outputs = {}
        captured = {}  # graph arm -> (steps recorded, seconds) in the first repetition
        for rep in range(args.reps):
            stats.update({arm: DecodeStats() for arm in arms})
            for arm, run in arms.items():
                if args.sampler == "multinomial":  # the same global draws in every arm
                    torch.manual_seed(0)
                watch.sync()
                start = watch.mark()
                outputs[arm] = run(prompts, seeds)
                end = watch.mark()
                calls[arm].append((watch.seconds(start, end), max(len(c) for c in outputs[arm])))
                if rep == 0 and stats[arm].captures:
                    captured[arm] = (stats[arm].captures, stats[arm].capture_seconds)
        same = outputs["static-graph"] == outputs["static-eager"]
        compiled_same = outputs["compiled-graph"] == outputs["static-graph"] if args.compile else None
        step = {
            arm: statistics.median(seconds / steps for seconds, steps in timed)
            for arm, timed in calls.items()
            if arm != "static-graph-half"
        }
        steady = steady_step(calls["static-graph"], calls["static-graph-half"])
        if steady is not None:
            step["steady replayed graph"] = steady
        line = ", ".join(f"{arm} {1e3 * s:.2f} ms" for arm, s in step.items())
        if steady is None:
            line += f", steady replayed graph not measured (under {MIN_STEADY_STEPS} steps between the two decodes)"
        against = "; ".join(floor_ratio_text(arm, s, floor, "the floor") for arm, s in step.items())
        printed.append(against)
        # With the global generator the graph draws from the same distribution, not the same numbers, as eager.
        expected = "expected" if args.sampler != "multinomial" else "not expected with the global generator"
        compiled_text = "" if compiled_same is None else f"; compiled graph tokens == graph tokens: {compiled_same}"
        print(
            f"{rows} rows, {args.tokens} tokens: a token step {line}; {against}; graph tokens == eager static "
            f"tokens: {same} ({expected}){compiled_text}; {capture_text(captured)}"
        )
    if args.profile:  # the graph of this shape is kept from the timing above, so this profiles replays, no capture
        profile_decode(lambda: arms["static-graph"](prompts, seeds), device, f"{rows} rows, {args.tokens} tokens")
    if any_bug(printed):
        sys.exit("a step came out under one read of the weights: the timing or the byte count is wrong (above)")


def capture_text(captured: dict[str, tuple[int, float]]) -> str:
    """The capture's cost as printed: per graph arm the seconds its first repetition spent recording steps.

    Args:
        captured: graph arm -> (steps recorded, seconds), from `DecodeStats.captures` and ``capture_seconds``.
    """
    if not captured:
        return "graph capture: nothing recorded (no recorder on this device)"
    return "graph capture " + ", ".join(
        f"{arm} {1e3 * seconds:.1f} ms ({count} graph{'s' if count != 1 else ''})"
        for arm, (count, seconds) in captured.items()
    )


def profile_decode(run, device: torch.device, what: str) -> None:
    """Print torch.profiler's table of one call of ``run`` (a warm static-graph decode): by device time (the
    replayed graphs' kernels and the sampling's, as CUPTI reports them) and by host time (launches, syncs)."""
    table = profile_ops(run, device.type)
    if device.type == "cuda":
        print(f"profile of one static-graph decode ({what}), by device time:")
        print(table.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))
    print(f"profile of one static-graph decode ({what}), by host time:")
    print(table.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))


MIN_STEADY_STEPS = 16
"""Fewest steps between the full and the half decode for the steady step to be read from their difference: over a
handful of steps the difference of two timings is their noise (a CPU smoke run at 4 tokens gave -0.12 ms a step, under
the floor), so the figure is not given rather than printed as a measurement bug it is not."""


def steady_step(full: list[tuple[float, int]], half: list[tuple[float, int]]) -> float | None:
    """The median over repetitions of (full decode - half decode) / (their step difference), from the second
    repetition on when there are several (the first captures both graphs); None where the step counts differ by
    fewer than :data:`MIN_STEADY_STEPS` (rows that ended as early in both, or a smoke run of a few tokens: nothing
    to difference, or only noise).

    Args:
        full, half: (seconds, steps) of each repetition's call, in order.
    """
    pairs = list(zip(full, half, strict=True))
    warm = pairs[1:] if len(pairs) > 1 else pairs
    per_step = [(tf - th) / (sf - sh) for (tf, sf), (th, sh) in warm if sf - sh >= MIN_STEADY_STEPS]
    return statistics.median(per_step) if per_step else None


if __name__ == "__main__":
    main()
