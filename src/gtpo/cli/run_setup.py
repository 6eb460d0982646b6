"""What `gtpo train` and `gtpo sft` do around the training itself: name and open the run folder, load the
task, and, at the end, plot the curves and print the summary. Argument parsing is `gtpo.cli`'s; the
training is `gtpo.trainer.policy.train_policy`; the run-folder rules are `gtpo.runs.folder`'s.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path


def default_run_dir(run_name: str | None, recipe_path: str | None) -> Path:
    """``runs/<YYYYmmdd-HHMMSS>-<name>``; in a multi-process launch, ``runs/<name>`` (same on every rank)."""
    name = run_name or (Path(recipe_path).stem if recipe_path else "gtpo")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return Path("runs") / slug
    return Path("runs") / f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{slug}"


def plan_run_dir(training_args, script_args, argv: list[str]) -> Path:
    """The run folder and checkpoint to resume (`gtpo.runs.folder.plan_run`); refuses a folder holding a run."""
    from gtpo.runs.folder import plan_run

    recipe_path = argv[argv.index("--config") + 1] if "--config" in argv else None
    default = default_run_dir(training_args.run_name, recipe_path)
    return plan_run(training_args, script_args.overwrite_output_dir, default, training_args.process_index == 0)


def load_dataset_for(script_args, seed: int = 0):
    """The task's rows with the paper's prompt (`gtpo.tasks.load_task`, which names the valid tasks when
    the name is wrong); run before any model is loaded."""
    from gtpo.tasks import load_task
    from gtpo.tasks.sources import parse_column_map

    return load_task(
        script_args.task,
        script_args.split,
        source=script_args.source,
        column_map=parse_column_map(script_args.column_map),
        few_shot=script_args.few_shot,
        num_examples=script_args.num_examples,
        seed=seed,
    )


def open_run_dir(
    command: str, argv: list[str], recipe: dict, script_args, training_args, model_args, dataset=None
) -> None:
    """Create the planned run folder (`plan_run_dir`) and write ``run.json`` (status running) into it, with the
    provenance of the model and of ``dataset`` (the task's rows, `gtpo.runs.provenance`)."""
    from gtpo.runs.folder import start_run
    from gtpo.runs.provenance import run_record

    if training_args.process_index == 0:
        record = run_record(
            ["gtpo", command, *argv],
            recipe,
            script_args,
            training_args,
            model_args,
            model=model_args.model_name_or_path,
            rows=dataset,
        )
        start_run(
            Path(training_args.output_dir),
            record,
            script_args.overwrite_output_dir,
            training_args.resume_from_checkpoint,
        )


def plot_run(run_dir: Path) -> list[Path]:
    from gtpo.runs.plots import plot_runs

    return plot_runs([run_dir], run_dir / "figures")


def print_summary(run_dir: Path, wall: float, final_dir: Path, figures: list[Path]) -> None:
    from gtpo.runs.metrics_log import first_last_means, read_metrics
    from gtpo.runs.plots import PANELS

    rows = read_metrics(run_dir)
    print(f"gtpo train: done in {wall / 60:.1f} min; model in {final_dir}; metrics in {run_dir / 'metrics.jsonl'}")
    panels = {p.name: p for p in PANELS}
    for name in ("reward", "format", "accuracy"):
        key = panels[name].key_for(rows)
        means = first_last_means(rows, key) if key else None
        if means:
            print(f"  {key}: mean of the first 10 steps {means[0]:.2f}, of the last 10 steps {means[1]:.2f}")
    if figures:
        print(f"  figures: {figures[0].parent}/ ({', '.join(p.name for p in figures)})")
