"""What a CPU can run of the sharded GPU checks (scripts/gpu_checks.sh groups fsdp, zero2, zero3).

The groups run tests/scripts/sharded_worker.py, which compares a sharded run against the unsharded one. Here: the
groups' config parsing and command lines, the comparison against hand-made metrics, and the whole comparison with
the unsharded path on both sides, one with prefix sharing and one without it (the layout sharded runs use), so the
stated tolerance is shown to hold across the layout change a sharded run brings and to reject a real difference.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import sharded_worker  # noqa: E402


@pytest.mark.parametrize("group", ["fsdp", "zero2", "zero3"])
def test_group_commands_launch_the_shipped_config_without_cpu(tmp_path, group, capsys):
    """Each group launches its own shipped config on one process in float32, never with `--cpu` (which would run
    one plain process and ignore the config), and the sharded run must find the back-end it was launched for."""
    assert sharded_worker.main(["check", group, str(tmp_path), "--dry-run"]) == 0
    printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert printed.keys() == {"plain", "sharded", "compare"}
    sharded = printed["sharded"].split()
    assert "--cpu" not in sharded and "--cpu" not in printed["plain"].split()
    assert sharded[sharded.index("--config_file") + 1].endswith(f"configs/accelerate/{group}.yaml")
    assert sharded[sharded.index("--num_processes") + 1] == "1"
    assert sharded[sharded.index("--mixed_precision") + 1] == "no"
    assert sharded[-2:] == ["--expect", group]
    assert printed["compare"].split()[-2:] == [str(tmp_path / "plain"), str(tmp_path / group)]


def test_unknown_group_or_edited_config_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="unknown sharded group 'zero1': use one of fsdp, zero2, zero3"):
        sharded_worker.group_config("zero1")
    # A config whose contents no longer match its group's name (here zero2.yaml under zero3's name).
    shutil.copy(sharded_worker.CONFIGS / "zero2.yaml", tmp_path / "zero3.yaml")
    monkeypatch.setattr(sharded_worker, "CONFIGS", tmp_path)
    with pytest.raises(SystemExit, match=r"zero3.yaml sets \('DEEPSPEED', 2\), not \('DEEPSPEED', 3\)"):
        sharded_worker.group_config("zero3")


def test_metric_mismatches_against_hand_made_steps():
    """|a - b| > abs + rel·|a| is a mismatch; missing steps and keys are too; equal runs give none."""
    steps = [{"loss": 0.5, "grad_norm": 2.0, "gtpo/mean_lambda": 1.0}, {"loss": 0.25, "grad_norm": 1.0}]
    assert sharded_worker.metric_mismatches(steps, [dict(row) for row in steps]) == []
    tolerance = {"rel": 1e-4, "abs": 1e-5}
    within = [dict(steps[0], loss=0.5 + 0.5e-4), steps[1]]  # 5e-5 <= 1e-5 + 1e-4 * 0.5 = 6e-5
    assert sharded_worker.metric_mismatches(steps, within, tolerance) == []
    beyond = [dict(steps[0], loss=0.5 + 0.7e-4), steps[1]]  # 7e-5 > 6e-5
    assert sharded_worker.metric_mismatches(steps, beyond, tolerance) == ["step 1: loss 0.5 against 0.50007"]
    assert sharded_worker.metric_mismatches(steps, steps[:1]) == ["2 steps against 1"]
    missing = [steps[0], {"loss": 0.25}]
    assert sharded_worker.metric_mismatches(steps, missing) == ["step 2: keys differ: ['grad_norm']"]
    assert sharded_worker.metric_mismatches(steps, [dict(steps[0], loss=float("nan")), steps[1]]) == [
        "step 1: loss 0.5 against nan"
    ]


@pytest.mark.slow
def test_unsharded_on_both_sides_agree_and_a_changed_weight_is_caught(tmp_path, capsys):
    """The comparison a GPU group makes, with the unsharded path on both sides: prefix sharing against the padded
    layout (what changes in a sharded run besides sharding) agrees within the stated tolerance, on every compared
    metric of every step and on the reloaded weights; a saved weight moved by 1e-3 is reported."""
    plain, padded = tmp_path / "plain", tmp_path / "padded"
    sharded_worker.run(plain, cpu=True, expect=None)
    sharded_worker.run(padded, cpu=True, expect=None, prefix_sharing=False)
    steps = json.loads((plain / "metrics.json").read_text())["steps"]
    assert len(steps) == sharded_worker.STEPS
    assert {"loss", "grad_norm", "gtpo/mean_lambda", "gtpo/conflict_token_frac"} <= steps[0].keys()
    assert steps[0]["gtpo/conflict_token_frac"] > 0  # the replayed groups have conflicts: λ is exercised
    capsys.readouterr()
    assert sharded_worker.compare(plain, padded) == 0, capsys.readouterr().out
    assert "sharded check: PASSED" in capsys.readouterr().out

    from safetensors.torch import load_file, save_file

    weights = padded / "model" / "model.safetensors"
    state = load_file(weights)
    name = next(iter(state))
    state[name] = state[name] + 1e-3 * torch.ones_like(state[name])
    save_file(state, weights, metadata={"format": "pt"})
    assert sharded_worker.compare(plain, padded) == 1
    assert "reloaded weights differ by up to 0.001" in capsys.readouterr().out
