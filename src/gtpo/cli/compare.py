"""`gtpo compare`: its arguments and what it runs; the study itself is :mod:`gtpo.compare`."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gtpo.cli.arguments import RecipeParser
from gtpo.compare import report as compare_report
from gtpo.compare.lock import StudyLock
from gtpo.compare.study import (
    EVAL_DEFAULTS,
    SPEC_FILE,
    Spec,
    missing_commands,
    parse_arms,
    run_all,
    write_or_check_spec,
)
from gtpo.errors import InvalidInput, UsageError

DESCRIPTION = """\
Run GTPO and GRPO (or any recipes) side by side over seeds and compare them with statistics.

Each (arm, seed) is an ordinary `gtpo train` run in OUT/runs/<arm>/seed<S>/, checkpointed every --save_steps.
Rerunning the same command (or `gtpo compare --output_dir OUT` alone) skips finished runs and resumes
interrupted ones from their newest complete checkpoint. Then it aggregates the finished runs:

  OUT/summary.md, OUT/summary.json
      per arm: mean and 95% t-interval over seeds of the last --window steps' total reward, format %,
      accuracy %, entropy, and (with --eval) held-out pass@k / maj@k; per pair of arms: the paired
      difference over seeds (same seed = same prompt order) with its 95% interval, "no detectable
      difference" where the interval covers 0; per run: stability (see below).
  OUT/figures/training_curves.png and one PNG per panel (the panels of `gtpo plot`): per arm the mean
      over seeds with a 95% band; OUT/figures/stability.png: one panel per run.

Stability per run: the steps where the format reward (moving average over --window steps) is more than
--format_drop percentage points below its best so far, and the first step where the entropy (moving
average) crosses ln 2 upwards (paper Eq. 6, Figures 4 and 5).
"""

EPILOG = """\
examples:
  # GTPO, GRPO and GRPO + GTPO's entropy terms only (paper Fig. 10c), 3 seeds, lr 1e-3 for all:
  gtpo compare --recipe recipes/smollm2/synthetic/gtpo.yaml \\
      --variant 'gtpo:' --variant 'grpo:--algorithm grpo' --variant 'entropy-only:--conflict_correction false' \\
      --seeds 0 1 2 --output_dir studies/demo -- --learning_rate 1e-3 --max_steps 60
  # several recipes, named:
  gtpo compare --recipe gtpo=recipes/qwen2.5-3b/gsm8k/gtpo-g8.yaml \\
      --recipe grpo=recipes/qwen2.5-3b/gsm8k/grpo-beta0-g8.yaml \\
      --seeds 0 1 2 --output_dir studies/qwen --eval --eval_task gsm8k --eval_limit 200
  # continue a stopped study; or print the missing runs' commands to spread them over GPUs:
  gtpo compare --output_dir studies/demo
  gtpo compare --output_dir studies/demo --dry_run
  # add an arm to it (a new name; the study's own flags after --, since they are checked):
  gtpo compare --recipe recipes/smollm2/synthetic/gtpo.yaml --variant 'gtpo-filter:--entropy_filter always' \
      --output_dir studies/demo -- --learning_rate 1e-3 --max_steps 60
"""


@dataclass
class CompareArguments:
    """`gtpo compare`'s arguments; ``gtpo train`` flags common to every run go after ``--`` (or in ``train_args``
    of a --config file)."""

    recipe: list[str] = field(
        default_factory=list,
        metadata={
            "action": "extend",
            "metavar": "[NAME=]RECIPE",
            "help": "recipe YAML(s); each is an arm named NAME (default: the file's stem). Repeatable. "
            "(What to run: omit --recipe and --variant to continue the study in OUTPUT_DIR/compare.json.)",
        },
    )
    variant: list[str] = field(
        default_factory=list,
        metadata={
            "action": "extend",
            "metavar": "NAME:FLAGS",
            "help": "an arm made of the one --recipe plus `gtpo train` flags, e.g. 'grpo:--algorithm grpo' or "
            "'entropy-only:--conflict_correction false'; 'gtpo:' is the recipe unchanged. Repeatable. On a rerun, "
            "a new name adds an arm; an arm the study has must be unchanged.",
        },
    )
    seeds: list[int] | None = field(
        default=None, metadata={"help": "seeds, one run per arm each (default: 0 1 2; on a rerun: seeds to add)"}
    )
    save_steps: int = field(default=10, metadata={"help": "checkpoint every N steps (what a resume starts from)"})
    train_args: list[str] | None = field(
        default=None,
        metadata={
            "help": "`gtpo train` flags for every run, before the arm's own; on the command line give them after "
            "`--` (e.g. -- --max_steps 60), in a --config file as a list"
        },
    )
    output_dir: str | None = field(default=None, metadata={"aliases": ["-o"], "help": "the study folder (required)"})
    launcher: str | None = field(
        default=None,
        metadata={
            "help": "command that runs the gtpo CLI (default: '<this python> -m gtpo.cli'); e.g. "
            "'accelerate launch --num_processes 8 -m gtpo.cli' for each run on 8 GPUs"
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "print the `gtpo train` command of every missing run and stop (run them on many GPUs or nodes "
            "yourself, then `gtpo compare --output_dir OUT --aggregate_only`)"
        },
    )
    aggregate_only: bool = field(default=False, metadata={"help": "run nothing; aggregate the finished runs"})
    after_run: str | None = field(
        default=None,
        metadata={
            "metavar": "SHELL_COMMAND",
            "help": "a shell command run after each run finishes (and is evaluated), with GTPO_RUN_DIR set to its "
            "folder: e.g. to commit or upload it (a failure is reported, the study goes on)",
        },
    )
    eval: bool = field(
        default=False,
        metadata={
            "help": "held-out evaluation: `gtpo eval` on every run's final model right after it finishes; the "
            "settings (--eval_*) are kept in compare.json, so continuing the study evaluates too"
        },
    )
    eval_task: str | None = field(default=None, metadata={"help": "task (default: the recipe's task)"})
    eval_split: str | None = field(default=None, metadata={"help": f"default: {EVAL_DEFAULTS['split']}"})
    eval_n: int | None = field(
        default=None,
        metadata={
            "help": f"samples per problem: pass@k / maj@k for k = 1, 2, 4, ..., N (default: {EVAL_DEFAULTS['n']})"
        },
    )
    eval_limit: int | None = field(
        default=None, metadata={"help": f"problems evaluated (default: {EVAL_DEFAULTS['limit']})"}
    )
    eval_max_new_tokens: int | None = field(default=None, metadata={"help": "default: the run's max_completion_length"})
    eval_batch_size: int | None = field(
        default=None,
        metadata={"help": "completions generated per call (default: gtpo eval's --batch_size)"},
    )
    eval_dtype: str | None = field(
        default=None,
        metadata={
            "help": "the evaluated model's dtype (default: the run's). On CPU, float32 samples a GGUF base model "
            "about 4x faster than bfloat16 (transformers keeps its weights packed)"
        },
    )
    window: int = field(
        default=10,
        metadata={
            "help": "last-window length (steps) of the summary, and the moving average of the stability criteria"
        },
    )
    format_drop: float = field(
        default=20.0,
        metadata={"help": "stability: format %% falling more than this many points below its best counts as a drop"},
    )
    include_unfinished: bool = field(
        default=False,
        metadata={"help": "aggregate unfinished runs too (their last logged window), marked as partial"},
    )


def compare_parser() -> RecipeParser:
    return RecipeParser(
        (CompareArguments,),
        prog="gtpo compare",
        description=DESCRIPTION,
        usage="gtpo compare [--recipe [NAME=]RECIPE ...] [--variant NAME:FLAGS ...] [--seeds S ...] "
        "--output_dir OUT [options] [-- COMMON TRAIN FLAGS]",
        epilog=EPILOG,
        raw_description=True,
    )


def parse_compare_args(argv: list[str]) -> CompareArguments:
    """`gtpo compare`'s command line (and --config) as :class:`CompareArguments`; nothing is run. Flags after
    ``--`` are appended to ``train_args``."""
    own, common = _split_common(list(argv))
    (args,), _ = compare_parser().parse(own)
    args.train_args = list(args.train_args or []) + common
    if args.output_dir is None:
        raise UsageError("gtpo compare: give the study folder: --output_dir OUT (see `gtpo compare --help`)")
    return args


def eval_settings(args: CompareArguments, current: dict | None = None) -> dict | None:
    """The study's evaluation settings from ``--eval`` and ``--eval-*``: the flags given override the study's
    current settings (or :data:`EVAL_DEFAULTS`); without ``--eval`` the current settings stay."""
    if not args.eval:
        return current
    settings = dict(current or EVAL_DEFAULTS)
    for key in EVAL_DEFAULTS:
        value = getattr(args, f"eval_{key}")
        if value is not None:
            settings[key] = value
    if settings["n"] < 1 or settings["limit"] < 1 or (settings["batch_size"] or 1) < 1:
        raise InvalidInput(f"--eval_n, --eval_limit and --eval_batch_size must be at least 1, got {settings}")
    return settings


def _split_common(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, []


def run_compare(argv: list[str]) -> int:
    args = parse_compare_args(argv)
    common = args.train_args
    out = Path(args.output_dir)
    if args.save_steps < 1:
        raise InvalidInput(f"--save_steps must be at least 1, got {args.save_steps}")
    if args.recipe or args.variant:
        spec = Spec(
            parse_arms(args.recipe, args.variant), args.seeds or [0, 1, 2], common, args.save_steps, eval_settings(args)
        )
        write_or_check_spec(spec, out)
    else:
        path = out / SPEC_FILE
        if not path.is_file():
            raise InvalidInput(f"no {path}: give the arms (--recipe, --variant) to start a study in {out}")
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
