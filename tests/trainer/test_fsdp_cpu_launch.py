"""Two CPU ranks launched under configs/accelerate/fsdp.yaml, as tests/trainer/test_trainer_distributed.py launches
its two DDP ranks (no `--cpu`, `GTPOConfig(use_cpu=True)`, gloo), on the tiny model and fixed completions
(tests/scripts/spans_worker.py: 2 ranks × 3 rows × 2 accumulation steps against one process with 6 rows).

What happens, as launched: accelerate 1.15 sets up MULTI_CPU (DDP) although its launcher asked for FSDP (it turns
FSDP on only for accelerator back-ends), every rank holds the whole model, `GTPOTrainer` says so in one start-up
line (`gtpo.trainer.launch_checks.warn_if_unsharded`), and the update is one process's.

What torch's FSDP2 does on the same ranks when accelerate's one decision is lifted (`spans_worker.py --fsdp-on-cpu`,
test-only): accelerate's own FSDP2 preparation (`fully_shard`, gloo) shards the model, each rank holds half of its
elements, no start-up line is printed (what was asked for runs), and the update is again one process's.

Invariant: under fsdp.yaml on CPU ranks the run says what it runs, and whether sharded or not it makes the update
of one process with the whole batch (the one-process run is the independent reference).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer_distributed import _ENV, WORKER, _assert_same_rows_and_update, _free_port, _records  # noqa: E402

FSDP_CONFIG = Path(__file__).parents[2] / "configs" / "accelerate" / "fsdp.yaml"
START_UP_LINE = (
    "accelerate was launched for FSDP (ACCELERATE_USE_FSDP=true) but set up MULTI_CPU on 2 processes, each with the "
    "whole model: nothing is sharded"
)


def _one_process(out: Path) -> None:
    """The worker as one plain process with the whole 12-row batch."""
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out), "--per-device", "6"],
        env={**os.environ, **_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def _launch_two_ranks(out: Path, *worker_options: str) -> str:
    """`accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2` (no `--cpu`: it would start
    one process; use_cpu=True in the worker's GTPOConfig gives two CPU ranks on gloo)."""
    launcher = [
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(FSDP_CONFIG),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(_free_port()),
    ]
    done = subprocess.run(
        [sys.executable, *launcher, str(WORKER), str(out), "--per-device", "3", *worker_options],
        env={**os.environ, **_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"ranks failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout + done.stderr


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One process, the 12-row batch at once (grpo): the reference both launches are compared with."""
    out = tmp_path_factory.mktemp("single")
    _one_process(out)
    return out, _records(out)


@pytest.mark.slow
def test_fsdp_yaml_on_two_cpu_ranks_runs_ddp_says_so_and_equals_one_process(tmp_path, single_process):
    """As launched: MULTI_CPU on both ranks, each with the whole model wrapped in DDP, the start-up line once per
    rank, and the rows, spans, λ, ⟨H⟩_ini and update of one process."""
    out = tmp_path / "fsdp-yaml"
    log = _launch_two_ranks(out)
    ranks = _ranks(out)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["distributed_type"] for r in ranks] == ["MULTI_CPU", "MULTI_CPU"]
    assert [r["model_class"] for r in ranks] == ["DistributedDataParallel"] * 2
    assert all(r["held_elements"] == r["model_elements"] for r in ranks)  # nothing sharded
    assert log.count(START_UP_LINE) == 2  # one line per rank, from warn_if_unsharded
    single_out, single = single_process
    assert ranks[0]["initial_entropy"] == pytest.approx(_ranks_initial_entropy(single_out), abs=1e-5)
    _assert_same_rows_and_update(single_out, single, out, _records(out))


@pytest.mark.slow
def test_fsdp2_shards_over_gloo_on_two_cpu_ranks_and_equals_one_process(tmp_path, single_process):
    """With accelerate's CPU guard lifted (`--fsdp-on-cpu`): FSDP on both ranks, the model is accelerate's FSDP2 class
    (torch's `fully_shard`), each rank holds half the trainable elements, no start-up line, and the rows, spans, λ,
    ⟨H⟩_ini and the update (gathered whole from the shards) are one process's."""
    out = tmp_path / "fsdp2"
    log = _launch_two_ranks(out, "--fsdp-on-cpu")
    ranks = _ranks(out)
    assert [r["distributed_type"] for r in ranks] == ["FSDP", "FSDP"]
    assert all(r["model_class"].startswith("FSDP") for r in ranks), ranks[0]["model_class"]
    whole = ranks[0]["model_elements"]
    held = [r["held_elements"] for r in ranks]
    assert sum(held) == whole and max(held) <= whole * 0.6, held  # sharded in two: each rank holds about half
    assert "launched for FSDP" not in log  # what was asked for runs: nothing to say
    single_out, single = single_process
    assert ranks[0]["initial_entropy"] == pytest.approx(_ranks_initial_entropy(single_out), abs=1e-5)
    _assert_same_rows_and_update(single_out, single, out, _records(out))


def _ranks_initial_entropy(out: Path) -> float:
    return json.loads((out / "rank0.json").read_text())["initial_entropy"]
