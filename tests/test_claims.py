"""What the README says of TRL's paths (its table "path | where it ran | test or log") and docs/recipes.md's dated
record ("What has run, where, and what has not"): every test or log they name exists, every figure they quote from a
log is what the log prints, and what they say a test does not do, it does not do.

Invariant: a claim that a path ran names a file in this repository that holds it; editing a claim, a log or a test
without the other fails here (the GPU record's figures in docs/performance.md are held by tests/test_gpu_record.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RECIPES = " ".join((ROOT / "docs" / "recipes.md").read_text().split())  # one space between words
PYTHON_API = " ".join((ROOT / "docs" / "python-api.md").read_text().split())
RECORD = ROOT / "docs" / "measurements" / "gpu-h100-20261128"
PATHS = (
    "vLLM, colocate",
    "vLLM, server",
    "PEFT/LoRA",
    "4-bit (`load_in_4bit`)",
    "DDP",
    "several machines",
    "FSDP2",
    "ZeRO-2/3",
    "resume",
    "`report_to`",
)


def _claim_table() -> dict[str, tuple[str, str]]:
    """path -> (where it ran, test or log), from the README's table."""
    start = README.index("| path | where it ran | test or log |")
    rows = {}
    for line in README[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        path, where, holder = (cell.strip() for cell in line.strip("|").split(" | "))
        rows[path] = (where, holder)
    return rows


def test_the_readme_table_has_each_path_once():
    assert tuple(_claim_table()) == PATHS


@pytest.mark.parametrize("path", PATHS)
def test_each_path_names_what_holds_it_or_says_not_executed(path):
    """A path that ran names at least one file; each file named exists; a path with no file says it did not run."""
    where, holder = _claim_table()[path]
    files = re.findall(r"`([\w./-]+\.(?:py|log|md|txt))`", holder)
    for name in files:
        assert (ROOT / name).is_file(), (path, name)
    if not files:
        assert where.startswith("not executed"), path
    if where.startswith("not executed"):
        assert not re.search(r"\b(passed|equal)\b", where), path


def test_the_h100_record_is_what_the_table_and_the_dated_list_say():
    """The sharded checks: the record's device, commit and versions; each group ran its back-end for 3 steps in one
    process and passed; the reloaded models' largest difference and the seconds a group took, as docs/recipes.md
    quotes them."""
    versions = (RECORD / "versions.log").read_text()
    assert "gpu: NVIDIA H100 80GB HBM3 | torch 2.11.0+cu130" in versions
    assert re.search(r"^f740e40$", versions, re.M)
    for package in ("transformers 5.23.0", "trl 1.16.0", "accelerate 1.15.0"):
        assert package in versions, package
    heading = "**2026-11-28, one NVIDIA H100 80GB HBM3** (commit f740e40; torch 2.11.0+cu130, transformers 5.23.0, TRL"
    assert heading in RECIPES
    assert "# GPU checks on one NVIDIA H100 80GB HBM3, 2026-11-28" in (RECORD / "README.md").read_text()
    status = dict(re.findall(r"^(\w+) rc=0 seconds=(\d+)$", (RECORD / "status.txt").read_text(), re.M))
    deltas = []
    for group, backend in (("fsdp", "FSDP"), ("zero2", "DEEPSPEED"), ("zero3", "DEEPSPEED")):
        log = (RECORD / "sharded" / f"{group}.log").read_text()
        assert "sharded check: PASSED" in log, group
        results = [json.loads(line) for line in log.splitlines() if line.startswith('{"distributed_type"')]
        assert [r["distributed_type"] for r in results] == ["DistributedType.NO", f"DistributedType.{backend}"], group
        assert [len(r["steps"]) for r in results] == [3, 3], group
        deltas.append(re.search(r"reloaded weights: max \|Δw\| = (\S+)", log)[1])
    assert f"differed by at most {deltas[0]}, {deltas[1]} and {deltas[2]};" in RECIPES
    seconds = [int(status[group]) for group in ("fsdp", "zero2", "zero3")]
    assert f"{min(seconds)}-{max(seconds)} s a group (`status.txt`)" in RECIPES
    for group in ("fsdp", "zero2", "zero3"):
        assert f"docs/measurements/gpu-h100-20261128/sharded/{group}.log" in README


def test_the_lora_test_on_cuda_is_in_the_h100_tests_log():
    """The README's "one H100: LoRA scores and gradients against TRL's" is the gpu tests' LoRA case, which passed."""
    log = (RECORD / "tests.log").read_text()
    assert "test_packed_scores_and_gradients_equal_trl_padded_ones_on_cuda[lora]" in log
    assert re.search(r"^11 passed, \d+ deselected", log, re.M) and "failed" not in log
    assert "one H100: LoRA scores and gradients against TRL's" in _claim_table()["PEFT/LoRA"][0]


def test_the_dated_list_has_one_heading_per_place_and_date():
    """docs/recipes.md's record is one list by date and place: no heading claims a whole list ran on the CPU on one
    day while a GPU entry sits under it, and the CPU entries' versions are the lock file's."""
    section = RECIPES[RECIPES.index("### What has run, where, and what has not") : RECIPES.index("A GPU machine may")]
    headings = re.findall(r"\*\*(2026-11-\d\d), ([^*]+)\*\*", section)
    assert [(date, place.split(" (")[0]) for date, place in headings] == [
        ("2026-11-27", "this project's 2-core CPU machine"),
        ("2026-11-27", "the same machine, in `.venv-vllm`"),
        ("2026-11-28", "one NVIDIA H100 80GB HBM3"),
        ("2026-11-28", "this project's 2-core CPU machine"),
        ("2026-11-28", "the same machine, in `.venv-vllm`"),
    ]
    lock = (ROOT / "requirements" / "lock-cpu.txt").read_text()
    for package, version in (("torch", "2.13.0+cpu"), ("accelerate", "1.15.0"), ("trl", "1.16.0")):
        assert re.search(rf"^{package}=={re.escape(version)}", lock, re.M | re.I), package
    assert "no GPU was lent" not in section and "H200 loan" not in RECIPES


def test_what_the_launch_check_test_is_said_to_check_is_what_it_does():
    """docs/recipes.md and docs/python-api.md say tests/trainer/test_launch_checks.py checks one process with the
    launcher's variable set (it launches nothing), and that tests/trainer/test_fsdp_cpu_launch.py launches two ranks
    under fsdp.yaml, plain and with accelerate's CPU check lifted, and compares both with one process: it does."""
    test = (ROOT / "tests" / "trainer" / "test_launch_checks.py").read_text()
    assert "accelerate launch" not in test.split('"""', 2)[2] and "subprocess" not in test
    assert 'monkeypatch.setenv(asked, "true")' in test and "assert not trainer.is_fsdp_enabled" in test
    assert "It launches no ranks." in RECIPES
    launch = (ROOT / "tests" / "trainer" / "test_fsdp_cpu_launch.py").read_text()
    assert (
        '"accelerate.commands.launch"' in launch
        and '"fsdp.yaml"' in launch
        and '"--num_processes",\n        "2"' in launch
    )
    assert '"--cpu"' not in launch and '_launch_two_ranks(out, "--fsdp-on-cpu")' in launch
    assert launch.count("_assert_same_rows_and_update(single_out, single, out, _records(out))") == 2
    assert (
        "launch_checks.warn_if_unsharded" in RECIPES
        and "`tests/trainer/test_fsdp_cpu_launch.py`, in `make test-slow`" in RECIPES
    )
    assert "`tests/trainer/test_fsdp_cpu_launch.py` launches it" in PYTHON_API
    assert "no test launches it" not in RECIPES + PYTHON_API
    worker = (ROOT / "tests" / "scripts" / "spans_worker.py").read_text()
    assert "def lift_accelerate_cpu_fsdp_guard" in worker and "test-only" in RECIPES


def test_no_unlogged_probe_figures():
    """The vLLM probe gaps were never committed from a run: the pages and the test's comment quote none."""
    comment = (ROOT / "tests" / "trainer" / "test_vllm_training.py").read_text()
    for text in (PYTHON_API, RECIPES, comment):
        assert not re.search(r"measured 0\.0\d", text)
    assert "the test prints both gaps, and no run's figures are committed" in PYTHON_API


def test_what_the_docs_say_the_vllm_test_checks_is_in_the_test():
    """docs/python-api.md and docs/recipes.md say the vLLM test compares the engine's weights with the trainer's after
    every sync, runs two syncs that skip one parameter (the tied embedding, one k projection) which the check must
    catch, has a δ run with entropy_filter "always" at threshold 2.5, and controls the IS ratios: the worker and the
    test do these things with these settings."""
    worker = (ROOT / "tests" / "scripts" / "vllm_training_worker.py").read_text()
    test = (ROOT / "tests" / "trainer" / "test_vllm_training.py").read_text()
    assert 'SKIPPED = ("model.embed_tokens.weight", "model.layers.7.self_attn.k_proj.weight")' in worker
    assert "DELTA_THRESHOLD = 2.5" in worker and 'entropy_filter="always", entropy_threshold=DELTA_THRESHOLD' in worker
    assert "def test_a_sync_that_skips_one_parameter_fails_the_weight_check" in test
    assert "def test_after_every_sync_the_engine_holds_the_trainers_weights_at_its_precision" in test
    assert 'assert unmasked, "every ratio is masked"' in test and "assert dropped_by_delta > 0" in test
    for page in (PYTHON_API, RECIPES):
        assert "`model.layers.7.self_attn.k_proj.weight`" in page or "one k projection" in page
        assert "entropy_threshold=2.5" in page
