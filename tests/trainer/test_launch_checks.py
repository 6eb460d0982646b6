"""A sharded accelerate launch that accelerate sets up unsharded is said in one line at start-up.

accelerate's launcher passes a config's FSDP/DeepSpeed choice to the process as ACCELERATE_USE_FSDP /
ACCELERATE_USE_DEEPSPEED; accelerate itself then decides the distributed type, and on CPU it never picks FSDP
(two ranks under configs/accelerate/fsdp.yaml and use_cpu=True run MULTI_CPU, i.e. DDP: launched by
tests/trainer/test_fsdp_cpu_launch.py, which also checks the line those ranks print).
The in-process test lets accelerate make that decision itself, so it fails if accelerate starts to shard on CPU.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402
from gtpo.trainer.launch_checks import unsharded_fallback  # noqa: E402
from trainer_helpers import make_dataset, table_reward  # noqa: E402


@pytest.mark.parametrize(
    ("env", "distributed_type", "processes", "expected"),
    [
        ({"ACCELERATE_USE_FSDP": "true"}, "MULTI_CPU", 2, ("FSDP", "MULTI_CPU on 2 processes")),
        ({"ACCELERATE_USE_FSDP": "True"}, "NO", 1, ("FSDP", "NO on one process")),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "MULTI_CPU", 2, ("DeepSpeed", "MULTI_CPU on 2 processes")),
        ({"ACCELERATE_USE_FSDP": "true"}, "FSDP", 8, None),  # honoured
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DEEPSPEED", 8, None),  # honoured
        ({"ACCELERATE_USE_FSDP": "false"}, "MULTI_CPU", 2, None),  # nothing sharded asked for
        ({}, "NO", 1, None),
    ],
)
def test_unsharded_fallback_names_what_was_asked_and_what_runs(env, distributed_type, processes, expected):
    """The line appears exactly when a sharded config was asked for and a different distributed type runs."""
    line = unsharded_fallback(env, distributed_type, processes)
    if expected is None:
        assert line is None
    else:
        label, runs = expected
        assert f"launched for {label} " in line and runs in line and "\n" not in line


def _tiny_trainer(tmp_path, tiny_model_path) -> GTPOTrainer:
    args = GTPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
    )
    return GTPOTrainer(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset(4))


@pytest.mark.parametrize("asked", [None, "ACCELERATE_USE_FSDP"])
def test_fsdp_asked_on_cpu_is_logged_as_unsharded(tmp_path, tiny_model_path, monkeypatch, caplog, asked):
    """With the FSDP launcher's flag in the environment and use_cpu=True, accelerate sets up no FSDP, and the trainer
    says so once; without the flag nothing is said."""
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    if asked:
        monkeypatch.setenv(asked, "true")
        monkeypatch.setenv("FSDP_VERSION", "2")
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.launch_checks"):
        trainer = _tiny_trainer(tmp_path, tiny_model_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "gtpo.trainer.launch_checks"]
    assert not trainer.is_fsdp_enabled  # accelerate's own decision on CPU
    if asked:
        assert len(lines) == 1 and "launched for FSDP " in lines[0] and "nothing is sharded" in lines[0]
    else:
        assert lines == []
