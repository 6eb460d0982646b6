"""TRL's generation (``model.generate``, the default recipe's 8 rows x 96 tokens, SmolLM2-135M with LoRA, float32) in
the main thread against the same call in a new thread, alternating, on a CPU.

    python benchmarks/bench_generate_thread.py                         # ~1.5 min on 2 cores, alone
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_generate_thread.py

Why: `benchmarks/bench_step.py`'s paired child runs both trainers in threads (they take turns step by step), and on a
2-core EPYC (2026-11-28) TRL's step was 41 % slower there than alone and gtpo's 21 %. This isolates the thread: if a
call is slower in a new thread than in the main one, the paired ratio measures the thread as well as the arms (TRL's
`generate` runs about three times as many small operator calls as gtpo's decode, so it pays more for each one's
hand-off). Under ``OMP_WAIT_POLICY=PASSIVE`` OpenMP's workers sleep instead of spinning between parallel regions,
which tells a hand-off cost from an allocator or cache one. Prints each call's seconds per place, and the CPU.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
from bench_generation import cpu_line, load, recipe_prompt, trl_generation_config


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="calls per place, alternating which goes first")
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args(argv)
    model, tokenizer = load("smollm2", "float32")
    prompt = recipe_prompt(tokenizer)
    config = trl_generation_config(tokenizer, args.tokens)
    config.min_new_tokens = args.tokens  # every row runs every step, in every call

    def generate() -> float:
        torch.manual_seed(0)
        ids = torch.tensor([prompt] * 8)
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return time.perf_counter() - start

    def in_thread() -> float:
        out = []
        thread = threading.Thread(target=lambda: out.append(generate()))
        thread.start()
        thread.join()
        return out[0]

    generate()  # warm-up, untimed
    seconds = {"main thread": [], "new thread": []}
    places = {"main thread": generate, "new thread": in_thread}
    for rep in range(args.reps):
        order = list(places) if rep % 2 == 0 else list(places)[::-1]
        for place in order:
            seconds[place].append(places[place]())
    print(f"{cpu_line()}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; 8 rows x {args.tokens} tokens")
    for place, values in seconds.items():
        print(f"{place}: {', '.join(f'{s:.2f}' for s in values)} s")


if __name__ == "__main__":
    main()
