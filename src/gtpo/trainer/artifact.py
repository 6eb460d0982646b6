"""The trained model as an ordinary Hugging Face artifact: ``RUN/model/`` with a base that loads, a model card,
and a push to the hub of that folder alone.

- The base: an adapter trained on an offline model (``tiny``, ``smollm2``) names that model's cached folder
  (:func:`gtpo.models.offline_model_dir`), never the bare alias, so ``AutoPeftModelForCausalLM.from_pretrained``
  loads ``RUN/model`` without gtpo; a hub model stays its hub id.
- The card (``RUN/model/README.md``): TRL's own card (:func:`trl.trainer.utils.generate_model_card`: YAML
  metadata, quick start, citations) with ``base_model`` (the hub id an offline model stands for), tags ``gtpo``
  and ``trl``, the paper (arXiv 2508.03772), then the run: its command, recipe and final figures.
- The push: ``push_to_hub`` uploads ``RUN/model/`` once, after training. transformers' Trainer would create the
  repository when training starts and upload the whole run folder (checkpoints' siblings, run.json, a second
  copy of the weights) at every save; :func:`train_policy <gtpo.trainer.policy.train_policy>` turns that off.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

PAPER_ID = "2508.03772"
CARD_FILE = "README.md"


def adapter_base_for(base: str) -> str:
    """What an adapter's ``base_model_name_or_path`` should say for a model named ``base`` by the user."""
    from gtpo.models import OFFLINE_MODELS, offline_model_dir

    return str(offline_model_dir(base)) if base in OFFLINE_MODELS else base


def card_base_model(base: str) -> str | None:
    """The hub id of the base model for the card's metadata, or None for a local folder or the random tiny model."""
    from gtpo.models import OFFLINE_HUB_IDS, OFFLINE_MODELS

    if base in OFFLINE_MODELS:
        return OFFLINE_HUB_IDS.get(base)
    return None if Path(base).exists() else base


def write_model_card(model_dir: Path, run_dir: Path, trainer, base: str, hub_model_id: str | None) -> Path:
    """Write ``model_dir/README.md``: TRL's model card for this trainer, then the run's command, recipe and
    final figures (first and last 10 logged steps). Returns the card's path."""
    from trl.trainer.utils import generate_model_card

    from gtpo.runs.folder import read_record
    from gtpo.runs.metrics_log import read_metrics

    record = read_record(run_dir) or {}
    args = record.get("args", {})
    algorithm = args.get("GTPOConfig", {}).get("algorithm", "sft" if "SFTConfig" in args else "gtpo")
    task = next((a["task"] for a in args.values() if isinstance(a, dict) and "task" in a), None)
    paper = getattr(trainer, "_paper", {}) or {}
    tags = sorted({"trl", "gtpo", *getattr(trainer, "_tag_names", []), f"arxiv:{PAPER_ID}"})
    name = hub_model_id.split("/")[-1] if hub_model_id else Path(run_dir).name
    card = generate_model_card(
        base_model=card_base_model(base),
        model_name=name,
        hub_model_id=hub_model_id or str(model_dir),
        dataset_name=None,
        tags=tags,
        wandb_url=None,
        trackio_url=None,
        trainer_name="GRPO" if algorithm == "grpo" else getattr(trainer, "_name", "GTPO"),
        trainer_citation=paper.get("citation"),
        paper_title=paper.get("title"),
        paper_id=paper.get("id"),
    )
    if card_base_model(base) is None:  # TRL's template would say "a fine-tuned version of [None](...)"
        card.text = card.text.replace("[None](https://huggingface.co/None)", f"`{base}` (a local model)")
    card.data.library_name = "peft" if (model_dir / "adapter_config.json").is_file() else "transformers"
    card.data.pipeline_tag = "text-generation"
    rows = read_metrics(run_dir) if (Path(run_dir) / "metrics.jsonl").is_file() else []
    card.text += _run_section(record, rows, algorithm, task, base)
    path = model_dir / CARD_FILE
    card.save(str(path))
    return path


def _run_section(record: dict, rows: list[dict], algorithm: str, task: str | None, base: str) -> str:
    from gtpo.runs.metrics_log import first_last_means

    lines = [
        "",
        "## This run (written by gtpo)",
        "",
        f"- Algorithm: **{algorithm}**"
        + (f" (GTPO, [arXiv {PAPER_ID}](https://arxiv.org/abs/{PAPER_ID}))" if algorithm == "gtpo" else ""),
        f"- Task: {task}" if task else "- Task: (none recorded)",
        f"- Base model: `{base}`"
        + (" (the Q4_1 GGUF of SmolLM2-135M-Instruct, de-quantised)" if base == "smollm2" else ""),
        "- Load it: `AutoPeftModelForCausalLM.from_pretrained(path)` (peft) or `gtpo eval --model path`",
    ]
    if record.get("command"):
        import shlex

        lines += ["", "Command:", "", "```bash", shlex.join(record["command"]), "```"]
    settings = _settings(record)
    if settings:
        lines += ["", "Settings (the recipe's keys and the command line's, as resolved; all are in run.json):", ""]
        lines += ["```yaml", *(f"{key}: {json.dumps(value)}" for key, value in sorted(settings.items())), "```"]
    figures = []
    for label, key in (
        ("total reward", "reward"),
        ("format reward", "rewards/format_reward/mean"),
        ("accuracy reward", "rewards/accuracy_reward/mean"),
        ("mean token entropy (nats)", "gtpo/mean_entropy"),
        ("training loss", "loss"),
    ):
        means = first_last_means(rows, key)
        if means is not None:
            figures.append(f"| {label} | {means[0]:.3f} | {means[1]:.3f} |")
    steps = [row["step"] for row in rows if "reward" in row or "loss" in row]
    if figures:
        lines += ["", f"Final figures ({len(steps)} logged steps; means over the first and the last 10):", ""]
        lines += ["| metric | first 10 steps | last 10 steps |", "|---|---|---|", *figures]
    initial = next((row["gtpo/initial_entropy"] for row in rows if "gtpo/initial_entropy" in row), None)
    if initial is not None:
        lines += ["", f"⟨H⟩_ini (the entropy filter's reference, Eq. 6): {initial:.4f} nats"]
    return "\n".join(lines) + "\n"


def _settings(record: dict) -> dict:
    """The recipe's keys and the flags typed on the command line, each with the value the run resolved."""
    resolved = {}
    for values in record.get("args", {}).values():
        if isinstance(values, dict):
            resolved.update(values)
    keys = set(record.get("recipe") or {}) - {"env"}
    keys |= {token[2:].split("=", 1)[0] for token in record.get("command", []) if token.startswith("--")}
    keys = {key.replace("-", "_") for key in keys} - {"config"}
    return {key: resolved.get(key, (record.get("recipe") or {}).get(key)) for key in keys}


def push_model(model_dir: Path, repo_id: str, *, token=None, private=None, revision=None) -> list[str]:
    """Upload ``model_dir`` (and nothing else of the run) to the hub repository ``repo_id``, creating it if
    needed. Returns the files uploaded, relative to ``model_dir``."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo = api.create_repo(repo_id, private=private, exist_ok=True)
    repo_id = getattr(repo, "repo_id", repo_id)
    files = sorted(str(p.relative_to(model_dir)) for p in Path(model_dir).rglob("*") if p.is_file())
    api.upload_folder(
        repo_id=repo_id,
        folder_path=str(model_dir),
        revision=revision,
        commit_message="gtpo: upload the trained model",
    )
    logger.info("pushed %d files of %s to https://huggingface.co/%s", len(files), model_dir, repo_id)
    return files
