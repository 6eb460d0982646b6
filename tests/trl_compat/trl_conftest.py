"""Run TRL's own `tests/test_grpo_trainer.py` against GTPOTrainer/GTPOConfig, offline.

Copied by `scripts/run_trl_grpo_tests.sh` beside TRL's test file (never committed here). It

- swaps `trl.GRPOTrainer` / `trl.GRPOConfig` for `gtpo.GTPOTrainer` / `gtpo.GTPOConfig` before TRL's test module
  imports them: the one-line swap, with every default of GTPOConfig (algorithm gtpo, loss_type grpo, ⟨H⟩_ini
  measured);
- serves the hub ids the tests use most from a local cache built from configs (tiny Qwen2 causal LM and
  sequence classifier with Qwen2.5's vocabulary size, special-token ids, generation config and chat template over
  gtpo's tiny BPE tokenizer, a tiny Gemma3 VLM) and the `trl-internal-testing/zen` and
  `zen-image` prompt-only datasets;
  anything else the tests ask the hub for fails as "offline";
- sorts each test into passed / refused (a GTPO refusal message) / offline (a hub id not built here) /
  failed / skipped, and writes `trl_compat_summary.json` in the working directory.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_CACHE = Path(os.environ.setdefault("GTPO_TRL_COMPAT_CACHE", tempfile.mkdtemp(prefix="trl-compat-hub-")))
os.environ["HF_HUB_CACHE"] = str(_CACHE / "hub")

import datasets  # noqa: E402
import pytest  # noqa: E402

GEMMA3 = "trl-internal-testing/tiny-Gemma3ForConditionalGeneration"
CAUSAL = "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"
CLASSIFIER = "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"
_REVISION = "0" * 40

# Prompt prefixes of the Zen of Python, in the order of TRL's `zen` prompt-only dataset (its tests assert them);
# split as its generator does: train_test_split(test_size=0.1, shuffle=False) -> 17 train, 2 test rows.
_PROMPTS = [
    "Beautiful is better than",
    "Explicit is",
    "Simple is better",
    "Complex",
    "Flat is better than",
    "Sparse is better",
    "Readability",
    "Special cases aren't special",
    "Although practicality beats",
    "Errors should never",
    "Unless explicitly",
    "In the face of ambiguity, refuse",
    "There should be one-- and preferably",
    "Although that way may not be obvious at first unless you're",
    "Now is",
    "Although never is often",
    "If the implementation is hard to explain,",
    "If the implementation is easy",
    "Namespaces are one honking great",
]


def _snapshot(repo_id: str) -> Path:
    folder = _CACHE / "hub" / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(_REVISION)
    return folder / "snapshots" / _REVISION


# Qwen2.5's token ids the tests rely on (TRL's mask_truncated test writes 151643 and 151645 into its completions),
# its vocabulary (len(tokenizer.vocab) of Qwen2.5, what TRL's tiny-model script gives the config) and the special
# tokens from 151643 on; its generation config as the instruct checkpoints ship it.
QWEN25_VOCAB = 151665
QWEN25_SPECIAL = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}
QWEN25_GENERATION = dict(
    bos_token_id=151643, pad_token_id=151643, eos_token_id=[151645, 151643], do_sample=True, temperature=0.7,
    top_p=0.8, top_k=20, repetition_penalty=1.05,
)  # fmt: skip


def _qwen25_tokenizer(folder: Path):
    """gtpo's tiny BPE tokenizer made to look like Qwen2.5's: its special tokens moved to Qwen2.5's ids, the
    vocabulary filled to Qwen2.5's size with unused tokens (no merge reaches them), pad `<|endoftext|>`, EOS
    `<|im_end|>`, no BOS, and the Qwen2.5 chat template the installed TRL ships (trl/chat_templates/qwen2_5.jinja)."""
    import trl
    from transformers import PreTrainedTokenizerFast

    from gtpo.models import tiny_model_dir

    spec = json.loads((Path(tiny_model_dir()) / "tokenizer.json").read_text())
    by_name = {name: id_ for id_, name in QWEN25_SPECIAL.items()}
    vocab = spec["model"]["vocab"]
    freed = [vocab[name] for name in by_name if name in vocab]
    vocab = {name: id_ for name, id_ in vocab.items() if name not in by_name}
    used = set(vocab.values())
    for id_ in [*freed, *range(max(used) + 1, QWEN25_VOCAB)]:
        if id_ not in QWEN25_SPECIAL and id_ not in used:
            vocab[f"<|unused_{id_}|>"] = id_
    vocab.update(by_name)
    spec["model"]["vocab"] = vocab
    for token in spec["added_tokens"]:
        token["id"] = by_name.get(token["content"], token["id"])
    path = folder / "qwen25-tokenizer.json"
    path.write_text(json.dumps(spec))
    template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path), eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        chat_template=template, padding_side="left",
    )  # fmt: skip
    assert len(tokenizer) == QWEN25_VOCAB and tokenizer.pad_token_id == 151643 and tokenizer.eos_token_id == 151645
    return tokenizer


def _build_models() -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    _CACHE.mkdir(parents=True, exist_ok=True)
    tokenizer = _qwen25_tokenizer(_CACHE)
    common = dict(
        vocab_size=QWEN25_VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    for repo_id, build in (
        (CAUSAL, lambda: Qwen2ForCausalLM(Qwen2Config(**common))),
        (CLASSIFIER, lambda: Qwen2ForSequenceClassification(Qwen2Config(**common, num_labels=1))),
    ):
        target = _snapshot(repo_id)
        if (target / "config.json").is_file():
            continue
        model = build()
        model.config._name_or_path = repo_id
        if repo_id == CAUSAL:
            model.generation_config = GenerationConfig(**QWEN25_GENERATION)
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    # A tiny Gemma3 vision-language model (tests/scripts/tiny_vlm.py in the gtpo checkout named by GTPO_REPO).
    target = _snapshot(GEMMA3)
    if os.environ.get("GTPO_REPO") and not (target / "config.json").is_file():
        import sys

        sys.path.insert(0, str(Path(os.environ["GTPO_REPO"]) / "tests" / "scripts"))
        from tiny_vlm import build_tiny_gemma3

        build_tiny_gemma3(target)


_build_models()

# --- the zen prompt-only datasets ---------------------------------------------------------------------
_real_load_dataset = datasets.load_dataset


def _zen_image(config_name: str, split: str):
    import numpy as np
    from PIL import Image

    if config_name != "conversational_prompt_only":
        raise FileNotFoundError(f"offline: zen-image config {config_name!r} is not built by tests/trl_compat")
    prompts = _PROMPTS[:17] if split == "train" else _PROMPTS[17:]
    rng = np.random.default_rng(0)
    images = [Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")) for _ in prompts]
    messages = [[{"role": "user", "content": f"What is in the image? {p}"}] for p in prompts]
    return datasets.Dataset.from_dict({"prompt": messages, "image": images})


def _zen(config_name: str, split: str):
    prompts = _PROMPTS[:17] if split == "train" else _PROMPTS[17:]
    if config_name == "standard_prompt_only":
        return datasets.Dataset.from_dict({"prompt": prompts})
    if config_name == "conversational_prompt_only":
        return datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    raise FileNotFoundError(f"offline: zen config {config_name!r} is not built by tests/trl_compat/conftest.py")


def _load_dataset(path, name=None, *args, split=None, streaming=False, **kwargs):
    builders = {"trl-internal-testing/zen": _zen, "trl-internal-testing/zen-image": _zen_image}
    if path not in builders:
        return _real_load_dataset(path, name, *args, split=split, streaming=streaming, **kwargs)
    build = builders[path]
    if split is None:
        parts = {s: build(name, s) for s in ("train", "test")}
        return (
            datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in parts.items()})
            if streaming
            else datasets.DatasetDict(parts)
        )
    data = build(name, split)
    return data.to_iterable_dataset() if streaming else data


datasets.load_dataset = _load_dataset

# --- the one-line swap ----------------------------------------------------------------------------------
import importlib  # noqa: E402

import trl  # noqa: E402

_import_utils = importlib.import_module("trl.import_utils")

# A TRL test file older than the installed TRL may import availability probes the installed TRL no longer
# has; a missing probe reads as "not available", so the tests that need it are skipped by their decorators.
for _name in (
    "is_harbor_available",
    "is_jmespath_available",
    "is_joblib_available",
    "is_math_verify_available",
    "is_mergekit_available",
    "is_openreward_available",
):
    if not hasattr(_import_utils, _name):
        setattr(_import_utils, _name, lambda *args, **kwargs: False)

from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402

if os.environ.get("GTPO_TRL_COMPAT_BASELINE") != "1":
    trl.GRPOConfig = GTPOConfig
    trl.GRPOTrainer = GTPOTrainer
else:  # baseline: TRL's own trainer, same offline set-up, and bf16 off without an accelerator (as GTPOConfig)

    class _CPUGRPOConfig(trl.GRPOConfig):
        def __post_init__(self):
            if self.bf16 is None and not self.fp16 and not torch.accelerator.is_available():
                self.bf16 = False  # TRL resolves None to True, which transformers refuses on a CPU-only machine
            super().__post_init__()

    import torch

    trl.GRPOConfig = _CPUGRPOConfig

# --- outcome classes ------------------------------------------------------------------------------------
_REFUSAL = re.compile(r"algorithm='gtpo'|algorithm='grpo'|with algorithm=|GTPOConfig\.|GTPO has no KL")
_OFFLINE = re.compile(
    r"offline|LocalEntryNotFound|couldn't connect|Cannot find the requested files|"
    r"not built by tests/trl_compat|HF_HUB_OFFLINE|outgoing traffic has been disabled",
    re.I,
)
_RESULTS: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.passed:
            kind, message = "passed", ""
        elif report.skipped:
            kind, message = "skipped", str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        else:
            error = call.excinfo.value if call.excinfo is not None else None
            message = f"{type(error).__name__}: {error}" if error is not None else str(report.longrepr)
            if _REFUSAL.search(message):
                kind = "refused"
            elif _OFFLINE.search(message):
                kind = "offline"
            else:
                kind = "failed"
        _RESULTS[item.nodeid] = {"outcome": kind, "message": message.splitlines()[0][:300] if message else ""}


def pytest_sessionfinish(session, exitstatus):
    counts: dict[str, int] = {}
    for result in _RESULTS.values():
        counts[result["outcome"]] = counts.get(result["outcome"], 0) + 1
    Path("trl_compat_summary.json").write_text(json.dumps({"counts": counts, "tests": _RESULTS}, indent=1))
