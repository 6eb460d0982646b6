"""Two processes (accelerate with configs/accelerate/ddp.yaml, gloo on CPU) see the same spans and λ as one.

The worker (tests/scripts/spans_worker.py) runs one GTPO step on fixed completions. With 2 ranks ×
3 rows × 2 accumulation steps, the 12-row generation batch holds 3 groups of 4 and group 1 (rows 4-7)
is split between the ranks; one process sees the same 12 rows at once. Each group's two halves hold
one reward sign each, so a rank that computed spans from its own rows would find no conflict there.

The same two ranks also run as two "machines" on one host (configs/accelerate/multi_node_ddp.yaml: num_machines 2,
machine_rank 0 and 1, main_process_ip 127.0.0.1), one `accelerate launch` per machine, as on a real cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gtpo import core

WORKER = Path(__file__).parents[1] / "scripts" / "spans_worker.py"
DDP_CONFIG = Path(__file__).parents[2] / "configs" / "accelerate" / "ddp.yaml"
MULTI_NODE_DDP_CONFIG = Path(__file__).parents[2] / "configs" / "accelerate" / "multi_node_ddp.yaml"
_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command: list[str], out: Path) -> list[dict]:
    done = subprocess.run(command, env={**os.environ, **_ENV}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return _records(out)


def _records(out: Path) -> list[dict]:
    """Every rank's rows (spans_worker.py's rank<r>.json), in global row order."""
    records = []
    for path in sorted(out.glob("rank*.json")):
        records += json.loads(path.read_text())["records"]
    return sorted(records, key=lambda r: r["row"])


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """The one-process run of each loss type, made once and shared by the tests that compare against it.

    Returns:
        run(loss_type) -> (output folder, records in row order).
    """
    runs = {}

    def run(loss_type: str) -> tuple[Path, list[dict]]:
        if loss_type not in runs:
            out = tmp_path_factory.mktemp(f"single-{loss_type}")
            command = [sys.executable, str(WORKER), str(out), "--per-device", "6", "--loss-type", loss_type]
            runs[loss_type] = (out, _run(command, out))
        return runs[loss_type]

    return run


def _assert_same_rows_and_update(single_out: Path, single: list[dict], double_out: Path, double: list[dict]) -> None:
    """Two ranks generated the same 12 rows as one process, found the same spans and λ, and made the same update."""
    assert [r["row"] for r in single] == [r["row"] for r in double] == list(range(12))
    assert [r["rank"] for r in double] == [0] * 6 + [1] * 6
    for one, two in zip(single, double, strict=True):
        assert (one["prompt"], one["ids"]) == (two["prompt"], two["ids"])  # the same generated batch
        assert one["advantage"] == pytest.approx(two["advantage"], abs=1e-6)
        assert (one["forward"], one["backward"], one["lambda"]) == (two["forward"], two["backward"], two["lambda"])
    # DDP's mean over ranks of per-rank accumulated means = the single-process update.
    one_params = torch.load(single_out / "params.pt")
    two_params = torch.load(double_out / "params.pt")
    initial = torch.load(single_out / "params_before.pt")
    assert max((one_params[k] - initial[k]).abs().max().item() for k in one_params) > 1e-3  # a real update
    assert max((one_params[k] - two_params[k]).abs().max().item() for k in one_params) < 1e-5


def _spans_of(rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """Spans core computes from these rows alone, as if they were a whole group."""
    width = max(len(r["ids"]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r["ids"])] = torch.tensor(r["ids"])
        mask[i, : len(r["ids"])] = True
    advantages = torch.tensor([r["advantage"] for r in rows])
    forward, backward = core.conflict_spans(ids, mask, advantages, len(rows))
    return [(forward[i][mask[i]].int().tolist(), backward[i][mask[i]].int().tolist()) for i in range(len(rows))]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_split_across_ranks_equals_single_process(tmp_path, single_process, loss_type):
    """grpo (Eq. 7's per-completion means) and dapo (token sum over the generation batch's token count,
    divided by the number of ranks as TRL does) give the single-process update on two ranks."""
    double_out = tmp_path / "two"
    loss = ["--loss-type", loss_type]
    single_out, single = single_process(loss_type)
    # The shipped DDP config, on CPU: `--cpu` would make accelerate run one process (multi-CPU needs
    # mpirun), while the DDP launcher with use_cpu=True in GTPOConfig gives two CPU ranks on gloo.
    double = _run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(DDP_CONFIG),
            "--num_processes",
            "2",
            "--mixed_precision",
            "no",
            "--main_process_port",
            str(_free_port()),
            str(WORKER),
            str(double_out),
            "--per-device",
            "3",
            *loss,
        ],
        double_out,
    )
    assert json.loads((double_out / "rank1.json").read_text())["world_size"] == 2
    # ⟨H⟩_ini over 5 prompts spread over 2 ranks (one padding repeat, weight 0) = over 5 prompts in one.
    measured = [
        json.loads((out / f"rank{r}.json").read_text())["initial_entropy"]
        for out, r in ((single_out, 0), (double_out, 0), (double_out, 1))
    ]
    assert measured[0] == pytest.approx(measured[1], abs=1e-5) and measured[1] == measured[2]
    _assert_same_rows_and_update(single_out, single, double_out, double)

    # The split group has spans, and they need both ranks' rows: each rank's half alone has none.
    split = double[4:8]
    assert {r["rank"] for r in split} == {0, 1}
    assert all(sum(r["forward"]) > 0 and sum(r["backward"]) > 0 for r in split)
    for half in (split[:2], split[2:]):
        assert all(sum(fw) + sum(bw) == 0 for fw, bw in _spans_of(half))


def _machine_command(rank: int, port: int, out: Path) -> list[str]:
    """`accelerate launch` as machine `rank` of 2, one process each, both on this host (gloo: use_cpu=True)."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(MULTI_NODE_DDP_CONFIG),
        "--num_processes",  # the total over both machines
        "2",
        "--machine_rank",
        str(rank),
        "--main_process_port",
        str(port),
        "--mixed_precision",
        "no",
        str(WORKER),
        str(out),
        "--per-device",
        "3",
    ]


@pytest.mark.slow
def test_two_machines_on_one_host_equal_single_process(tmp_path, single_process):
    """Two machines (machine_rank 0 and 1, main_process_ip 127.0.0.1), one rank each, launched as on a cluster:
    the same rows, spans, λ and update as one process (grpo)."""
    out, port = tmp_path / "machines", _free_port()
    machines = [
        subprocess.Popen(
            _machine_command(rank, port, out),
            env={**os.environ, **_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    logs = [machine.communicate(timeout=600)[0] for machine in machines]
    for rank, (machine, log) in enumerate(zip(machines, logs, strict=True)):
        assert machine.returncode == 0, f"machine {rank} failed:\n{log[-6000:]}"
    assert json.loads((out / "rank1.json").read_text())["world_size"] == 2
    single_out, single = single_process("grpo")
    _assert_same_rows_and_update(single_out, single, out, _records(out))
