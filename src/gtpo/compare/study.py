"""``gtpo compare``: run several arms (recipes or variants of one recipe) over several seeds, then aggregate.

Every (arm, seed) is an ordinary ``gtpo train`` run in its own run folder::

    OUT/compare.json              the study's spec: arms, seeds, common flags (a rerun must match it)
    OUT/runs/<arm>/seed<S>/       gtpo train --config RECIPE [common] [variant] --seed S --output_dir ...
    OUT/summary.md, summary.json  per-arm means with 95% intervals, paired differences, stability
    OUT/figures/                  curves per arm (mean over seeds, 95% band), stability per run

A rerun of the same command (or ``gtpo compare --output_dir OUT`` alone, which reads compare.json) skips
finished runs, resumes interrupted ones from their newest complete checkpoint, and starts the others afresh,
so a study stopped at any point continues where it was. Runs are checkpointed every ``--save_steps``.

Runs go one after the other through ``--launcher`` (default: this Python, ``-m gtpo.cli``). On many GPUs,
either give a multi-GPU launcher (``--launcher "accelerate launch --num_processes 8 -m gtpo.cli"``) or
``--dry_run`` to print one ``gtpo train`` command per missing run and run them wherever you like (one per GPU
or per node, with ``CUDA_VISIBLE_DEVICES``); then ``gtpo compare --output_dir OUT --aggregate_only``.

The aggregation (summary, figures) is :mod:`gtpo.compare.report`; the statistics are :mod:`gtpo.compare.stats`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gtpo.errors import InvalidInput
from gtpo.runs.folder import latest_checkpoint, run_status
from gtpo.runs.metrics_log import prepare_for_resume

logger = logging.getLogger(__name__)

SPEC_FILE = "compare.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class Arm:
    """One arm: a recipe plus the flags that make this arm (empty for a plain recipe)."""

    name: str
    recipe: str
    args: list[str] = field(default_factory=list)


@dataclass
class Spec:
    """What a study runs; written to OUT/compare.json and checked on every rerun."""

    arms: list[Arm]
    seeds: list[int]
    common: list[str] = field(default_factory=list)  # flags given to every run (after `--`)
    save_steps: int = 10
    # Held-out evaluation of each finished run (gtpo eval), or None: task, split, n, limit, max_new_tokens,
    # batch_size, dtype (see :data:`EVAL_DEFAULTS`). Kept in compare.json so that continuing a study evaluates too.
    eval: dict | None = None

    def to_json(self) -> dict:
        data = asdict(self)
        if data["eval"] is None:
            del data["eval"]  # compare.json of studies without evaluation stays as it was
        return data

    @classmethod
    def from_json(cls, data: dict) -> Spec:
        return cls(
            [Arm(**a) for a in data["arms"]],
            [int(s) for s in data["seeds"]],
            list(data.get("common", [])),
            int(data.get("save_steps", 10)),
            data.get("eval"),
        )


# What `--eval` evaluates unless told otherwise (task None: the run's own task; max_new_tokens None: the
# run's max_completion_length; dtype None: the run's dtype).
EVAL_DEFAULTS = {
    "task": None,
    "split": "test",
    "n": 4,
    "limit": 40,
    "max_new_tokens": None,
    "batch_size": None,  # None: gtpo eval's own default (gtpo.eval.runner.DEFAULT_BATCH_SIZE)
    "dtype": None,
}


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return Path(out) / "runs" / arm / f"seed{seed}"


def parse_arms(recipes: list[str], variants: list[str]) -> list[Arm]:
    """Arms from ``--recipe [NAME=]PATH ...`` and ``--variant NAME:--KEY VALUE ...`` (variants of one recipe)."""
    arms = []
    for item in recipes:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).stem, item
        arms.append(Arm(name, path))
    if variants:
        if len(arms) != 1:
            raise InvalidInput(
                f"--variant needs exactly one --recipe to vary, got {len(arms)}; "
                "give one --recipe, or several recipes and no --variant"
            )
        base, arms = arms[0], []
        for item in variants:
            name, sep, flags = item.partition(":")
            if not sep:
                raise InvalidInput(
                    f"--variant {item!r} must be NAME:FLAGS, e.g. 'grpo:--algorithm grpo' "
                    "(an empty FLAGS, 'gtpo:', is the recipe as it is)"
                )
            arms.append(Arm(name.strip(), base.recipe, shlex.split(flags)))
    if not arms:
        raise InvalidInput("give at least one arm: --recipe PATH (several), or --recipe PATH with --variant NAME:FLAGS")
    names = [a.name for a in arms]
    for arm in arms:
        if not _NAME.fullmatch(arm.name):
            raise InvalidInput(f"arm name {arm.name!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        if not Path(arm.recipe).is_file():
            raise InvalidInput(f"recipe {arm.recipe!r} of arm {arm.name!r} not found")
        for flag in arm.args:
            if flag in ("--seed", "--output_dir", "--resume_from_checkpoint"):
                raise InvalidInput(f"arm {arm.name!r} sets {flag}; gtpo compare sets it per run, remove it")
    if len(set(names)) != len(names):
        raise InvalidInput(f"arm names must differ, got {names}; name recipes as NAME=PATH")
    return arms


def train_command(
    spec: Spec, arm: Arm, seed: int, out: Path, launcher: list[str], resume: Path | None = None
) -> list[str]:
    """The ``gtpo train`` command line of one run; flags later on the line win (arm over common)."""
    command = [
        *launcher,
        "train",
        "--config",
        arm.recipe,
        *spec.common,
        *arm.args,
        "--seed",
        str(seed),
        "--output_dir",
        str(run_dir(out, arm.name, seed)),
        "--save_strategy",
        "steps",
        "--save_steps",
        str(spec.save_steps),
        "--save_total_limit",
        "2",
    ]
    if resume is not None:
        command += ["--resume_from_checkpoint", str(resume)]
    return command


def _unevaluable(spec: Spec, folder: Path) -> bool:
    """A finished run the study still has to evaluate whose model/ is gone: weights are never committed, so
    a study continued on another machine (or after one was shut down mid-evaluation) has its run.json and
    metrics.jsonl but nothing to evaluate. Training it again is the only way to complete it."""
    if spec.eval is None or (folder / "model").is_dir():
        return False
    args = json.loads((folder / "run.json").read_text())["args"]
    return not _eval_results(folder, spec.eval.get("task"), args).is_file()


def _eval_results(folder: Path, task: str | None, args: dict) -> Path:
    """Where a finished run's held-out results go: RUN/eval/<task>/results.json, by default the task the run
    trained on (``args``: its run.json's resolved arguments)."""
    return folder / "eval" / (task or args["TrainScriptArguments"]["task"]) / "results.json"


def plan(spec: Spec, out: Path) -> list[tuple[Arm, int, str, Path | None]]:
    """Every run with what to do: ('done', None), ('resume', checkpoint), ('start', None) or ('retrain', None)
    (finished, but its held-out evaluation is missing and so is the model it needs).

    Seeds go in the outer loop, so that an interrupted study has whole seeds of every arm (paired data)."""
    todo = []
    for seed in spec.seeds:
        for arm in spec.arms:
            folder = run_dir(out, arm.name, seed)
            status = run_status(folder)
            if status == "finished":
                todo.append((arm, seed, "retrain" if _unevaluable(spec, folder) else "done", None))
                continue
            checkpoint = latest_checkpoint(folder) if folder.is_dir() else None
            todo.append((arm, seed, "resume" if checkpoint else "start", checkpoint))
    return todo


def missing_commands(spec: Spec, out: Path, launcher: list[str]) -> list[list[str]]:
    """The `gtpo train` command of every run not finished yet (what ``--dry_run`` prints)."""
    return [
        train_command(spec, arm, seed, out, launcher, checkpoint)
        for arm, seed, action, checkpoint in plan(spec, out)
        if action != "done"
    ]


def _after_run(hook: str | None, folder: Path) -> None:
    """Run the user's ``--after_run`` shell command for a run that just finished (and was evaluated), with
    GTPO_RUN_DIR set to its folder; a failing hook is reported, never fatal (the study goes on)."""
    if not hook:
        return
    result = subprocess.run(hook, shell=True, env={**os.environ, "GTPO_RUN_DIR": str(folder)})
    if result.returncode != 0:
        logger.error("--after_run exited with %d for %s", result.returncode, folder)


def run_all(spec: Spec, out: Path, launcher: list[str], after_run: str | None = None) -> list[str]:
    """Run every missing run in turn, each evaluated right after it finishes when the spec asks for it (so a
    study stopped at any point has every finished run complete); returns the names of runs that failed."""
    failed = []
    for arm, seed, action, checkpoint in plan(spec, out):
        name = f"{arm.name}/seed{seed}"
        folder = run_dir(out, arm.name, seed)
        if action == "done":
            logger.info("%s: finished, skipped", name)
            if spec.eval is not None and evaluate_run(arm, seed, out, launcher, **spec.eval) == "ran":
                _after_run(after_run, folder)
            continue
        command = train_command(spec, arm, seed, out, launcher, checkpoint)
        if action == "resume":
            if (folder / "metrics.jsonl").is_file():  # the resumed run logs the later steps again
                prepare_for_resume(folder / "metrics.jsonl", int(checkpoint.name.split("-")[-1]))
            logger.info("%s: resuming from %s", name, checkpoint)
        elif action == "retrain":
            logger.warning(
                "%s: finished, but its model/ is gone and it has no held-out results yet (weights are not "
                "committed): training it again from the start",
                name,
            )
            shutil.rmtree(folder)
        elif folder.exists():
            # Interrupted before its first checkpoint: nothing to resume, start it afresh.
            logger.info("%s: no complete checkpoint in %s, starting afresh", name, folder)
            shutil.rmtree(folder)
        else:
            logger.info("%s: starting", name)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "train.log").open("a") as log:
            log.write(f"$ {shlex.join(command)}\n")
            log.flush()
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            logger.error("%s: gtpo train exited with %d; see %s", name, result.returncode, folder / "train.log")
            failed.append(name)
            continue
        if spec.eval is not None and evaluate_run(arm, seed, out, launcher, **spec.eval) == "failed":
            failed.append(f"{name} (eval)")
            continue
        _after_run(after_run, folder)
    return failed


def write_or_check_spec(spec: Spec, out: Path) -> None:
    """Write OUT/compare.json, or check that an existing one describes the same study, and merge into ``spec``
    what a rerun may add: more seeds, and more arms (new names, appended after the study's own). An arm the study
    already has must come back unchanged (same recipe and flags), and the common flags must be the same: a
    change would mix runs of two settings under one name. Arms left off the command line stay in the study."""
    path = Path(out) / SPEC_FILE
    if path.is_file():
        old = Spec.from_json(json.loads(path.read_text()))
        known = {arm.name: arm for arm in old.arms}
        changed = [arm.name for arm in spec.arms if arm.name in known and arm != known[arm.name]]
        if changed or (old.common, old.save_steps) != (spec.common, spec.save_steps):
            what = (
                f"arm {changed[0]!r} has other recipe or flags"
                if changed
                else "the common flags or --save_steps differ"
            )
            raise InvalidInput(
                f"{path} describes a different study ({what}); use another --output_dir, or rerun with the same "
                "arms and flags (`gtpo compare --output_dir OUT` reuses them; new arm names are added)"
            )
        added = [arm for arm in spec.arms if arm.name not in known]
        if added:
            logger.info("adding arm(s) %s to the study in %s", ", ".join(a.name for a in added), out)
        spec.arms = old.arms + added
        if old.eval is not None and spec.eval is not None and old.eval != spec.eval:
            raise InvalidInput(
                f"{path} evaluates with {old.eval}, not {spec.eval}; drop the --eval-* flags to keep the "
                "study's settings, or use another --output_dir"
            )
        spec.eval = spec.eval if spec.eval is not None else old.eval  # a study's evaluation, once set, stays
        spec.seeds = old.seeds + [s for s in spec.seeds if s not in old.seeds]  # more seeds may be added
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_json(), indent=2) + "\n")


def evaluate_run(arm, seed: int, out: Path, launcher: list[str], **settings) -> str:
    """`gtpo eval` one finished run's model into RUN/eval/<task>/.

    ``settings``: the keys of :data:`EVAL_DEFAULTS` (task, split, n, limit, max_new_tokens, batch_size, dtype);
    a key not given takes its default there. Returns 'ran', 'skipped' (the run is unfinished, or its results.json
    exists) or 'failed'."""
    unknown = set(settings) - set(EVAL_DEFAULTS)
    if unknown:
        raise TypeError(f"evaluate_run: unknown evaluation settings {sorted(unknown)}; known: {sorted(EVAL_DEFAULTS)}")
    settings = {**EVAL_DEFAULTS, **settings}
    task, split, n, limit = settings["task"], settings["split"], settings["n"], settings["limit"]
    max_new_tokens, batch_size, dtype = settings["max_new_tokens"], settings["batch_size"], settings["dtype"]
    folder = run_dir(out, arm.name, seed)
    if run_status(folder) != "finished":
        return "skipped"
    record = json.loads((folder / "run.json").read_text())["args"]
    results = _eval_results(folder, task, record)
    run_task = results.parent.name
    if results.is_file():
        return "skipped"
    tokens = max_new_tokens or record["GTPOConfig"]["max_completion_length"]
    dtype = dtype or record["ModelConfig"].get("dtype")
    command = [
        *launcher,
        "eval",
        "--model",
        str(folder / "model"),
        "--label",
        f"{arm.name}-seed{seed}",
        "--task",
        run_task,
        "--split",
        split,
        "-n",
        str(n),
        "--limit",
        str(limit),
        "--max_new_tokens",
        str(tokens),
        "--output_dir",
        str(folder / "eval"),
        "--no_progress",
    ]
    if batch_size is not None:
        command += ["--batch_size", str(batch_size)]
    if dtype and dtype != "auto":
        command += ["--dtype", str(dtype)]
    logger.info("%s/seed%d: evaluating", arm.name, seed)
    with (folder / "eval.log").open("a") as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        logger.error(
            "%s/seed%d: gtpo eval exited with %d; see %s", arm.name, seed, result.returncode, folder / "eval.log"
        )
        return "failed"
    return "ran"


def evaluate_runs(spec, out: Path, launcher: list[str], **settings) -> None:
    """:func:`evaluate_run` for every (arm, seed) of the study; settings as :data:`gtpo.compare.study.EVAL_DEFAULTS`."""
    for arm in spec.arms:
        for seed in spec.seeds:
            evaluate_run(arm, seed, out, launcher, **settings)
