"""`gtpo compare`: its arguments and what it runs; the study itself is :mod:`gtpo.compare`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from gtpo.compare import report as compare_report
from gtpo.compare.study import (
    EVAL_DEFAULTS,
    SPEC_FILE,
    Spec,
    StudyLock,
    missing_commands,
    parse_arms,
    run_all,
    write_or_check_spec,
)

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
    p = argparse.ArgumentParser(
        prog="gtpo compare",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="gtpo compare [--recipe [NAME=]RECIPE ...] [--variant NAME:FLAGS ...] "
        "[--seeds S ...] --output-dir OUT [options] [-- COMMON TRAIN FLAGS]",
    )
    arms = p.add_argument_group("what to run (omit all to continue the study in OUT/compare.json)")
    arms.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="[NAME=]RECIPE",
        help="a recipe YAML; each is an arm named NAME (default: the file's stem). Repeat for more arms.",
    )
    arms.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:FLAGS",
        help="an arm made of the one --recipe plus `gtpo train` flags, e.g. 'grpo:--algorithm grpo' "
        "or 'entropy-only:--conflict_correction false'; 'gtpo:' is the recipe unchanged",
    )
    arms.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="seeds, one run per arm each (default: 0 1 2; on a rerun: seeds to add)",
    )
    arms.add_argument(
        "--save-steps",
        type=int,
        default=10,
        help="checkpoint every N steps (what a resume starts from; default: %(default)s)",
    )
    arms.add_argument(
        "common",
        nargs="*",
        metavar="-- COMMON",
        help="flags after `--` go to every run's `gtpo train`, before the arm's own (e.g. -- --max_steps 60)",
    )
    how = p.add_argument_group("how to run")
    how.add_argument("-o", "--output-dir", required=True, help="the study folder OUT")
    how.add_argument(
        "--launcher",
        default=None,
        help="command that runs the gtpo CLI (default: '<this python> -m gtpo.cli'); e.g. "
        "'accelerate launch --num_processes 8 -m gtpo.cli' for each run on 8 GPUs",
    )
    how.add_argument(
        "--dry-run",
        action="store_true",
        help="print the `gtpo train` command of every missing run and stop (run them on many GPUs or "
        "nodes yourself, then `gtpo compare -o OUT --aggregate-only`)",
    )
    how.add_argument("--aggregate-only", action="store_true", help="run nothing; aggregate the finished runs")
    how.add_argument(
        "--after-run",
        default=None,
        metavar="SHELL_COMMAND",
        help="a shell command run after each run finishes (and is evaluated), with GTPO_RUN_DIR set to "
        "its folder: e.g. to commit or upload it (a failure is reported, the study goes on)",
    )
    ev = p.add_argument_group("held-out evaluation (gtpo eval on each finished run's model)")
    ev.add_argument(
        "--eval",
        action="store_true",
        help="evaluate every run's final model right after it finishes; the settings are kept in "
        "compare.json, so continuing the study evaluates too",
    )
    ev.add_argument("--eval-task", default=None, help="task (default: the recipe's task)")
    ev.add_argument("--eval-split", default=None, help=f"default: {EVAL_DEFAULTS['split']}")
    ev.add_argument(
        "--eval-n",
        type=int,
        default=None,
        help=f"samples per problem: pass@k / maj@k for k = 1, 2, 4, ..., N (default: {EVAL_DEFAULTS['n']})",
    )
    ev.add_argument(
        "--eval-limit", type=int, default=None, help=f"problems evaluated (default: {EVAL_DEFAULTS['limit']})"
    )
    ev.add_argument("--eval-max-new-tokens", type=int, default=None, help="default: the run's max_completion_length")
    ev.add_argument(
        "--eval-batch-size",
        type=int,
        default=None,
        help=f"completions generated per call (default: {EVAL_DEFAULTS['batch_size']})",
    )
    ev.add_argument(
        "--eval-dtype",
        default=None,
        help="the evaluated model's dtype (default: the run's). On CPU, float32 samples a GGUF base "
        "model about 4x faster than bfloat16 (transformers keeps its weights packed)",
    )
    rep = p.add_argument_group("aggregation")
    rep.add_argument(
        "--window",
        type=int,
        default=10,
        help="last-window length (steps) of the summary, and the moving average of the stability "
        "criteria (default: %(default)s)",
    )
    rep.add_argument(
        "--format-drop",
        type=float,
        default=20.0,
        help="stability: format %% falling more than this many points below its best counts as a "
        "drop (default: %(default)s)",
    )
    rep.add_argument(
        "--include-unfinished",
        action="store_true",
        help="aggregate unfinished runs too (their last logged window), marked as partial",
    )
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
    own, common = _split_common(list(argv))
    args = build_parser().parse_args(own)
    if args.common:
        raise ValueError(f"unexpected arguments {args.common}; `gtpo train` flags for every run go after `--`")
    out = Path(args.output_dir)
    if args.save_steps < 1:
        raise ValueError(f"--save-steps must be at least 1, got {args.save_steps}")
    if args.recipe or args.variant:
        spec = Spec(
            parse_arms(args.recipe, args.variant), args.seeds or [0, 1, 2], common, args.save_steps, eval_settings(args)
        )
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
    summary = compare_report.aggregate(
        spec, out, window=args.window, format_drop=args.format_drop, include_unfinished=args.include_unfinished
    )
    print(
        f"gtpo compare: {summary['finished_runs']} of {summary['total_runs']} runs finished; "
        f"summary in {out / 'summary.md'}, figures in {out / 'figures'}"
    )
    if failed:
        print(f"gtpo compare: {len(failed)} run(s) failed: {', '.join(failed)}; rerun to retry", file=sys.stderr)
        return 1
    return 0
