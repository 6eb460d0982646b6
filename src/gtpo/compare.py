"""``gtpo compare``: run several arms (recipes or variants of one recipe) over several seeds, then aggregate.

Every (arm, seed) is an ordinary ``gtpo train`` run in its own run folder::

    OUT/compare.json              the study's spec: arms, seeds, common flags (a rerun must match it)
    OUT/runs/<arm>/seed<S>/       gtpo train --config RECIPE [common] [variant] --seed S --output_dir ...
    OUT/summary.md, summary.json  per-arm means with 95% intervals, paired differences, stability
    OUT/figures/                  curves per arm (mean over seeds, 95% band), stability per run

A rerun of the same command (or ``gtpo compare --output-dir OUT`` alone, which reads compare.json) skips
finished runs, resumes interrupted ones from their newest complete checkpoint, and starts the others afresh,
so a study stopped at any point continues where it was. Runs are checkpointed every ``--save-steps``.

Runs go one after the other through ``--launcher`` (default: this Python, ``-m gtpo.cli``). On many GPUs,
either give a multi-GPU launcher (``--launcher "accelerate launch --num_processes 8 -m gtpo.cli"``) or
``--dry-run`` to print one ``gtpo train`` command per missing run and run them wherever you like (one per GPU
or per node, with ``CUDA_VISIBLE_DEVICES``); then ``gtpo compare --output-dir OUT --aggregate-only``.

The aggregation (summary, figures) is :mod:`gtpo.compare_report`; the statistics are :mod:`gtpo.stats`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

SPEC_FILE = "compare.json"
LOCK_FILE = "compare.lock"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

try:  # the run-folder helpers of `gtpo train` (contracts.md: run_status, latest_checkpoint)
    from gtpo.runfolder import latest_checkpoint, run_status
except ImportError:  # not merged yet: the same two questions answered from the files a run leaves

    def run_status(run_dir) -> str | None:
        """'finished' when the final model is saved and metrics.jsonl reached max_steps; 'running' when a
        run.json exists otherwise (the run is going on or was interrupted); None when there is no run.json."""
        run_dir = Path(run_dir)
        record_path = run_dir / "run.json"
        if not record_path.is_file():
            return None
        record = json.loads(record_path.read_text())
        if record.get("status"):
            return record["status"]
        max_steps = (record.get("args", {}).get("GTPOConfig") or {}).get("max_steps")
        if (run_dir / "model").is_dir() and max_steps and last_logged_step(run_dir) >= max_steps:
            return "finished"
        return "running"

    def latest_checkpoint(run_dir) -> Path | None:
        """The highest ``checkpoint-N`` holding ``trainer_state.json`` (written last, so it is complete)."""
        found = []
        for path in Path(run_dir).glob("checkpoint-*"):
            if path.name[len("checkpoint-") :].isdigit() and (path / "trainer_state.json").is_file():
                found.append((int(path.name[len("checkpoint-") :]), path))
        return max(found)[1] if found else None


def last_logged_step(run_dir: Path) -> int:
    """The largest ``step`` in run_dir/metrics.jsonl (0 when there is none)."""
    from gtpo.runlog import read_metrics

    try:
        return max((int(row.get("step", 0)) for row in read_metrics(run_dir)), default=0)
    except FileNotFoundError:
        return 0


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
        return cls([Arm(**a) for a in data["arms"]], [int(s) for s in data["seeds"]], list(data.get("common", [])),
                   int(data.get("save_steps", 10)), data.get("eval"))


# What `--eval` evaluates unless told otherwise (task None: the run's own task; max_new_tokens None: the
# run's max_completion_length; dtype None: the run's dtype).
EVAL_DEFAULTS = {"task": None, "split": "test", "n": 4, "limit": 40, "max_new_tokens": None, "batch_size": 16,
                 "dtype": None}


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
            raise ValueError(f"--variant needs exactly one --recipe to vary, got {len(arms)}; "
                             "give one --recipe, or several recipes and no --variant")
        base, arms = arms[0], []
        for item in variants:
            name, sep, flags = item.partition(":")
            if not sep:
                raise ValueError(f"--variant {item!r} must be NAME:FLAGS, e.g. 'grpo:--algorithm grpo' "
                                 "(an empty FLAGS, 'gtpo:', is the recipe as it is)")
            arms.append(Arm(name.strip(), base.recipe, shlex.split(flags)))
    if not arms:
        raise ValueError("give at least one arm: --recipe PATH (several), or --recipe PATH with --variant NAME:FLAGS")
    names = [a.name for a in arms]
    for arm in arms:
        if not _NAME.fullmatch(arm.name):
            raise ValueError(f"arm name {arm.name!r} must be letters, digits, '.', '_' or '-' (it names a folder)")
        if not Path(arm.recipe).is_file():
            raise ValueError(f"recipe {arm.recipe!r} of arm {arm.name!r} not found")
        for flag in arm.args:
            if flag in ("--seed", "--output_dir", "--resume_from_checkpoint"):
                raise ValueError(f"arm {arm.name!r} sets {flag}; gtpo compare sets it per run, remove it")
    if len(set(names)) != len(names):
        raise ValueError(f"arm names must differ, got {names}; name recipes as NAME=PATH")
    return arms


def train_command(spec: Spec, arm: Arm, seed: int, out: Path, launcher: list[str],
                  resume: Path | None = None) -> list[str]:
    """The ``gtpo train`` command line of one run; flags later on the line win (arm over common)."""
    command = [*launcher, "train", "--config", arm.recipe, *spec.common, *arm.args,
               "--seed", str(seed), "--output_dir", str(run_dir(out, arm.name, seed)),
               "--save_strategy", "steps", "--save_steps", str(spec.save_steps), "--save_total_limit", "2"]
    if resume is not None:
        command += ["--resume_from_checkpoint", str(resume)]
    return command


def plan(spec: Spec, out: Path) -> list[tuple[Arm, int, str, Path | None]]:
    """Every run with what to do: ('done', None), ('resume', checkpoint) or ('start', None).

    Seeds go in the outer loop, so that an interrupted study has whole seeds of every arm (paired data)."""
    todo = []
    for seed in spec.seeds:
        for arm in spec.arms:
            folder = run_dir(out, arm.name, seed)
            status = run_status(folder)
            if status == "finished":
                todo.append((arm, seed, "done", None))
                continue
            checkpoint = latest_checkpoint(folder) if folder.is_dir() else None
            todo.append((arm, seed, "resume" if checkpoint else "start", checkpoint))
    return todo


def _trim_metrics(folder: Path, last_step: int) -> None:
    """Drop metrics.jsonl rows logged after the checkpoint a run resumes from: the resumed run logs those
    steps again, and the file must keep one row per step."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a partial last line of a killed run
        if int(row.get("step", 0)) <= last_step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


def missing_commands(spec: Spec, out: Path, launcher: list[str]) -> list[list[str]]:
    """The `gtpo train` command of every run not finished yet (what ``--dry-run`` prints)."""
    return [train_command(spec, arm, seed, out, launcher, checkpoint)
            for arm, seed, action, checkpoint in plan(spec, out) if action != "done"]


def _after_run(hook: str | None, folder: Path) -> None:
    """Run the user's ``--after-run`` shell command for a run that just finished (and was evaluated), with
    GTPO_RUN_DIR set to its folder; a failing hook is reported, never fatal (the study goes on)."""
    if not hook:
        return
    result = subprocess.run(hook, shell=True, env={**os.environ, "GTPO_RUN_DIR": str(folder)})
    if result.returncode != 0:
        logger.error("--after-run exited with %d for %s", result.returncode, folder)


def run_all(spec: Spec, out: Path, launcher: list[str], after_run: str | None = None) -> list[str]:
    """Run every missing run in turn, each evaluated right after it finishes when the spec asks for it (so a
    study stopped at any point has every finished run complete); returns the names of runs that failed."""
    from gtpo import compare_report

    failed = []
    for arm, seed, action, checkpoint in plan(spec, out):
        name = f"{arm.name}/seed{seed}"
        folder = run_dir(out, arm.name, seed)
        if action == "done":
            logger.info("%s: finished, skipped", name)
            if spec.eval is not None and compare_report.evaluate_run(arm, seed, out, launcher, **spec.eval) == "ran":
                _after_run(after_run, folder)
            continue
        command = train_command(spec, arm, seed, out, launcher, checkpoint)
        if action == "resume":
            _trim_metrics(folder, int(checkpoint.name.split("-")[-1]))
            logger.info("%s: resuming from %s", name, checkpoint)
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
        if spec.eval is not None and compare_report.evaluate_run(arm, seed, out, launcher, **spec.eval) == "failed":
            failed.append(f"{name} (eval)")
            continue
        _after_run(after_run, folder)
    return failed


def write_or_check_spec(spec: Spec, out: Path) -> None:
    """Write OUT/compare.json, or check that an existing one describes the same study."""
    path = Path(out) / SPEC_FILE
    if path.is_file():
        old = Spec.from_json(json.loads(path.read_text()))
        if (old.arms, old.common, old.save_steps) != (spec.arms, spec.common, spec.save_steps):
            raise ValueError(f"{path} describes a different study (arms or flags differ); use another --output-dir, "
                             "or rerun with the same arms and flags (`gtpo compare --output-dir OUT` reuses them)")
        if old.eval is not None and spec.eval is not None and old.eval != spec.eval:
            raise ValueError(f"{path} evaluates with {old.eval}, not {spec.eval}; drop the --eval-* flags to keep the "
                             "study's settings, or use another --output-dir")
        spec.eval = spec.eval if spec.eval is not None else old.eval  # a study's evaluation, once set, stays
        spec.seeds = old.seeds + [s for s in spec.seeds if s not in old.seeds]  # more seeds may be added
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_json(), indent=2) + "\n")


class StudyLock:
    """OUT/compare.lock while a `gtpo compare` runs a study: a second one would resume the same run twice."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK_FILE
        self.mine = f"{socket.gethostname()} {os.getpid()}"

    def __enter__(self):
        if self.path.is_file():
            host, _, pid = self.path.read_text().strip().partition(" ")
            alive = host != socket.gethostname() or _pid_alive(int(pid or 0))
            if alive:
                raise ValueError(f"another gtpo compare (host {host}, pid {pid}) is running the study in "
                                 f"{self.path.parent}; wait for it, or delete {self.path} if it is gone")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.mine + "\n")
        return self

    def __exit__(self, *exc):
        if self.path.is_file() and self.path.read_text().strip() == self.mine:
            self.path.unlink()


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------- command

DESCRIPTION = """\
Run GTPO and GRPO (or any recipes) side by side over seeds and compare them with statistics.

Each (arm, seed) is an ordinary `gtpo train` run in OUT/runs/<arm>/seed<S>/, checkpointed every --save-steps.
Rerunning the same command (or `gtpo compare --output-dir OUT` alone) skips finished runs and resumes
interrupted ones from their newest complete checkpoint. Then it aggregates the finished runs:

  OUT/summary.md, OUT/summary.json
      per arm: mean and 95% t-interval over seeds of the last --window steps' total reward, format %,
      accuracy %, entropy, and (with --eval) held-out pass@k / maj@k; per pair of arms: the paired
      difference over seeds (same seed = same prompt order) with its 95% interval, "no detectable
      difference" where the interval covers 0; per run: stability (see below).
  OUT/figures/training_curves.png and one PNG per panel (the panels of `gtpo plot`): per arm the mean
      over seeds with a 95% band; OUT/figures/stability.png: one panel per run.

Stability per run: the steps where the format reward (moving average over --window steps) is more than
--format-drop percentage points below its best so far, and the first step where the entropy (moving
average) crosses ln 2 upwards (paper Eq. 6, Figures 4 and 5).
"""

EPILOG = """\
examples:
  # GTPO, GRPO and GRPO + GTPO's entropy terms only (paper Fig. 10c), 3 seeds, lr 1e-3 for all:
  gtpo compare --recipe recipes/smollm2/synthetic/gtpo.yaml \\
      --variant 'gtpo:' --variant 'grpo:--algorithm grpo' --variant 'entropy-only:--conflict_correction false' \\
      --seeds 0 1 2 --output-dir studies/demo -- --learning_rate 1e-3 --max_steps 60
  # several recipes, named:
  gtpo compare --recipe gtpo=recipes/qwen2.5-3b/gsm8k/gtpo-g8.yaml \\
      --recipe grpo=recipes/qwen2.5-3b/gsm8k/grpo-beta0-g8.yaml \\
      --seeds 0 1 2 --output-dir studies/qwen --eval --eval-task gsm8k --eval-limit 200
  # continue a stopped study; or print the missing runs' commands to spread them over GPUs:
  gtpo compare --output-dir studies/demo
  gtpo compare --output-dir studies/demo --dry-run
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gtpo compare", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="gtpo compare [--recipe [NAME=]RECIPE ...] [--variant NAME:FLAGS ...] "
                                      "[--seeds S ...] --output-dir OUT [options] [-- COMMON TRAIN FLAGS]")
    arms = p.add_argument_group("what to run (omit all to continue the study in OUT/compare.json)")
    arms.add_argument("--recipe", action="append", default=[], metavar="[NAME=]RECIPE",
                      help="a recipe YAML; each is an arm named NAME (default: the file's stem). "
                           "Repeat for more arms.")
    arms.add_argument("--variant", action="append", default=[], metavar="NAME:FLAGS",
                      help="an arm made of the one --recipe plus `gtpo train` flags, e.g. 'grpo:--algorithm grpo' "
                           "or 'entropy-only:--conflict_correction false'; 'gtpo:' is the recipe unchanged")
    arms.add_argument("--seeds", type=int, nargs="+", default=None,
                      help="seeds, one run per arm each (default: 0 1 2; on a rerun: seeds to add)")
    arms.add_argument("--save-steps", type=int, default=10,
                      help="checkpoint every N steps (what a resume starts from; default: %(default)s)")
    arms.add_argument("common", nargs="*", metavar="-- COMMON",
                      help="flags after `--` go to every run's `gtpo train`, before the arm's own "
                           "(e.g. -- --max_steps 60)")
    how = p.add_argument_group("how to run")
    how.add_argument("-o", "--output-dir", required=True, help="the study folder OUT")
    how.add_argument("--launcher", default=None,
                     help="command that runs the gtpo CLI (default: '<this python> -m gtpo.cli'); e.g. "
                          "'accelerate launch --num_processes 8 -m gtpo.cli' for each run on 8 GPUs")
    how.add_argument("--dry-run", action="store_true",
                     help="print the `gtpo train` command of every missing run and stop (run them on many GPUs or "
                          "nodes yourself, then `gtpo compare -o OUT --aggregate-only`)")
    how.add_argument("--aggregate-only", action="store_true", help="run nothing; aggregate the finished runs")
    how.add_argument("--after-run", default=None, metavar="SHELL_COMMAND",
                     help="a shell command run after each run finishes (and is evaluated), with GTPO_RUN_DIR set to "
                          "its folder: e.g. to commit or upload it (a failure is reported, the study goes on)")
    ev = p.add_argument_group("held-out evaluation (gtpo eval on each finished run's model)")
    ev.add_argument("--eval", action="store_true",
                    help="evaluate every run's final model right after it finishes; the settings are kept in "
                         "compare.json, so continuing the study evaluates too")
    ev.add_argument("--eval-task", default=None, help="task (default: the recipe's task)")
    ev.add_argument("--eval-split", default=None, help=f"default: {EVAL_DEFAULTS['split']}")
    ev.add_argument("--eval-n", type=int, default=None,
                    help=f"samples per problem: pass@k / maj@k for k = 1, 2, 4, ..., N (default: {EVAL_DEFAULTS['n']})")
    ev.add_argument("--eval-limit", type=int, default=None,
                    help=f"problems evaluated (default: {EVAL_DEFAULTS['limit']})")
    ev.add_argument("--eval-max-new-tokens", type=int, default=None, help="default: the run's max_completion_length")
    ev.add_argument("--eval-batch-size", type=int, default=None,
                    help=f"completions generated per call (default: {EVAL_DEFAULTS['batch_size']})")
    ev.add_argument("--eval-dtype", default=None,
                    help="the evaluated model's dtype (default: the run's). On CPU, float32 samples a GGUF base "
                         "model about 4x faster than bfloat16 (transformers keeps its weights packed)")
    rep = p.add_argument_group("aggregation")
    rep.add_argument("--window", type=int, default=10,
                     help="last-window length (steps) of the summary, and the moving average of the stability "
                          "criteria (default: %(default)s)")
    rep.add_argument("--format-drop", type=float, default=20.0,
                     help="stability: format %% falling more than this many points below its best counts as a "
                          "drop (default: %(default)s)")
    rep.add_argument("--include-unfinished", action="store_true",
                     help="aggregate unfinished runs too (their last logged window), marked as partial")
    return p


def eval_settings(args: argparse.Namespace, current: dict | None = None) -> dict | None:
    """The study's evaluation settings from ``--eval`` and ``--eval-*``: the flags given override the study's
    current settings (or :data:`EVAL_DEFAULTS`); without ``--eval`` the current settings stay."""
    if not args.eval:
        return current
    settings = dict(current or EVAL_DEFAULTS)
    for key in EVAL_DEFAULTS:
        value = getattr(args, f"eval_{key}")
        if value is not None:
            settings[key] = value
    if settings["n"] < 1 or settings["limit"] < 1 or settings["batch_size"] < 1:
        raise ValueError(f"--eval-n, --eval-limit and --eval-batch-size must be at least 1, got {settings}")
    return settings


def _split_common(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, []


def run_compare(argv: list[str]) -> int:
    from gtpo import compare_report

    own, common = _split_common(list(argv))
    args = build_parser().parse_args(own)
    if args.common:
        raise ValueError(f"unexpected arguments {args.common}; `gtpo train` flags for every run go after `--`")
    out = Path(args.output_dir)
    if args.save_steps < 1:
        raise ValueError(f"--save-steps must be at least 1, got {args.save_steps}")
    if args.recipe or args.variant:
        spec = Spec(parse_arms(args.recipe, args.variant), args.seeds or [0, 1, 2], common, args.save_steps,
                    eval_settings(args))
        write_or_check_spec(spec, out)
    else:
        path = out / SPEC_FILE
        if not path.is_file():
            raise ValueError(f"no {path}: give the arms (--recipe, --variant) to start a study in {out}")
        spec = Spec.from_json(json.loads(path.read_text()))
        evaluation = eval_settings(args, spec.eval)
        if args.seeds or evaluation != spec.eval:
            spec.seeds += [s for s in args.seeds or [] if s not in spec.seeds]
            spec.eval = evaluation
            write_or_check_spec(spec, out)
    launcher = shlex.split(args.launcher) if args.launcher else [sys.executable, "-m", "gtpo.cli"]
    if args.dry_run:
        launcher = shlex.split(args.launcher) if args.launcher else ["gtpo"]  # to run elsewhere: the console script
        for command in missing_commands(spec, out, launcher):
            print(shlex.join(command))
        return 0
    failed = []
    if not args.aggregate_only:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        with StudyLock(out):
            failed = run_all(spec, out, launcher, args.after_run)
    summary = compare_report.aggregate(spec, out, window=args.window, format_drop=args.format_drop,
                                       include_unfinished=args.include_unfinished)
    print(f"gtpo compare: {summary['finished_runs']} of {summary['total_runs']} runs finished; "
          f"summary in {out / 'summary.md'}, figures in {out / 'figures'}")
    if failed:
        print(f"gtpo compare: {len(failed)} run(s) failed: {', '.join(failed)}; rerun to retry", file=sys.stderr)
        return 1
    return 0
