"""`gtpo compare` end to end with the tiny model: 2 arms x 2 seeds, one of them already finished (recorded, so it
must be skipped), then an interrupted run is finished by a rerun that leaves the finished runs alone."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_helpers import run_gtpo


@pytest.mark.slow
def test_compare_runs_every_arm_and_seed_and_a_rerun_finishes_only_the_interrupted_run(tmp_path, tiny_model_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        f"model_name_or_path: {tiny_model_path}\ndtype: float32\nmax_steps: 2\nnum_generations: 2\n"
        "per_device_train_batch_size: 2\nmax_completion_length: 6\ninitial_entropy_prompts: 2\nnum_examples: 8\n"
        "report_to: none\nlogging_steps: 1\nplot: false\n"
    )
    study = tmp_path / "study"
    done = study / "runs" / "grpo" / "seed0"  # finished before this compare started: must be left alone
    done.mkdir(parents=True)
    (done / "model").mkdir()
    (done / "run.json").write_text(json.dumps({"status": "finished", "args": {"GTPOConfig": {"max_steps": 2}}}))
    (done / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward": 1.0, "entropy": 1.0}) + "\n" for s in (1, 2))
    )
    done_files = {p: p.read_bytes() for p in done.rglob("*") if p.is_file()}
    first = run_gtpo(
        [
            "compare",
            "--recipe",
            str(recipe),
            "--variant",
            "gtpo:",
            "--variant",
            "grpo:--algorithm grpo",
            "--seeds",
            "0",
            "1",
            "--save-steps",
            "1",
            "-o",
            str(study),
        ],
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((study / "summary.json").read_text())
    assert (summary["finished_runs"], summary["total_runs"]) == (4, 4)
    assert set(summary["runs"]) == {"gtpo/seed0", "gtpo/seed1", "grpo/seed0", "grpo/seed1"}
    assert {p: p.read_bytes() for p in done.rglob("*") if p.is_file()} == done_files
    for arm, algorithm, seed in (("gtpo", "gtpo", 0), ("gtpo", "gtpo", 1), ("grpo", "grpo", 1)):
        args = json.loads((study / "runs" / arm / f"seed{seed}" / "run.json").read_text())["args"]["GTPOConfig"]
        assert (args["algorithm"], args["seed"]) == (algorithm, seed)
    assert (study / "figures" / "training_curves.png").is_file() and (study / "figures" / "stability.png").is_file()

    # Interrupt gtpo/seed1 after step 1: no final model, no checkpoint-2, a step-2 row logged before the kill.
    killed = study / "runs" / "gtpo" / "seed1"
    shutil.rmtree(killed / "model")
    shutil.rmtree(killed / "checkpoint-2")
    record = json.loads((killed / "run.json").read_text())
    record["status"] = "running"
    (killed / "run.json").write_text(json.dumps(record))
    logs_before = {p: p.read_text() for p in study.glob("runs/*/seed*/train.log")}

    second = run_gtpo(["compare", "-o", str(study)], cwd=tmp_path)  # the spec comes from compare.json
    assert second.returncode == 0, second.stderr[-3000:]
    for path, text in logs_before.items():
        if path.parent == killed:
            assert "--resume_from_checkpoint" in path.read_text()[len(text) :], "the interrupted run must resume"
            assert str(killed / "checkpoint-1") in path.read_text()
        else:
            assert path.read_text() == text, f"{path.parent} was finished and must not run again"
    assert {p: p.read_bytes() for p in done.rglob("*") if p.is_file()} == done_files
    steps = [
        json.loads(line)["step"]
        for line in (killed / "metrics.jsonl").read_text().splitlines()
        if "reward" in json.loads(line)
    ]
    assert steps == [1, 2], "a resumed run keeps one metrics row per step"
    assert (killed / "model").is_dir()
    assert json.loads((study / "summary.json").read_text())["finished_runs"] == 4
