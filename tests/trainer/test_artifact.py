"""A trained model is a normal HF artifact (issue 20): RUN/model holds the adapter, the tokenizer and a model card;
the adapter's base loads without gtpo (peft's AutoPeftModelForCausalLM, offline); --push_to_hub uploads model/
and nothing else of the run. huggingface_hub's network calls are replaced by a recorder."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from gtpo import cli
from gtpo.models import adapter_base_model, load_model, offline_model_dir, tiny_model_dir
from gtpo.trainer import artifact


class HubRecorder:
    """Stands in for huggingface_hub.HfApi's create_repo and upload_folder; remembers what would go up."""

    def __init__(self):
        self.repos, self.uploads = [], []

    def create_repo(self, repo_id, **kwargs):
        self.repos.append((repo_id, kwargs))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        from pathlib import Path

        files = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())
        self.uploads.append((repo_id, folder_path, files))


@pytest.fixture(scope="module")
def pushed_run(tmp_path_factory):
    """Two GTPO steps of the tiny model (by its offline name) with LoRA, saving a checkpoint, and
    --push_to_hub: the run folder and what would have been uploaded. One run for the module's tests."""
    recorder = HubRecorder()
    run_dir = tmp_path_factory.mktemp("pushed") / "run"
    argv = [
        "train", "--model_name_or_path", "tiny", "--dtype", "float32", "--max_steps", "2",
        "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_completion_length", "6",
        "--initial_entropy_prompts", "2", "--num_examples", "8", "--use_peft", "true", "--lora_r", "4",
        "--lora_target_modules", "q_proj", "v_proj", "--save_strategy", "steps", "--save_steps", "1",
        "--push_to_hub", "true", "--hub_model_id", "someone/gtpo-tiny", "--plot", "false",
        "--output_dir", str(run_dir),
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("huggingface_hub.HfApi.create_repo", recorder.create_repo)
        patch.setattr("huggingface_hub.HfApi.upload_folder", recorder.upload_folder)
        assert cli.main(argv) == 0
    return run_dir, recorder


def test_push_to_hub_uploads_the_model_folder_only_once_after_training(pushed_run):
    run_dir, recorder = pushed_run
    assert [repo for repo, _ in recorder.repos] == ["someone/gtpo-tiny"]
    ((repo_id, folder, files),) = recorder.uploads
    assert (repo_id, folder) == ("someone/gtpo-tiny", str(run_dir / "model"))
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(files)
    assert not any("checkpoint" in f or f in ("run.json", "metrics.jsonl") for f in files), files
    assert (run_dir / "checkpoint-2").is_dir()  # saved locally, not uploaded
    assert json.loads((run_dir / "run.json").read_text())["args"]["GTPOConfig"]["push_to_hub"] is True


def test_adapter_loads_with_peft_alone_and_matches_gtpos_merged_model(pushed_run, monkeypatch):
    """AutoPeftModelForCausalLM finds the base from adapter_config.json alone (offline): the tiny model's cached
    folder, not the alias 'tiny'. Its logits (adapter unmerged) equal gtpo's loader's (adapter merged)."""
    from peft import AutoPeftModelForCausalLM

    run_dir, _ = pushed_run
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = json.loads((run_dir / "model" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir())
    peft_model = AutoPeftModelForCausalLM.from_pretrained(run_dir / "model").eval()
    merged = load_model(str(run_dir / "model")).eval()
    ids = torch.tensor([[1, 17, 42, 99, 5, 23]])
    with torch.no_grad():
        torch.testing.assert_close(peft_model(ids).logits, merged(ids).logits, atol=1e-5, rtol=1e-5)


def test_model_card_has_hub_metadata_the_paper_and_the_runs_figures(pushed_run):
    run_dir, _ = pushed_run
    text = (run_dir / "model" / "README.md").read_text()
    _, front, body = text.split("---", 2)
    metadata = yaml.safe_load(front)
    assert metadata["library_name"] == "peft" and metadata["pipeline_tag"] == "text-generation"
    assert {"gtpo", "trl", "arxiv:2508.03772"} <= set(metadata["tags"])
    assert "base_model" not in metadata  # the random tiny model is on no hub
    assert "2508.03772" in body and "someone/gtpo-tiny" in body and "None" not in body
    assert 'model_name_or_path: "tiny"' in body and "lora_r: 4" in body  # the settings as resolved
    assert "learning_rate: 0.0002" in body  # from the default recipe, not typed
    assert "| total reward |" in body and "2 logged steps" in body
    assert "train --model_name_or_path tiny" in body  # the command


def test_card_names_the_hub_model_an_offline_name_stands_for():
    assert artifact.card_base_model("smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert artifact.card_base_model("tiny") is None
    assert artifact.card_base_model("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"


def test_an_adapter_whose_cached_base_is_gone_falls_back_to_the_offline_name(tmp_path):
    """On another machine (or after the cache is cleared) the folder an adapter names is missing: gtpo's loader
    rebuilds it from the offline name instead of failing. Any other missing base is returned as written."""
    adapter = tmp_path / "model"
    adapter.mkdir()
    for base, expected in (
        ("/elsewhere/.cache/gtpo/smollm2-135m-instruct-q4_1-f32-v1", "smollm2"),
        ("/elsewhere/.cache/gtpo/tiny-llama-v1", "tiny"),
        ("/elsewhere/some-model", "/elsewhere/some-model"),
        ("Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-3B-Instruct"),
    ):
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
        assert adapter_base_model(str(adapter)) == expected, base


def test_a_failed_build_of_a_cached_folder_leaves_nothing_behind(tmp_path, monkeypatch):
    from gtpo import models

    def broken(staging):
        (staging / "half-written.bin").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        models._cached_folder(tmp_path / "model-v1", broken)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_smollm2_folder_holds_the_very_weights_gtpo_trains_from_the_gguf(tmp_path, monkeypatch):
    """offline_model_dir('smollm2') is the GGUF de-quantised to float32 and saved as safetensors: transformers
    loads it without gguf_file and gives the same logits, and its tokenizer encodes the chat template alike."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gtpo.models import load_tokenizer

    monkeypatch.setenv("GTPO_CACHE", str(tmp_path))
    folder = offline_model_dir("smollm2")
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.gguf"))
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gguf = load_model("smollm2", dtype="float32").eval()
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, return_tensors="pt", return_dict=True)
    reference = load_tokenizer("smollm2").apply_chat_template(messages, return_tensors="pt", return_dict=True)
    assert ids["input_ids"].tolist() == reference["input_ids"].tolist()
    with torch.no_grad():
        torch.testing.assert_close(plain(ids["input_ids"]).logits, gguf(ids["input_ids"]).logits)
