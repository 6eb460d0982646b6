"""Generation of the default recipe (SmolLM2-135M, LoRA r=16, one prompt x G=8 x 96 tokens): today's path
against the candidates of issue 30, arms alternating, on the same seeds.

    python benchmarks/bench_generation.py              # float32 and bfloat16, 5 rounds (~15 min on 2 cores)
    python benchmarks/bench_generation.py --quick      # 2 rounds, arms generate, fast, fast+merged (~4 min)
    python benchmarks/bench_generation.py --dtype bfloat16 --arms generate,fast

Arms (each samples G completions of the recipe's first prompt, TRL's sampling settings: temperature 1):

- ``generate``: TRL's transformers path, ``model.generate`` on the LoRA model (the G rows each prefill the prompt,
  every row runs until the longest ends);
- ``continuous``: TRL's ``use_transformers_continuous_batching`` (``model.generate_batch``);
- ``prefill``: :func:`gtpo.decoding.sampling.decode` with ``drop_finished=False``: the prompt prefilled once, its cache
  copied to the G rows, ended rows still fed padding;
- ``fast``: :func:`gtpo.decoding.sampling.decode`: prefilled once and ended rows dropped (the training default);
- ``fast+merged``: ``fast`` with the LoRA weights folded into the base for generation
  (:func:`gtpo.decoding.sampling.merged_lora`, float32 only: in bf16 it leaves the model as it is), what training runs.

Each round runs every (dtype, arm) once, in a rotated order, each after ``torch.manual_seed(round)``, so that load
on a shared machine hits all alike, after ``--warmup`` untimed rounds. On a machine shared with other jobs, use
``--threads 1``: two torch threads on two busy cores measured anywhere from 1x to 30x slower, at random.
Printed per dtype and arm: the median wall time of a call, the tokens it kept,
and its time / that dtype's ``generate``. Then greedy decoding of 8 recipe prompts by both paths, and how many
tokens differ (near-ties that float rounding in another batch shape tips the other way).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from pathlib import Path

import torch

ARMS = ("generate", "continuous", "prefill", "fast", "fast+merged")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def cpu_line() -> str:
    """CPU model, cores torch uses, and whether it has bf16 units."""
    from gtpo.models import cpu_computes_bf16

    name = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"CPU {name}; torch threads {torch.get_num_threads()}; bf16 units {cpu_computes_bf16()}"


def load(model_name: str, dtype: str):
    """The recipe's policy: the model in ``dtype`` with a fresh LoRA adapter (r=16, alpha 32, the recipe's
    modules; B=0 as at step 0, so the adapter runs but changes nothing)."""
    from peft import LoraConfig, get_peft_model

    from gtpo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_name, dtype=getattr(torch, dtype))
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora).eval()
    return model, tokenizer


def recipe_prompt(tokenizer) -> list[int]:
    """Token ids of the default recipe's first training prompt (synthetic task, one worked example)."""
    from gtpo.tasks import load_task

    messages = load_task("synthetic", "train", few_shot=1)[0]["prompt"]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def trl_generation_config(tokenizer, tokens: int, do_sample: bool = True):
    """The GenerationConfig TRL's GRPOTrainer builds with GRPOConfig's defaults."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=tokens,
        do_sample=do_sample,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        disable_compile=True,
    )


def run_generate(model, tokenizer, prompt, group, tokens, do_sample=True) -> list[list[int]]:
    """TRL's transformers path: left-padded batch, ``generate``, cut after the first EOS."""
    ids = torch.tensor([prompt] * group)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=trl_generation_config(tokenizer, tokens, do_sample),
        )
    result = []
    for row in out[:, ids.shape[1] :].tolist():
        stop = next((i for i, t in enumerate(row) if t == tokenizer.eos_token_id), None)
        result.append(row if stop is None else row[: stop + 1])
    return result


def run_continuous(model, tokenizer, prompt, group, tokens) -> list[list[int]]:
    """TRL's ``use_transformers_continuous_batching`` path (``generate_batch``)."""
    with torch.no_grad():
        outputs = model.generate_batch(
            [prompt] * group, generation_config=trl_generation_config(tokenizer, tokens), progress_bar=False
        )
    return [o.generated_tokens for o in outputs.values()]


def run_decode(model, tokenizer, prompt, group, tokens, drop=True, merged=False, do_sample=True):
    from gtpo.decoding.sampling import decode, merged_lora, multinomial_choice

    with merged_lora(model) if merged else contextlib.nullcontext():
        return decode(
            model,
            [prompt] * group,
            multinomial_choice(do_sample),
            tokens,
            [tokenizer.eos_token_id],
            tokenizer.pad_token_id,
            drop_finished=drop,
        )


def call(arm, model, tokenizer, prompt, group, tokens):
    if arm == "generate":
        return run_generate(model, tokenizer, prompt, group, tokens)
    if arm == "continuous":
        return run_continuous(model, tokenizer, prompt, group, tokens)
    return run_decode(model, tokenizer, prompt, group, tokens, drop=arm != "prefill", merged=arm == "fast+merged")


def greedy_difference(model, tokenizer, prompts: list[list[int]], tokens: int) -> tuple[int, int, int]:
    """Greedy completions of ``prompts`` (one row each) by `generate` and by the fast path. Returns (rows that
    differ, tokens from the first difference on, tokens in all): near-ties that another batch shape rounds the
    other way."""
    from gtpo.decoding.sampling import decode, left_pad, multinomial_choice

    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=trl_generation_config(tokenizer, tokens, False)
        )
    ref = []
    for row in out[:, ids.shape[1] :].tolist():
        stop = next((i for i, t in enumerate(row) if t == tokenizer.eos_token_id), None)
        ref.append(row if stop is None else row[: stop + 1])
    new = decode(model, prompts, multinomial_choice(False), tokens, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    rows = tail = 0
    for a, b in zip(ref, new, strict=True):
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        rows += a != b
        tail += max(len(a), len(b)) - same
    return rows, tail, sum(len(a) for a in ref)


def decode_step_ms(model, prompt: list[int], rows: int = 8, steps: int = 30) -> float:
    """Milliseconds of one decoding step of ``rows`` rows after ``prompt`` (cache filled), greedy, averaged."""
    from transformers import DynamicCache

    ids = torch.tensor([prompt] * rows)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        token = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(steps):
            token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        return (time.perf_counter() - start) / steps * 1000


def bench(args) -> None:
    """Every (dtype, arm) once a round, dtypes and arms interleaved (rotated each round)."""
    dtypes = [d for d in args.dtype.split(",") if d]
    arms = [a for a in args.arms.split(",") if a]
    models = {d: load(args.model, d) for d in dtypes}
    prompt = recipe_prompt(models[dtypes[0]][1])
    slots = [(d, a) for a in arms for d in dtypes]
    times = {slot: [] for slot in slots}
    kept = {slot: [] for slot in slots}
    for r in range(-args.warmup, args.rounds):  # rounds < 0 warm up (first-call allocations, kernels), untimed
        for d, arm in slots[r % len(slots) :] + slots[: r % len(slots)]:
            if (d, arm) not in times:
                continue
            torch.manual_seed(r)
            start = time.perf_counter()
            try:
                completions = call(arm, *models[d], prompt, args.group, args.tokens)
            except Exception as err:  # an arm this machine cannot run is reported, then left out
                print(f"  {d} {arm}: failed: {type(err).__name__}: {str(err)[:200]}")
                del times[(d, arm)]
                continue
            if r >= 0:
                times[(d, arm)].append(time.perf_counter() - start)
                kept[(d, arm)].append(sum(len(c) for c in completions))
    step_ms = {d: [] for d in dtypes}
    for r in range(3):  # the decode step alone, dtypes interleaved; the first round warms up
        for d in dtypes if r % 2 == 0 else dtypes[::-1]:
            step_ms[d].append(decode_step_ms(models[d][0], prompt, args.group))
    for d in dtypes:
        print(f"  {d:8s} one decoding step of {args.group} rows (LoRA unmerged): {min(step_ms[d][1:]):.1f} ms")
    print(f"prompt {len(prompt)} tokens, G={args.group}, at most {args.tokens} tokens, {args.rounds} rounds")
    for d in dtypes:
        base = statistics.median(times[(d, "generate")]) if times.get((d, "generate")) else None
        for arm in arms:
            if (d, arm) not in times:
                continue
            t = statistics.median(times[(d, arm)])
            ratio = f"{t / base:.2f}x generate" if base else ""
            print(
                f"  {d:8s} {arm:12s} median {t:6.2f} s  (all: {', '.join(f'{x:.2f}' for x in times[(d, arm)])})  "
                f"tokens kept {statistics.mean(kept[(d, arm)]):5.0f}  {ratio}"
            )
    if args.greedy_check:
        from gtpo.tasks import load_task

        rows = load_task("synthetic", "train", few_shot=1).select(range(8))
        for d in dtypes:
            model, tokenizer = models[d]
            prompts = [
                tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
                for r in rows
            ]
            differ, tail, total = greedy_difference(model, tokenizer, prompts, args.tokens)
            print(
                f"  {d:8s} greedy, 8 prompts: {differ} of 8 completions differ between generate and fast, "
                f"{tail} of {total} tokens from the first difference on"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma-separated")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {ARMS}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, the cores)")
    parser.add_argument("--no-greedy-check", dest="greedy_check", action="store_false")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 2
        args.arms = "generate,fast,fast+merged"
    if args.threads:
        torch.set_num_threads(args.threads)
    print(cpu_line())
    bench(args)


if __name__ == "__main__":
    main()
