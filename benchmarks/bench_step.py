"""Training-step time and peak memory of GTPOTrainer against TRL's GRPOTrainer, side by side.

Whole steps with sampling; the arms' completions diverge after the first step. For the step's scoring alone on
the SAME completions (the default recipe's shape and the paper-vocabulary shape of issue 29, with a roofline
line) see `benchmarks/bench_loss_step.py`; for generation, `benchmarks/bench_generation.py`; for the LM head with
GTPO's temperature-1 entropy, `benchmarks/bench_head.py` (docs/performance.md has their figures).

    python benchmarks/bench_step.py --model tiny            # CPU, a few minutes
    python benchmarks/bench_step.py --model smollm2          # CPU, SmolLM2-135M with LoRA (~10 min on 2 cores)
    python benchmarks/bench_step.py --model qwen1.5b-shape --device cuda   # GPU: Qwen2.5-1.5B shape, G=8, 1024 tokens
    python benchmarks/bench_step.py --model tiny --temperature 0.7   # + GTPO's temperature-1 entropy pass
    python benchmarks/bench_step.py --model tiny --option loss_type=cispo   # a GRPOConfig option in both arms
    python benchmarks/bench_step.py --model smollm2 --generations 8 --completion-length 96 --profile-generation

At a sampling `--temperature` other than 1, GTPO's entropies (Eq. 6-7) are the model's own, temperature 1,
which costs a second pass of the LM head (not of the model) over the same hidden states
(`gtpo.forward.untempered`); at temperature 1 that pass is skipped.

Both algorithms run with the same settings and seed: GTPO with its defaults (`GTPOConfig()`), GRPO as
TRL's `GRPOTrainer` with `loss_type="grpo"`, `beta=0` (the paper's GRPO; no reference model). Each
`--option KEY=VALUE` is set in both (e.g. `delta=2.0`, `loss_type=sapo`, `beta=0.04`: GTPO with that
GRPOConfig option against GRPO with the same option; issue 21's "ratio ≤ 1.05 with each option").
Completions are forced to `max_completion_length` tokens (`min_new_tokens`), so both generate the
same number of tokens whatever the policy.

- Step time: two worker processes, one trainer each in its process's main thread running its own
  `trainer.train()`, and a callback makes them take turns step by step (GTPO, GRPO, GTPO, …), so
  load on a shared machine hits both alike. A step is TRL's `step_time`: generation, scoring, loss
  and backward (the optimizer update, the same for both, is left out). R is the median, over the
  steps after `--warmup` (the first GTPO step also measures ⟨H⟩_ini), of each GTPO step's time
  divided by that of the GRPO step next to it; the paired run is done twice, GTPO first and GRPO
  first, because the first of each pair measured a few percent faster on a shared CPU.
- Each arm runs in a process's main thread, as a user runs it: through commit 93eb2a0 both trainers ran in threads of
  one process, where a CPU's OpenMP hand-offs are slower (`benchmarks/bench_generate_thread.py`) and TRL's step, with
  about three times as many small operator calls, paid more for them, so the paired ratios of earlier CPU records lean
  towards gtpo; the alone ratio (each arm in its own process, printed before the last line) is beside it to check.
- Peak memory: one fresh child process per algorithm running the same steps alone;
  `torch.cuda.max_memory_allocated` on CUDA, the process's peak resident set size on CPU.

The last line printed is

    gtpo/grpo step time ratio R, peak memory ratio M
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from floors import any_bug, floor_ratio_text

MODELS = ("tiny", "smollm2", "qwen1.5b-shape")

# Per model: prompts per step, G, completion tokens, LoRA rank (None: full fine-tuning).
SETTINGS = {
    "tiny": dict(prompts=2, generations=8, completion=64, lora=None),
    "smollm2": dict(prompts=1, generations=4, completion=64, lora=16),
    "qwen1.5b-shape": dict(prompts=1, generations=8, completion=1024, lora=None),
}

# Qwen2.5-1.5B's architecture (config.json of Qwen/Qwen2.5-1.5B-Instruct), random weights.
QWEN_15B_SHAPE = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="tiny")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="steps per run not measured")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--completion-length", type=int, default=None, help="override completion tokens")
    parser.add_argument("--generations", type=int, default=None, help="override G")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (TRL's default 1.0)")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a GRPOConfig option set in both arms (repeatable; VALUE read as YAML), e.g. delta=2.0, "
        "loss_type=cispo, importance_sampling_level=sequence, top_entropy_quantile=0.2, beta=0.04",
    )
    parser.add_argument(
        "--profile-generation",
        action="store_true",
        help="after the timing, run each arm alone once more and print torch.profiler's table of its last step's "
        "generation (where generation's time goes, against its weight-read floor); the timing lines are unchanged",
    )
    parser.add_argument("--child", choices=("gtpo", "grpo", "paired"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--first", choices=("gtpo", "grpo"), default="gtpo", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------- child


def _build_model(name: str, device: str):
    import torch

    from gtpo.models import load_model, load_tokenizer, tiny_model_dir

    if name == "tiny":
        return str(tiny_model_dir()), load_tokenizer("tiny")
    if name == "smollm2":
        model = load_model("smollm2")  # de-quantized GGUF, trainable (see gtpo.models)
        return model, load_tokenizer("smollm2")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer("tiny")  # ids < 512 are valid in the 151,936-token vocabulary
    config = Qwen2Config(
        **QWEN_15B_SHAPE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    return model, tokenizer


def _dataset(n: int):
    from datasets import Dataset

    from gtpo.tasks.prompts import SYSTEM_PROMPT

    prompts = [
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"What is {i} + {2 * i}?"}]
        for i in range(n)
    ]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(3 * i) for i in range(n)]})


def _options(options) -> dict:
    """--option KEY=VALUE pairs as GRPOConfig keyword arguments (values parsed as YAML: 2.0, sequence, true)."""
    import yaml

    parsed = {}
    for item in options.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--option {item!r}: write KEY=VALUE, e.g. --option delta=2.0")
        parsed[key.strip()] = yaml.safe_load(value)
    return parsed


def _settings(options) -> dict:
    settings = dict(SETTINGS[options.model])
    if options.completion_length:
        settings["completion"] = options.completion_length
    if options.generations:
        settings["generations"] = options.generations
    return settings


def spread_reward(completions, **kwargs):
    """Benchmark-only reward with spread (text length mod 4), so that advantages are non-zero and GTPO's
    spans and weights do real work even when the paper's rewards are 0 for every completion."""
    return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]


def _make_trainer(options, algorithm: str, model, tokenizer, callbacks):
    from trl import GRPOConfig, GRPOTrainer

    from gtpo import GTPOConfig, GTPOTrainer
    from gtpo.tasks.rewards import get_reward_funcs

    settings = _settings(options)
    group, prompts, length = settings["generations"], settings["prompts"], settings["completion"]
    steps = options.warmup + options.steps
    common = dict(
        output_dir=tempfile.mkdtemp(prefix=f"bench-step-{algorithm}-"),
        per_device_train_batch_size=prompts * group,
        num_generations=group,
        max_completion_length=length,
        generation_kwargs={"min_new_tokens": length},  # same token count for both algorithms
        max_steps=steps,
        temperature=options.temperature,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        disable_tqdm=True,
        use_cpu=options.device == "cpu",
        bf16=options.device == "cuda",
    )
    peft_config = None
    if settings["lora"]:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=settings["lora"],
            lora_alpha=2 * settings["lora"],
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            task_type="CAUSAL_LM",
        )
    extra = _options(options)  # the same GRPOConfig options in both arms
    if algorithm == "gtpo":
        args, trainer_cls = GTPOConfig(**common, initial_entropy_prompts=prompts * 4, **extra), GTPOTrainer
    else:
        args, trainer_cls = GRPOConfig(**common, **{"loss_type": "grpo", "beta": 0.0, **extra}), GRPOTrainer
    trainer = trainer_cls(
        model=model,
        reward_funcs=[*get_reward_funcs(("format", "accuracy")), spread_reward],
        args=args,
        train_dataset=_dataset(max(64, prompts * steps)),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    assert (trainer.ref_model is None) == (args.beta == 0.0)  # a reference model only for a KL term
    return trainer


def _step_times(trainer, warmup: int) -> list[float]:
    return [log["step_time"] for log in trainer.state.log_history if "step_time" in log][warmup:]


def _timed_core(device: str) -> dict:
    """Accumulate the time spent in GTPO's own work (spans over the gathered batch, core's loss)."""
    import torch

    from gtpo import core

    spent = {"spans": 0.0, "loss": 0.0}

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            spent[key] += time.perf_counter() - start
            return result

        return wrapper

    core.conflict_spans = timed(core.conflict_spans, "spans")
    core.gtpo_loss = timed(core.gtpo_loss, "loss")
    return spent


def _timed_parts(trainer, device: str) -> dict[str, list[float]]:
    """Per step, the seconds ``trainer`` spends in each part of `training_step`: ``generation``
    (`_generate_single_turn`), ``scoring`` (`_get_per_token_logps_and_entropies`: the loss's forward), ``loss``
    (the rest of `compute_loss`), ``backward`` (the rest of `training_step` after `compute_loss`) and ``rest``
    (rewards, advantages, GTPO's spans, batching: the rest of `_prepare_inputs`). Wraps the instance's methods."""
    import torch

    parts = {name: [] for name in ("generation", "scoring", "loss", "backward", "rest")}
    current: dict[str, float] = {}

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            sync()
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            sync()
            current[name] = current.get(name, 0.0) + time.perf_counter() - start
            return result

        return wrapper

    for name, method in (
        ("generation", "_generate_single_turn"),
        ("scoring", "_get_per_token_logps_and_entropies"),
        ("compute_loss", "compute_loss"),
        ("prepare", "_prepare_inputs"),
    ):
        setattr(trainer, method, timed(name, getattr(trainer, method)))
    step = trainer.training_step

    def training_step(*args, **kwargs):
        current.clear()
        sync()
        start = time.perf_counter()
        result = step(*args, **kwargs)
        sync()
        total = time.perf_counter() - start
        gen, scoring = current.get("generation", 0.0), current.get("scoring", 0.0)
        compute, prepare = current.get("compute_loss", 0.0), current.get("prepare", 0.0)
        # _prepare_inputs holds generation (and, off-policy, a scoring pass); compute_loss holds the loss's forward.
        parts["generation"].append(gen)
        parts["scoring"].append(scoring)
        parts["loss"].append(max(compute - scoring, 0.0))
        parts["rest"].append(max(prepare - gen, 0.0))
        parts["backward"].append(max(total - compute - prepare, 0.0))
        return result

    trainer.training_step = training_step
    return parts


def floors(model, device: str) -> dict[str, float]:
    """What the parts are measured against (benchmarks/floors.py): ``read_s``, one read of the model's weights (a
    decoding step reads them all at least once) at the device's read bandwidth, measured once on a warm buffer of
    the weights' size, and ``matmul_flops``, the rate of a large warm matmul in the model's dtype (forward and
    backward are mostly matmuls). Both are the fastest of their repetitions, so the floors are as low as the
    device allows."""
    from floors import matmul_rate, parameter_bytes, probe_bytes, read_bandwidth

    dtype = next(model.parameters()).dtype
    weight_bytes = parameter_bytes(model)
    bandwidth = read_bandwidth(device, probe_bytes(weight_bytes), dtype)
    return {
        "read_s": weight_bytes / bandwidth,
        "bandwidth": bandwidth,
        "matmul_flops": matmul_rate(device, dtype),
        "weight_bytes": weight_bytes,
        "weights": _matmul_weights(model),
    }


def _matmul_weights(model) -> int:
    """The parameters a token's forward multiplies by: all but an input embedding that is not tied to the head
    (a lookup, no FLOPs), so that 2 FLOPs per counted weight and token stays a floor."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    return total if head is not None and head.weight is embedding else total - embedding.numel()


def run_single(options) -> dict:
    """One algorithm alone in this process: its peak memory (and step times, for information)."""
    import torch
    from transformers import TrainerCallback

    class ResetPeak(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if options.device == "cuda":
                torch.cuda.reset_peak_memory_stats()

    model, tokenizer = _build_model(options.model, options.device)
    trainer = _make_trainer(options, options.child, model, tokenizer, [ResetPeak()])
    profiled = _profile_last_generation(trainer, options) if options.profile_generation else None
    trainer.train()
    if profiled is not None:
        return {"generation_profile": profiled["table"], "generation_s": profiled["seconds"]}
    if options.device == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(), "cuda max_memory_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS"
    return {"step_times": _step_times(trainer, options.warmup), "peak_memory_bytes": peak, "memory_kind": kind}


def _profile_last_generation(trainer, options) -> dict:
    """Wrap ``trainer``'s `_generate_single_turn` so that its first call in the last step runs under torch.profiler;
    the returned dict gets that call's ``table`` (host ops by self time; on CUDA by device time first) and its
    wall ``seconds`` (profiled, so slower than a timed step's) once training has run."""
    from floors import profile_ops

    generate, out = trainer._generate_single_turn, {}

    def wrapper(*args, **kwargs):
        if trainer.state.global_step != trainer.args.max_steps - 1 or out:
            return generate(*args, **kwargs)
        result = []
        start = time.perf_counter()
        averages = profile_ops(lambda: result.append(generate(*args, **kwargs)), options.device)
        out["seconds"] = time.perf_counter() - start
        sort = "self_cuda_time_total" if options.device == "cuda" else "self_cpu_time_total"
        out["table"] = averages.table(sort_by=sort, row_limit=20, max_name_column_width=60)
        return result[0]

    trainer._generate_single_turn = wrapper
    return out


ARMS = ("gtpo", "grpo")


def run_paired(options) -> dict:
    """Both trainers under the same load, taking turns step by step, each in its own process's main thread (in
    threads of one process, a CPU's OpenMP hand-offs are slower and TRL's many small calls pay more for them:
    `benchmarks/bench_generate_thread.py`). Two spawned workers share a turn (whose step runs) and hand it over at the
    start of their next step, so each trainer's logging after a step runs in its own turn."""
    import multiprocessing
    from queue import Empty

    context = multiprocessing.get_context("spawn")
    condition = context.Condition()
    turn = context.Value("i", ARMS.index(options.first))  # the arm whose step may run
    done = context.Array("b", len(ARMS))  # which arms have ended (or failed): the other no longer waits for them
    queue = context.Queue()
    ready = context.Barrier(len(ARMS))  # no step starts while the other arm still loads its model
    workers = [context.Process(target=_paired_worker, args=(options, name, condition, turn, done, queue, ready))
               for name in ARMS]  # fmt: skip
    for worker in workers:
        worker.start()
    results = {}
    while len(results) < len(workers):
        try:
            name, result = queue.get(timeout=10)
        except Empty:  # a worker killed outright (out of memory, a signal) reports nothing: do not wait for it forever
            dead = [n for n, w in zip(ARMS, workers, strict=True) if n not in results and w.exitcode not in (None, 0)]
            if dead:
                for worker in workers:
                    worker.kill()
                raise SystemExit(f"paired worker(s) {dead} died without a report (exit {workers[0].exitcode}, "
                                 f"{workers[1].exitcode}): out of memory?") from None  # fmt: skip
            continue
        results[name] = result
    for worker in workers:
        worker.join()
    failed = {name: r for name, r in results.items() if isinstance(r, str)}
    if failed:
        raise SystemExit(f"paired worker(s) failed: {failed}")
    gtpo, grpo = results["gtpo"], results["grpo"]
    return {
        "gtpo_step_times": gtpo["step_times"],
        "grpo_step_times": grpo["step_times"],
        "gtpo_spans_ms": gtpo["spans_ms"],
        "gtpo_loss_ms": gtpo["loss_ms"],
        "parts": {"gtpo": gtpo["parts"], "grpo": grpo["parts"]},
        "floors": gtpo["floors"],
    }


def _paired_worker(options, name, condition, turn, done, queue, ready) -> None:
    """One arm of :func:`run_paired` in this spawned process's main thread; puts (name, its figures) on ``queue``,
    or (name, the error's text) after releasing the other arm."""
    import torch
    from transformers import TrainerCallback

    me, other = ARMS.index(name), 1 - ARMS.index(name)

    class TakeTurns(TrainerCallback):
        def __init__(self):
            self.started = False

        def on_step_begin(self, args, state, control, **kwargs):
            with condition:
                if self.started:
                    turn.value = other
                    condition.notify_all()
                self.started = True
                condition.wait_for(lambda: turn.value == me or done[other])

        def on_train_end(self, args, state, control, **kwargs):
            release()

    def release():
        with condition:
            done[me] = 1
            turn.value = other
            condition.notify_all()

    try:
        if options.threads:
            torch.set_num_threads(options.threads)
        model, tokenizer = _build_model(options.model, options.device)
        spent = _timed_core(options.device) if name == "gtpo" else None
        floor = None
        if name == "gtpo":
            from gtpo.models import load_model

            floor = floors(load_model(model) if isinstance(model, str) else model, options.device)
        trainer = _make_trainer(options, name, model, tokenizer, [TakeTurns()])
        parts = _timed_parts(trainer, options.device)
        ready.wait(timeout=3600)
        trainer.train()
        steps = options.warmup + options.steps
        result = {
            "step_times": _step_times(trainer, options.warmup),
            "parts": {k: v[options.warmup :] for k, v in parts.items()},
            "spans_ms": 1e3 * spent["spans"] / steps if spent else None,
            "loss_ms": 1e3 * spent["loss"] / steps if spent else None,
            "floors": floor,
        }
    except BaseException as error:  # report it, and let the other arm finish its steps alone
        ready.abort()  # a worker still waiting to start is released (BrokenBarrierError: it reports and ends too)
        release()
        queue.put((name, f"{type(error).__name__}: {error}"))
        return
    queue.put((name, result))


def run_child(options) -> None:
    import torch

    if options.threads:
        torch.set_num_threads(options.threads)
    result = run_paired(options) if options.child == "paired" else run_single(options)
    result["threads"] = torch.get_num_threads()
    Path(options.out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------- parent


def _child(options, child: str, out: Path, env: dict, first: str = "gtpo") -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        child,
        "--out",
        str(out),
        "--model",
        options.model,
        "--device",
        options.device,
        "--steps",
        str(options.steps),
        "--warmup",
        str(options.warmup),
        "--first",
        first,
        "--temperature",
        str(options.temperature),
    ]
    if options.profile_generation and child != "paired":
        command.append("--profile-generation")
    for flag, value in (
        ("--threads", options.threads),
        ("--completion-length", options.completion_length),
        ("--generations", options.generations),
    ):
        if value:
            command += [flag, str(value)]
    for item in options.option:
        command += ["--option", item]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
        raise SystemExit(f"benchmark child {child!r} failed (exit {done.returncode})")
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - start
    return result


def _fmt(times: list[float]) -> str:
    return "[" + ", ".join(f"{t:.3f}" for t in times) + "]"


def main(argv=None) -> None:
    options = parse_args(argv)
    if options.child:
        run_child(options)
        return
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }
    settings = _settings(options)
    print(
        f"model {options.model} on {options.device}: {settings['prompts']} prompt(s) x G={settings['generations']}, "
        f"{settings['completion']} completion tokens, "
        f"{'LoRA r=' + str(settings['lora']) if settings['lora'] else 'full fine-tuning'}, "
        f"temperature {options.temperature}, {options.warmup} warm-up + {options.steps} measured steps, "
        f"options in both arms {_options(options) or 'none'}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    timing = argparse.Namespace(**{**vars(options), "profile_generation": False})  # the timed children: no profiler
    with tempfile.TemporaryDirectory() as tmp:
        memory = {}
        for child in ("gtpo", "grpo"):
            memory[child] = _child(timing, child, Path(tmp) / f"{child}.json", env)
            print(
                f"{child} alone: peak memory {memory[child]['peak_memory_bytes'] / 2**20:.1f} MiB "
                f"({memory[child]['memory_kind']}), step_time {_fmt(memory[child]['step_times'])} s, "
                f"threads {memory[child]['threads']}, wall {memory[child]['wall_s']:.0f} s",
                flush=True,
            )
        # Whichever trainer goes first in each pair was measured a few percent faster on a shared CPU:
        # run both orders and pool the pairs.
        paired = [
            _child(options, "paired", Path(tmp) / f"paired-{first}.json", env, first) for first in ("gtpo", "grpo")
        ]
    for run, first in zip(paired, ("gtpo", "grpo"), strict=False):
        print(f"taking turns, {first} first: gtpo step_time {_fmt(run['gtpo_step_times'])} s", flush=True)
        print(f"taking turns, {first} first: grpo step_time {_fmt(run['grpo_step_times'])} s", flush=True)
    times = {a: [t for run in paired for t in run[f"{a}_step_times"]] for a in ("gtpo", "grpo")}
    median = {a: statistics.median(times[a]) for a in times}
    spans = statistics.mean(run["gtpo_spans_ms"] for run in paired)
    loss = statistics.mean(run["gtpo_loss_ms"] for run in paired)
    print(
        f"median step time: gtpo {median['gtpo']:.3f} s, grpo {median['grpo']:.3f} s; gtpo's own work per step: "
        f"conflict spans {spans:.2f} ms, core loss {loss:.2f} ms"
    )
    alone = {arm: statistics.median(memory[arm]["step_times"]) for arm in ("gtpo", "grpo")}
    # Beside the paired ratio, as a check of it: the medians of the alone runs (no turn-taking, so not robust to drift).
    print(f"alone, each arm in its own process: median step time gtpo {alone['gtpo']:.3f} s, grpo {alone['grpo']:.3f} "
          f"s, ratio {alone['gtpo'] / alone['grpo']:.3f}")  # fmt: skip
    # The step's parts, median over both paired runs' measured steps, and what bounds each.
    settings = _settings(options)
    floor = paired[0]["floors"]
    decode_floor = settings["completion"] * floor["read_s"]  # one read of the weights per decoding step, at least
    tokens = settings["prompts"] * settings["generations"] * settings["completion"]
    scoring_floor = 2 * floor["weights"] * tokens / floor["matmul_flops"]
    print(
        f"floors: read bandwidth {floor['bandwidth'] / 1e9:.1f} GB/s measured, so one read of the weights "
        f"({floor['weight_bytes'] / 2**20:.0f} MiB) {1e3 * floor['read_s']:.2f} ms and generation >= "
        f"{decode_floor:.3f} s for {settings['completion']} decoding steps; matmul rate "
        f"{floor['matmul_flops'] / 1e9:.0f} GFLOP/s, so the scoring forward of {tokens} completion tokens >= "
        f"{scoring_floor:.3f} s (2 FLOPs per weight and token; the prompt not counted)"
    )
    against, generation = [], {}
    for arm in ("gtpo", "grpo"):
        pooled = {k: [t for run in paired for t in run["parts"][arm][k]] for k in paired[0]["parts"][arm]}
        shown = ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in pooled.items())
        print(f"{arm} step parts (median s): {shown}")
        generation[arm] = statistics.median(pooled["generation"])
        against.append(floor_ratio_text(f"{arm} generation", statistics.median(pooled["generation"]),
                                        decode_floor, "its weight-read floor"))  # fmt: skip
        against.append(floor_ratio_text(f"{arm} scoring", statistics.median(pooled["scoring"]), scoring_floor,
                                        "its matmul floor"))  # fmt: skip
    print("against the floors: " + "; ".join(against))
    # Training's generation against TRL's `generate` (the grpo arm is TRL's GRPOTrainer), same device.
    ours, trls = generation["gtpo"], generation["grpo"]
    print(f"generation gtpo / TRL's generate {ours / trls:.3f}x (median {ours:.3f} against {trls:.3f} s a step, "
          f"{settings['completion']} tokens forced)")  # fmt: skip
    # Each GTPO step against the GRPO step next to it in time: robust to drift in machine load.
    ratio_time = statistics.median(g / r for g, r in zip(times["gtpo"], times["grpo"], strict=False))
    ratio_memory = memory["gtpo"]["peak_memory_bytes"] / memory["grpo"]["peak_memory_bytes"]
    if options.profile_generation:  # after the timing: each arm alone once more, its last step's generation profiled
        with tempfile.TemporaryDirectory() as tmp:
            for arm in ("gtpo", "grpo"):
                profiled = _child(options, arm, Path(tmp) / f"profile-{arm}.json", env)
                wall = profiled["generation_s"]
                print(f"profile of {arm}'s generation in its last step (wall {wall:.3f} s under the profiler, its "
                      "overhead included: read the table's self times, not this):")  # fmt: skip
                print(profiled["generation_profile"])
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"gtpo/grpo step time ratio {ratio_time:.3f}, peak memory ratio {ratio_memory:.3f}")
    if any_bug(against):
        sys.exit("a part came out under its floor: the timing or the floor is wrong (above)")


if __name__ == "__main__":
    main()
