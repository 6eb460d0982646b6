"""The training step's forward and backward (issue 29's part), GTPO against stock TRL, on replayed completions.

    python benchmarks/bench_loss_step.py --shape default   # SmolLM2-135M, 1 prompt x G=8, <= 96 tokens, LoRA r=16
    python benchmarks/bench_loss_step.py --shape paper-vocab --temperature 0.7   # vocabulary 151,936, 2 layers
    python benchmarks/bench_loss_step.py --shape qwen1.5b --temperature 0.7      # Qwen2.5-1.5B's config, on a GPU
    python benchmarks/bench_loss_step.py --shape qwen3b --temperature 0.7        # Qwen2.5-3B's config, on a GPU
    python benchmarks/bench_loss_step.py --arms gtpo gtpo-bf16 trl   # float32 against bfloat16 (`dtype: auto`)
    python benchmarks/bench_loss_step.py --shape qwen1.5b --baseline-commit ca8ead9   # this tree's GTPO against
                                                                                     # ca8ead9's, same process
    python benchmarks/bench_loss_step.py --shape tiny --reps 6      # a check that it runs (CPU)

Both arms score the SAME completions (sampled once, then replayed), so they do the same work whatever the policy:
- `trl`: stock `trl.GRPOTrainer` (loss_type="grpo", beta=0): TRL's padded layout;
- `gtpo`: `GTPOTrainer` as shipped (prefix sharing on, the single-pass head at T != 1);
- `gtpo-padded`: `GTPOTrainer` with `use_prefix_sharing=False`, to split the gain between layout and loss;
- `gtpo-flex` (not run by default): `gtpo` with every micro-batch packed (`GTPO_PREFIX_LAYOUT=packed`) and the
  packed layout's attention by FlexAttention's block mask (`GTPO_PACKED_ATTENTION=flex`, `gtpo.forward.flex`), both
  set only while its arm runs; transformers compiles flex attention on the first call, in the warm-up repetition.
  A line says how often transformers' flex attention ran, or why the arm fell back to the dense mask (on a CPU,
  where torch has no flex backward, always);
- `gtpo-bf16` (not run by default): `gtpo` with the base model's weights in bfloat16, as `dtype: bfloat16` (or
  `auto` on a CPU with bf16 units) trains it; the LoRA adapters stay float32, as peft keeps them;
- `gtpo@SHA` (with `--baseline-commit SHA` or `--baseline-src DIR`): `gtpo` as another version of the package has
  it. Its source is extracted from the history (`git archive SHA src`) into a temporary folder, imported under the
  same name, and swapped into `sys.modules` while its arm runs (so its own imports, even lazy ones, resolve to
  it), beside this tree's `gtpo` in one process on the same device: a regression between two commits shows as a
  ratio with its interval. `--baseline-src DIR` takes a folder holding another version's `gtpo/` package instead
  (a machine without the git history).
Each repetition times, arm after arm (the order rotating by one each repetition), `compute_loss` (the forward;
GTPO's own work, spans and `core.gtpo_loss`, is timed inside it by the host clock and printed apart) and
`loss.backward()` on one micro-batch of the generation batch. No optimizer step is taken, so the weights, and so
every arm's inputs, stay the same. Times are CUDA events on a GPU (the device's clock, no host jitter) and the wall
clock on a CPU.

The figure: each arm's forward + backward divided by the reference arm's (`--reference`, TRL's by default) IN THE
SAME REPETITION, and the median of those ratios with its 95 % sign-test interval and the spread of the single
ratios (benchmarks/ratio_stats.py); the forward alone the same way. Between repetitions the card's clock and the
host's load move (TRL's own forward took 39.6-60.5 ms over runs of one commit on one H100, issue 47); within one
they hit both arms. 30 repetitions (the default on a GPU) give an interval of about ±2 % where one ratio scatters
by 5 %; fewer than 6 give none.

Shapes:
- `default`: the default recipe's (recipes/smollm2/synthetic/gtpo.yaml): SmolLM2-135M-Instruct (the offline GGUF),
  one real synthetic prompt with the paper's system prompt and one worked example, G = 8 completions sampled from
  the model (seed 0, at most 96 tokens, stopping at EOS), LoRA r = 16 on all seven projections, float32.
- `paper-vocab`: Qwen2.5-1.5B's config with its 151,936-token vocabulary, reduced to 2 layers of width 256 with 4
  attention heads and 2 key-value heads (head dim 64), G = 8 completions of 128-256 random tokens after a
  203-token prompt (60 words in the tiny tokenizer's chat template), full fine-tuning, float32 on CPU (bf16 on CUDA).
- `qwen1.5b`: the same prompt and completions on Qwen2.5-1.5B's whole config (28 layers of width 1,536, 12 heads,
  2 key-value heads, tied 151,936-token head), random weights, full fine-tuning; meant for a GPU (bf16).
- `tiny`: the paper-vocab batch's prompt with 8 completions of 16-32 tokens on a 2-layer model of width 64 and
  vocabulary 512 (the tiny tokenizer's): only to check that the benchmark runs (on a CPU; its times are no figure).
- `qwen3b`: Qwen2.5-3B's whole config (36 layers of width 2,048, 16 heads, 2 key-value heads, MLP 11,008, tied
  151,936-token head), G = 8 completions of 256-512 random tokens after the same 203-token prompt (three arms at
  1,024 tokens did not fit an 80 GB GPU), random weights, full fine-tuning; meant for a GPU (bf16).

The roofline line divides the step's FLOPs by this device's measured matmul rate (benchmarks/floors.py: a warm
2048^3 matmul on a CPU, 8192^3 on a GPU, the fastest of 5, in each arm's weight dtype, the fastest dtype
counting): the FLOPs that are needed (each prompt once, each completion token once, the LM head on scored
positions) and those TRL's layout computes (forward + backward = 3 x forward). The fastest arm under the needed
FLOPs' time would be a measurement bug and is printed as one (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from bench_head import cpu_name, seconds
from floors import Stopwatch, any_bug, floor_ratio_text, matmul_rate, profile_ops
from ratio_stats import paired_ratios, summarize

SHAPES = ("default", "paper-vocab", "qwen1.5b", "qwen3b", "tiny")
ARMS = ("trl", "gtpo", "gtpo-padded", "gtpo-bf16", "gtpo-flex")
# The environment an arm's scoring runs under, set around its calls only (read by gtpo at every decision).
ARM_ENV = {"gtpo-flex": {"GTPO_PREFIX_LAYOUT": "packed", "GTPO_PACKED_ATTENTION": "flex"}}
BASELINE_ARM = "gtpo@"  # + the commit (or folder) of --baseline-commit / --baseline-src
MIN_REPS_FOR_INTERVAL = 6  # the sign-test interval's least count at 95 % (ratio_stats.median_rank)


def _model_and_batch(shape: str, device: str):
    """(base model, tokenizer, prompt messages, list of G completion id lists, lora rank or None)."""
    import torch

    from gtpo.models import load_model, load_tokenizer

    if shape == "default":
        from gtpo.tasks import load_task

        model = load_model("smollm2", dtype=torch.float32)
        tokenizer = load_tokenizer("smollm2")
        row = load_task("synthetic", "train", few_shot=1)[0]
        prompt = row["prompt"]
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(
                ids.repeat(8, 1), do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=96,
                pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        completions = []
        for row_ids in out[:, ids.size(1) :].tolist():
            if tokenizer.eos_token_id in row_ids:
                row_ids = row_ids[: row_ids.index(tokenizer.eos_token_id) + 1]
            completions.append(row_ids)
        return model, tokenizer, prompt, completions, 16
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer("tiny")  # ids < 512 are valid in the 151,936-token vocabulary
    if shape == "qwen1.5b":  # Qwen2.5-1.5B's config (its config.json), random weights
        width = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                     num_key_value_heads=2, head_dim=128)  # fmt: skip
    elif shape == "qwen3b":  # Qwen2.5-3B's config (its config.json), random weights
        width = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                     num_key_value_heads=2, head_dim=128)  # fmt: skip
    elif shape == "tiny":
        width = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16)  # fmt: skip
    else:
        width = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64)  # fmt: skip
    config = Qwen2Config(
        vocab_size=512 if shape == "tiny" else 151936, **width, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: 1.5B parameters take minutes on a CPU
        model = Qwen2ForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    words = " ".join(f"w{i}" for i in range(60))
    prompt = [{"role": "user", "content": f"Add these: {words}"}]
    generator = torch.Generator().manual_seed(0)
    low, high = {"qwen3b": (256, 512), "tiny": (16, 32)}.get(shape, (128, 256))
    lengths = torch.randint(low, high + 1, (8,), generator=generator).tolist()
    completions = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in lengths]
    return model, tokenizer, prompt, completions, None


def arm_environment(arm: str):
    """:data:`ARM_ENV`'s variables for ``arm`` set within the block, and the environment restored after it."""
    return mock.patch.dict(os.environ, ARM_ENV.get(arm, {}))


def scratch_dir(arm: str) -> str:
    """A fresh temporary output folder for an arm's trainer. An arm's name can hold a path (``gtpo@DIR`` from
    --baseline-src), so its characters other than letters, digits, ``.``, ``_`` and ``-`` become ``_`` in the prefix
    (a ``/`` there would name a folder that does not exist)."""
    return tempfile.mkdtemp(prefix=f"bench-loss-{re.sub(r'[^A-Za-z0-9._-]', '_', arm)}-")


def _trainer(arm: str, base, tokenizer, prompt, completions, lora, temperature, device):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from gtpo import GTPOConfig, GTPOTrainer

    class Replay:
        """Generation replaced by the fixed completions (the same for every arm)."""

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            return [list(completions[i % len(completions)]) for i in range(len(prompt_ids))], None

    group = len(completions)
    common = dict(
        output_dir=scratch_dir(arm), per_device_train_batch_size=group,
        num_generations=group, max_completion_length=max(len(c) for c in completions), temperature=temperature,
        learning_rate=0.0, report_to=[], save_strategy="no", seed=0, disable_tqdm=True, use_cpu=device == "cpu",
        bf16=device == "cuda", logging_steps=1,
    )  # fmt: skip
    if arm == "trl":
        args, cls = GRPOConfig(**common, loss_type="grpo", beta=0.0), GRPOTrainer
    else:
        args = GTPOConfig(**common, initial_entropy=1.0, use_prefix_sharing=arm != "gtpo-padded")
        cls = GTPOTrainer
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=lora, lora_alpha=2 * lora, task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )  # fmt: skip

    def reward(completions, **kwargs):  # spread, so advantages and GTPO's spans are not all zero
        return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]

    model = copy.deepcopy(base)
    if arm.endswith("-bf16"):
        import torch

        model = model.to(torch.bfloat16)
    trainer = type(f"Replay{cls.__name__}", (Replay, cls), {})(
        model=model, reward_funcs=reward, args=args, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": [prompt] * 4}), peft_config=peft_config,
    )  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(), which this does not run
    with arm_environment(arm):
        batch = trainer._generate_and_score_completions([{"prompt": prompt}] * group)
    return trainer, batch


def _flops(config, prompt_tokens: int, completion_lengths: list[int], padded_width: int | None) -> float:
    """Forward + backward FLOPs (3 x forward) of scoring the batch: backbone projections, attention, LM head."""
    text = config.get_text_config()
    hidden, layers = text.hidden_size, text.num_hidden_layers
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    kv = text.num_key_value_heads
    per_token = 2 * layers * (hidden * (2 * heads * head_dim + 2 * kv * head_dim) + 3 * hidden * text.intermediate_size)
    head = 2 * hidden * text.vocab_size * sum(completion_lengths)
    if padded_width is None:  # what is needed: the prompt once, each completion token once, causal attention
        tokens = prompt_tokens + sum(completion_lengths)
        pairs = prompt_tokens**2 / 2 + sum(n * prompt_tokens + n * n / 2 for n in completion_lengths)
    else:
        tokens = len(completion_lengths) * padded_width
        pairs = len(completion_lengths) * padded_width**2
    return 3 * (tokens * per_token + 4 * layers * heads * head_dim * pairs + head)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="default")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--reps", type=int, default=None,
        help="timed repetitions after one warm-up (default 30 on a GPU, 6 on a CPU; at least 6 for an interval)",
    )  # fmt: skip
    parser.add_argument("--arms", nargs="+", default=list(ARMS[:3]), choices=ARMS)
    parser.add_argument("--reference", choices=ARMS, default=None, help="the arm ratios are taken against (trl)")
    baseline = parser.add_mutually_exclusive_group()
    baseline.add_argument("--baseline-commit", metavar="SHA", help="add the arm gtpo@SHA: that commit's gtpo")
    baseline.add_argument("--baseline-src", metavar="DIR", help="add the arm gtpo@DIR: the gtpo package in DIR")
    parser.add_argument(
        "--profile", nargs="*", default=[], choices=ARMS,
        help="after the timing, profile one forward + backward of these arms (torch.profiler, top ops by host time)",
    )  # fmt: skip
    options = parser.parse_args(argv)
    if options.reps is not None and options.reps < 1:
        parser.error(f"--reps {options.reps}: give at least 1 (6 or more for an interval)")
    if options.reference is None:
        options.reference = "trl" if "trl" in options.arms else options.arms[0]
    elif options.reference not in options.arms:
        parser.error(f"--reference {options.reference} is not among --arms {' '.join(options.arms)}: add it")
    return options


def _versions(options) -> dict:
    """Arm name -> the `CodeVersion` its trainer is built and run under: this tree's gtpo for the usual arms, and
    another commit's for the ``gtpo@...`` arm when asked."""
    from code_versions import CodeVersion, extract_commit

    current = CodeVersion.current("gtpo")
    versions = {arm: current for arm in options.arms}
    if options.baseline_commit:
        source = extract_commit(options.baseline_commit, "src", repository=Path(__file__).resolve().parents[1])
        versions[BASELINE_ARM + options.baseline_commit] = CodeVersion.load("gtpo", source, options.baseline_commit)
    elif options.baseline_src:
        versions[BASELINE_ARM + options.baseline_src] = CodeVersion.load("gtpo", options.baseline_src,
                                                                         options.baseline_src)  # fmt: skip
    return versions


def _time_own_work(versions) -> dict:
    """Accumulate the host time spent in GTPO's own work (conflict spans, core's loss) of every version."""
    own = {"t": 0.0}
    for version in {id(v): v for v in versions.values()}.values():
        with version.active():
            from gtpo import core

            for name in ("conflict_spans", "gtpo_loss"):
                original = getattr(core, name)

                def timed(*args, _original=original, **kwargs):
                    start = time.perf_counter()
                    result = _original(*args, **kwargs)
                    own["t"] += time.perf_counter() - start
                    return result

                setattr(core, name, timed)
    return own


def turn_order(arms: list[str], rep: int) -> list[str]:
    """The arms' order in repetition ``rep``: rotated by one each repetition, so that over the repetitions every
    arm runs in every position equally often (to within one). Where the step waits on the host (the 2-layer shape
    on a GPU), a fixed order can favour a position: on one H100 (2026-11-28) two arms that took the same padded
    path differed by 1.18x in fixed order (trl, gtpo, gtpo-padded)."""
    shift = rep % len(arms)
    return arms[shift:] + arms[:shift]


def _time_arms(trainers, versions, reps: int, device: str) -> dict:
    """Per arm, per timed repetition: ``forward``, ``backward`` and GTPO's ``own`` seconds. Arms take turns within
    each repetition, in an order that rotates by one each repetition (:func:`turn_order`); repetition 0 warms up
    and is dropped."""
    watch = Stopwatch(device)
    own = _time_own_work(versions)
    times = {arm: {"forward": [], "backward": [], "own": []} for arm in trainers}
    for rep in range(reps + 1):
        for arm in turn_order(list(trainers), rep):
            trainer, batch = trainers[arm]
            with versions[arm].active(), arm_environment(arm):
                own["t"] = 0.0
                trainer.model.zero_grad(set_to_none=True)
                watch.sync()
                start = watch.mark()
                loss = trainer.compute_loss(trainer.model, batch)
                middle = watch.mark()
                loss.backward()
                end = watch.mark()
                forward, backward = watch.seconds(start, middle), watch.seconds(middle, end)
            if rep:
                times[arm]["forward"].append(forward)
                times[arm]["backward"].append(backward)
                times[arm]["own"].append(own["t"])
    return times


@contextlib.contextmanager
def _count_flex_calls():
    """Within the block, count the calls of transformers' flex attention (one per layer and forward, the gtpo-flex
    arm's only: no other arm hands a layer a block mask). Yields a list, one entry a call."""
    import transformers.integrations.flex_attention as integration

    calls = []
    forward = integration.flex_attention_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    integration.flex_attention_forward = counted
    try:
        yield calls
    finally:
        integration.flex_attention_forward = forward


def _flex_line(trainer, calls: list, runs: int) -> str:
    """Whether the gtpo-flex arm ran flex attention: its calls over the timed runs against the model's layers, and the
    reasons it fell back to the dense mask, if any (logged once each by gtpo.trainer.prefix_sharing)."""
    layers = trainer.model.config.get_text_config().num_hidden_layers
    notes = sorted(trainer.__dict__.get("_prefix_sharing_notes", ()))
    fell_back = "; ".join(notes) if notes else "never"
    return (
        f"gtpo-flex attention: transformers' flex attention ran {len(calls)} times in {runs} runs of forward and "
        f"backward ({len(calls) / runs:.1f} a run; {layers} layers); fell back to the dense mask: {fell_back}"
    )


def _ratio_lines(times, reference: str, reps: int) -> list[str]:
    """Per arm, its forward + backward and its forward against ``reference``'s in the same repetitions: the median
    ratio with its interval and spread (fewer than MIN_REPS_FOR_INTERVAL repetitions: the median alone)."""

    def describe(ratios):
        if len(ratios) < MIN_REPS_FOR_INTERVAL:
            return f"{statistics.median(ratios):.3f}x (median of {len(ratios)}; no interval under 6 repetitions)"
        return summarize(ratios).text()

    total = {arm: [f + b for f, b in zip(t["forward"], t["backward"], strict=True)] for arm, t in times.items()}
    lines = []
    for arm in times:
        if arm == reference:
            continue
        lines.append(f"{arm} / {reference}, forward + backward: "
                     f"{describe(paired_ratios(total[arm], total[reference]))}")  # fmt: skip
        lines.append(f"{arm} / {reference}, forward: "
                     f"{describe(paired_ratios(times[arm]['forward'], times[reference]['forward']))}")  # fmt: skip
    baseline = [arm for arm in times if arm.startswith(BASELINE_ARM)]
    if baseline and "gtpo" in times:
        lines.append(f"gtpo / {baseline[0]}, forward + backward: "
                     f"{describe(paired_ratios(total['gtpo'], total[baseline[0]]))}")  # fmt: skip
    return lines


def main(argv=None) -> None:
    import torch

    from gtpo.models import cpu_computes_bf16

    options = _parse(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reps = options.reps or (30 if device == "cuda" else MIN_REPS_FOR_INTERVAL)
    versions = _versions(options)
    base, tokenizer, prompt, completions, lora = _model_and_batch(options.shape, device)
    trainers = {}
    for arm, version in versions.items():
        with version.active():
            trainers[arm] = _trainer(arm, base, tokenizer, prompt, completions, lora, options.temperature, device)
    with _count_flex_calls() as flex_calls:
        times = _time_arms(trainers, versions, reps, device)
    batch = trainers[options.arms[0]][1]
    prompt_tokens = int(batch["prompt_mask"][0].sum())
    lengths = batch["completion_mask"].sum(1).tolist()
    bf16 = cpu_computes_bf16() if device == "cpu" else torch.cuda.is_bf16_supported()
    name = torch.cuda.get_device_name() if device == "cuda" else cpu_name()

    def weight_dtype(trainer):
        return trainer.model.get_input_embeddings().weight.dtype

    dtype = str(weight_dtype(trainers[options.arms[0]][0])).removeprefix("torch.")
    print(
        f"device: {name} ({torch.get_num_threads()} threads), bf16 units: {bf16}, dtype: {dtype}; "
        f"shape {options.shape}: "
        f"prompt {prompt_tokens} tokens, G = {len(lengths)}, completion lengths {lengths} (padded to "
        f"{batch['completion_ids'].size(1)}), T = {options.temperature}; {reps} repetitions timed with "
        f"{'CUDA events' if device == 'cuda' else 'the wall clock'}, arms taking turns; medians"
    )
    for arm, version in versions.items():
        if arm.startswith(BASELINE_ARM):
            print(f"{arm}: gtpo {version.label} imported from {version.origin()}, this tree's from "
                  f"{versions['gtpo' if 'gtpo' in versions else options.arms[0]].origin()}")  # fmt: skip
    medians = {arm: {k: statistics.median(v) for k, v in t.items()} for arm, t in times.items()}
    for arm, m in medians.items():
        print(
            f"{arm:12s} forward {seconds(m['forward'])} (GTPO's own {1e3 * m['own']:.1f} ms host time), backward "
            f"{seconds(m['backward'])}, forward+backward {seconds(m['forward'] + m['backward'])} "
            f"(weights {str(weight_dtype(trainers[arm][0])).removeprefix('torch.')})"
        )
    if "gtpo-flex" in trainers:
        print(_flex_line(trainers["gtpo-flex"][0], flex_calls, reps + 1))
    for line in _ratio_lines(times, options.reference, reps):
        print(line)
    for arm in options.profile:
        trainer, batch = trainers[arm]
        with arm_environment(arm):
            table = profile_ops(lambda t=trainer, b=batch: t.compute_loss(t.model, b).backward(), device)
        print(f"profile of {arm} (one forward + backward):")
        print(table.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    dtypes = {weight_dtype(trainer) for trainer, _ in trainers.values()}
    rate = max(matmul_rate(device, d) for d in dtypes)  # the fastest dtype an arm computes in: the lowest floor
    config = base.config
    needed = _flops(config, prompt_tokens, lengths, None)
    padded = _flops(config, prompt_tokens, lengths, int(batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)))
    best_arm = min(medians, key=lambda arm: medians[arm]["forward"] + medians[arm]["backward"])
    best = medians[best_arm]["forward"] + medians[best_arm]["backward"]
    against = floor_ratio_text(f"fastest arm ({best_arm}, {seconds(best)})", best, needed / rate,
                               "the needed FLOPs at the matmul rate")  # fmt: skip
    print(
        f"roofline: matmul {rate / 1e9:.0f} GFLOP/s measured (fastest of {sorted(str(d) for d in dtypes)}); needed "
        f"{needed / 1e9:.1f} GFLOP -> {seconds(needed / rate)}, TRL's padded layout {padded / 1e9:.1f} GFLOP -> "
        f"{seconds(padded / rate)}; {against}"
    )
    if any_bug([against]):
        sys.exit("the fastest arm came out under its FLOPs' time at the measured matmul rate: a timing bug (above)")


if __name__ == "__main__":
    main()
