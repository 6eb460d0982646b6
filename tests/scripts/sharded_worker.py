"""GTPO's steps under FSDP2 / DeepSpeed ZeRO-2 / ZeRO-3 against the unsharded run, on fixed replayed completions.

scripts/gpu_checks.sh's groups `fsdp`, `zero2` and `zero3` run, on one GPU:

    python tests/scripts/sharded_worker.py check fsdp LOG_DIR/fsdp     # or zero2, zero3

which runs (1) the unsharded reference, `python sharded_worker.py run LOG_DIR/fsdp/plain`, (2) the same steps under
`accelerate launch --config_file configs/accelerate/<config>.yaml --num_processes 1 --mixed_precision no`, and (3)
`compare`: per step the loss, the gradient norm and GTPO's metrics (gtpo/*, entropy, reward) agree within
METRIC_TOLERANCE, and both saved models reload with `from_pretrained` and agree within WEIGHT_TOLERANCE.

Why replayed completions: sharded runs generate through TRL's `generate` (gtpo's fast decode is off under
DeepSpeed/FSDP) and skip prefix sharing, so sampled completions would differ; `FixedGeneration` gives both runs the
same rows (as spans_worker.py and benchmarks/bench_loss_step.py do), and what is compared is the loss path alone.
Float32 throughout (`--mixed_precision no`): the configs' bf16 would make the arms differ by autocast policy, not by
sharding. SGD, so an update is linear in the gradient (Adam's first steps amplify rounding in near-zero gradients).

`check --dry-run` prints the commands and checks the config (parsed by accelerate) without running anything: the
CPU tests use it. `run --cpu` is the unsharded run on a CPU (the tests compare two of them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
WHEELS = ROOT / ".whl"  # DeepSpeed built without compiled ops (DS_BUILD_OPS=0) and its pure dependencies
# What each group's config must say (parsed by accelerate), so a config edited away from its name fails loudly.
EXPECTED = {"fsdp": ("FSDP", None), "zero2": ("DEEPSPEED", 2), "zero3": ("DEEPSPEED", 3)}
STEPS = 3
# Float32 on one GPU: sharding changes only the order of reductions (FSDP's reduce-scatter, ZeRO's bucketed
# all-reduce / partitioned gradients), which moves float32 sums by ~1e-6 relative; 1e-4 leaves a wide margin while
# any real difference in the loss path (a missing λ, a wrong token count, a mask) moves these by 1e-2 or more.
METRIC_TOLERANCE = {"rel": 1e-4, "abs": 1e-5}
WEIGHT_TOLERANCE = 1e-4  # max |Δw| after STEPS SGD steps at learning rate 0.1
METRIC_KEYS = ("loss", "grad_norm", "entropy", "reward")  # and every "gtpo/..." key


def group_config(name: str) -> Path:
    """The accelerate config of a group, checked against what the group's name promises.

    Args:
        name: "fsdp", "zero2" or "zero3".

    Returns:
        configs/accelerate/<name>.yaml.
    """
    if name not in EXPECTED:
        raise SystemExit(f"unknown sharded group {name!r}: use one of {', '.join(EXPECTED)}")
    from accelerate.commands.config.config_args import load_config_from_file

    path = CONFIGS / f"{name}.yaml"
    config = load_config_from_file(str(path))
    distributed_type, zero_stage = EXPECTED[name]
    found = (config.distributed_type.value, (config.deepspeed_config or {}).get("zero_stage"))
    if found != (distributed_type, zero_stage):
        raise SystemExit(f"{path.name} sets {found}, not {(distributed_type, zero_stage)}: restore it or rename it")
    if name == "fsdp" and (config.fsdp_config or {}).get("fsdp_version") != 2:
        raise SystemExit(f"{path.name} is not FSDP2 (fsdp_version: 2): the fsdp group checks FSDP2")
    return path


def commands(name: str, out: Path, python: str = sys.executable) -> dict[str, list[str]]:
    """The three commands of a group: the unsharded reference, the sharded run, the comparison.

    Args:
        name: the group ("fsdp", "zero2", "zero3").
        out: the group's folder; runs go to out/plain and out/<name>.
        python: the interpreter.

    Returns:
        {"plain": argv, "sharded": argv, "compare": argv}.
    """
    worker = str(Path(__file__).resolve())
    return {
        "plain": [python, worker, "run", str(out / "plain")],
        # No --cpu: with --cpu accelerate would run one plain process and ignore the sharded config.
        "sharded": [
            python,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(group_config(name)),
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            worker,
            "run",
            str(out / name),
            "--expect",
            name,
        ],  # fmt: skip
        "compare": [python, worker, "compare", str(out / "plain"), str(out / name)],
    }


def ensure_deepspeed(python: str = sys.executable) -> None:
    """Install DeepSpeed from .whl/ when it is missing (a GPU machine may have no network)."""
    if importlib.util.find_spec("deepspeed") is not None:
        return
    if not any(WHEELS.glob("deepspeed-*.whl")):
        raise SystemExit(
            "deepspeed is not installed and .whl/ holds no deepspeed wheel: build one on a machine with network "
            "(docs/recipes.md, 'Sharded training on a GPU')"
        )
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELS), "deepspeed"],
                   check=True)  # fmt: skip


def step_metrics(log_history: list[dict]) -> list[dict]:
    """The per-step rows of the Trainer's log history, each reduced to the compared keys.

    Args:
        log_history: `trainer.state.log_history` (logging_steps=1).

    Returns:
        One dict per optimizer step, in order: {key: float} over METRIC_KEYS and every gtpo/* key present.
    """
    rows = [row for row in log_history if "loss" in row and "step" in row]
    return [
        {k: float(v) for k, v in row.items() if (k in METRIC_KEYS or k.startswith("gtpo/")) and v is not None}
        for row in rows
    ]


def metric_mismatches(reference: list[dict], other: list[dict], tolerance: dict = METRIC_TOLERANCE) -> list[str]:
    """Where two runs' per-step metrics differ beyond the tolerance (|a - b| > abs + rel * |a|).

    Args:
        reference, other: `step_metrics` of the two runs.
        tolerance: {"rel": ..., "abs": ...}.

    Returns:
        One line per mismatch (a missing step or key counts); empty when they agree.
    """
    if len(reference) != len(other):
        return [f"{len(reference)} steps against {len(other)}"]
    problems = []
    for step, (a, b) in enumerate(zip(reference, other, strict=True), start=1):
        if a.keys() != b.keys():
            problems.append(f"step {step}: keys differ: {sorted(a.keys() ^ b.keys())}")
        for key in sorted(a.keys() & b.keys()):
            x, y = a[key], b[key]
            if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > tolerance["abs"] + tolerance["rel"] * abs(x):
                problems.append(f"step {step}: {key} {x:.8g} against {y:.8g}")
    return problems


def weight_difference(reference: Path, other: Path) -> float:
    """Reload both saved models with `from_pretrained` and return the largest |Δw| over their parameters."""
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(reference, dtype="float32").state_dict()
    b = AutoModelForCausalLM.from_pretrained(other, dtype="float32").state_dict()
    if a.keys() != b.keys():
        raise SystemExit(f"the saved models hold different tensors: {sorted(a.keys() ^ b.keys())[:5]}")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def run(out: Path, cpu: bool, expect: str | None, prefix_sharing: bool = True) -> None:
    """STEPS GTPO steps of the tiny model on replayed completions; writes out/metrics.json and out/model.

    Args:
        out: the run's folder.
        cpu: use_cpu=True.
        expect: "fsdp", "zero2" or "zero3": fail unless accelerate set that up; None for the unsharded run.
        prefix_sharing: GTPOConfig.use_prefix_sharing (sharded runs go without it whatever it says).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gtpo import GTPOConfig, GTPOTrainer
    from gtpo.models import tiny_model_dir
    from trainer_helpers import FixedGeneration, make_dataset, table_reward

    class ReplayedGTPO(FixedGeneration, GTPOTrainer):
        pass

    args = GTPOConfig(
        output_dir=str(out / "run"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        max_steps=STEPS,
        optim="sgd",
        learning_rate=0.1,
        max_grad_norm=1.0,  # so the gradient norm is computed and logged, by each back-end itself
        lr_scheduler_type="constant",
        logging_steps=1,
        initial_entropy_prompts=4,
        report_to=[],
        use_cpu=cpu,
        bf16=False,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        gradient_checkpointing=False,
        use_prefix_sharing=prefix_sharing,
    )
    trainer = ReplayedGTPO(
        model=str(tiny_model_dir()), reward_funcs=table_reward, args=args, train_dataset=make_dataset(8 * STEPS)
    )
    if expect is not None:  # the sharded run must really be sharded (accelerate can fall back without a word)
        sharded = trainer.is_fsdp_enabled if expect == "fsdp" else trainer.is_deepspeed_enabled
        if not sharded:
            raise SystemExit(f"asked for {expect} but accelerate set up {trainer.accelerator.distributed_type}")
    trainer.train()
    trainer.save_model(str(out / "model"))  # gathers FSDP / ZeRO-3 shards into one checkpoint
    if trainer.accelerator.is_main_process:
        record = {
            "distributed_type": str(trainer.accelerator.distributed_type),
            "device": str(trainer.accelerator.device),
            "initial_entropy": trainer.initial_entropy,
            "steps": step_metrics(trainer.state.log_history),
        }
        (out / "metrics.json").write_text(json.dumps(record, indent=1))
        print(json.dumps(record))


def compare(reference: Path, other: Path) -> int:
    """Print the comparison of two runs and return the exit status (0 when they agree)."""
    a = json.loads((reference / "metrics.json").read_text())
    b = json.loads((other / "metrics.json").read_text())
    problems = metric_mismatches(a["steps"], b["steps"])
    if a["initial_entropy"] is None or abs(a["initial_entropy"] - b["initial_entropy"]) > 1e-4:
        problems.append(f"⟨H⟩_ini {a['initial_entropy']} against {b['initial_entropy']}")
    weights = weight_difference(reference / "model", other / "model")
    if not weights <= WEIGHT_TOLERANCE:
        problems.append(f"reloaded weights differ by up to {weights:.3g} (> {WEIGHT_TOLERANCE})")
    print(f"{a['distributed_type']} ({a['device']}) against {b['distributed_type']} ({b['device']}), {len(a['steps'])}"
          f" steps; tolerance {METRIC_TOLERANCE}, weights {WEIGHT_TOLERANCE}")  # fmt: skip
    for step, (x, y) in enumerate(zip(a["steps"], b["steps"], strict=False), start=1):
        print(f"step {step}: " + ", ".join(f"{k} {x[k]:.6g}/{y.get(k, float('nan')):.6g}" for k in sorted(x)))
    print(f"reloaded weights: max |Δw| = {weights:.3g}")
    print("sharded check: " + ("PASSED" if not problems else "FAILED\n  " + "\n  ".join(problems)))
    return 0 if not problems else 1


def check(name: str, out: Path, dry_run: bool) -> int:
    """A whole group: reference, sharded run, comparison; each command printed before it runs."""
    steps = commands(name, out)
    if dry_run:
        for label, argv in steps.items():
            print(f"{label}: {' '.join(argv)}")
        return 0
    if name.startswith("zero"):
        ensure_deepspeed()
    for label, argv in steps.items():
        print(f"== {label}: {' '.join(argv)}", flush=True)
        done = subprocess.run(argv, check=False)
        if done.returncode != 0:
            print(f"sharded check: FAILED ({label} exited with {done.returncode})")
            return done.returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="STEPS GTPO steps on replayed completions, saved")
    run_parser.add_argument("out", type=Path)
    run_parser.add_argument("--cpu", action="store_true", help="on a CPU (use_cpu=True)")
    run_parser.add_argument("--expect", choices=sorted(EXPECTED), help="fail unless accelerate set this up")
    run_parser.add_argument("--no-prefix-sharing", action="store_true", help="the padded layout, as sharded runs")
    compare_parser = sub.add_parser("compare", help="two runs' metrics and reloaded weights")
    compare_parser.add_argument("reference", type=Path)
    compare_parser.add_argument("other", type=Path)
    check_parser = sub.add_parser("check", help="reference, sharded run and comparison for one group")
    check_parser.add_argument("group", help="fsdp, zero2 or zero3")
    check_parser.add_argument("out", type=Path)
    check_parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    options = parser.parse_args(argv)
    if options.command == "run":
        options.out.mkdir(parents=True, exist_ok=True)
        run(options.out, options.cpu, options.expect, prefix_sharing=not options.no_prefix_sharing)
        return 0
    if options.command == "compare":
        return compare(options.reference, options.other)
    return check(options.group, options.out, options.dry_run)


if __name__ == "__main__":
    sys.exit(main())
