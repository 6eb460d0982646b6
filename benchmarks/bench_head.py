"""The LM head with GTPO's temperature-1 entropy at a sampling temperature T != 1: one pass against two.

    python benchmarks/bench_head.py                       # Qwen2.5-1.5B's head: 1,024 × 1,536 × 151,936, T = 0.7
    python benchmarks/bench_head.py --tokens 256 --reps 2 # shorter

Arms, taking turns repetition by repetition on the same inputs (float32 on CPU, bf16 on CUDA):
- `trl`: TRL's chunked kernel once at T (what GRPO pays: log-probs and the sampling entropy);
- `two-pass`: TRL's kernel at T, then again at 1 (GTPO's head before issue 29);
- `one-pass`: `gtpo.forward.lm_head.token_scores` (both temperatures folded from each tile).
Each arm is timed forward alone and forward + backward (gradient of Σ log p + Σ H₁, the entropy term of
`entropy_term="differentiable"`; with the default `entropy_term`, only Σ log p carries a gradient). The
median over repetitions is printed, with each arm's ratio to `trl`.
"""

from __future__ import annotations

import argparse
import statistics
import time


def cpu_name() -> str:
    """The CPU's model name, printed with every figure: the project's machines differ (run.json records the same)."""
    from gtpo.runs.provenance import cpu_model_name

    return cpu_model_name() or "unknown CPU"


def synchronize(device: str) -> None:
    """Wait for the device's queued work: CUDA runs asynchronously, so a host clock read without this times the
    launches, not the work."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def seconds(value: float) -> str:
    """A duration with 4 significant digits: seconds on a CPU, milliseconds where a GPU makes them small."""
    return f"{value:.3f} s" if value >= 1 else f"{1e3 * value:.4g} ms"


def main(argv=None) -> None:
    import torch
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from gtpo.forward import lm_head
    from gtpo.models import cpu_computes_bf16

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backward", choices=("logprob", "differentiable"), default="logprob")
    options = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    generator = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(options.tokens, options.hidden, generator=generator).to(device, dtype)
    weight = (torch.randn(options.vocab, options.hidden, generator=generator) * 0.05).to(device, dtype)
    targets = torch.randint(0, options.vocab, (options.tokens,), generator=generator).to(device)
    t = options.temperature
    outputs = ("log_probs", "entropy")

    def trl(h, w):
        lp, ent, *_ = ChunkedLogProbFunction.apply(h, w, None, targets, t, 32768, None, 1.0, outputs)
        return lp, ent

    def two_pass(h, w):
        lp, _, *_ = ChunkedLogProbFunction.apply(h, w, None, targets, t, 32768, None, 1.0, outputs)
        _, ent, *_ = ChunkedLogProbFunction.apply(h, w, None, targets, 1.0, 32768, None, 1.0, outputs)
        return lp, ent

    def one_pass(h, w):
        scores = lm_head.token_scores(h, w, None, targets, t, differentiable_entropy=options.backward != "logprob")
        return scores.log_probs, scores.entropy

    arms = {"trl": trl, "two-pass": two_pass, "one-pass": one_pass}
    times = {(name, kind): [] for name in arms for kind in ("forward", "forward+backward")}

    for rep in range(options.reps + 1):  # the first repetition warms up and is not counted
        for name, arm in arms.items():
            with torch.no_grad():
                synchronize(device)
                start = time.perf_counter()
                arm(hidden, weight)
                synchronize(device)
                forward = time.perf_counter() - start
            h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            synchronize(device)
            start = time.perf_counter()
            lp, ent = arm(h, w)
            loss = lp.sum() + (ent.sum() if ent.requires_grad else 0)
            loss.backward()
            synchronize(device)
            both = time.perf_counter() - start
            if rep:
                times[(name, "forward")].append(forward)
                times[(name, "forward+backward")].append(both)
    bf16 = cpu_computes_bf16() if device == "cpu" else torch.cuda.is_bf16_supported()
    device_name = torch.cuda.get_device_name() if device == "cuda" else cpu_name()
    print(
        f"device: {device_name} ({torch.get_num_threads()} threads), bf16 units: {bf16}, dtype: "
        f"{str(dtype).removeprefix('torch.')}, head {options.tokens} x {options.hidden} x {options.vocab}, "
        f"T = {t}, backward of {options.backward}, median of {options.reps} repetitions (arms alternating)"
    )
    for kind in ("forward", "forward+backward"):
        base = statistics.median(times[("trl", kind)])
        cells = [f"{name} {seconds(statistics.median(times[(name, kind)]))}" for name in arms]
        ratios = [f"{name}/trl {statistics.median(times[(name, kind)]) / base:.3f}" for name in arms if name != "trl"]
        print(f"{kind:17s} " + ", ".join(cells) + " | " + ", ".join(ratios))


if __name__ == "__main__":
    main()
