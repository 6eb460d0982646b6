"""The ``gtpo`` command: ``gtpo train | sft | eval | eval-plot | plot``.

``gtpo train`` with no arguments is the offline default run (SmolLM2-135M-Instruct, synthetic arithmetic,
GTPO, a few minutes on a laptop CPU). With ``--config RECIPE.yaml`` it runs a recipe; any recipe key can
be overridden on the command line (``--learning_rate 1e-5``), TRL's ``TrlParser`` style.

Errors in what the user typed (an unknown recipe key, task, reward or model, a bad value) end in one line,
``gtpo: error: ...``, and exit status 2; ``gtpo --debug ...`` (or ``GTPO_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gtpo import policy
from gtpo.errors import UsageError
from gtpo.policy import check_model_name
from gtpo.recipe import read_recipe
from gtpo.train_cli import load_dataset_for, open_run_dir, plan_run_dir, plot_run, print_summary

# The offline default: `gtpo train` with no --config. Same keys as a recipe (recipes/smollm2/synthetic/).
# Measured on a 2-core CPU: see README "The offline default run".
DEFAULT_TRAIN_RECIPE: dict = {
    "model_name_or_path": "smollm2",
    "dtype": "bfloat16",  # generation ~40% faster than float32 here; PEFT keeps the LoRA weights float32
    "task": "synthetic",
    "few_shot": 1,  # without a worked example SmolLM2-135M writes no tags and every reward is 0
    "reward_funcs": ["format", "accuracy"],
    "use_peft": True,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "algorithm": "gtpo",
    "learning_rate": 2.0e-4,
    "lr_scheduler_type": "constant",
    "num_generations": 8,
    "per_device_train_batch_size": 8,  # completions per device and step: one prompt's group of G=8
    "max_completion_length": 96,
    "max_steps": 40,
    "initial_entropy_prompts": 16,
    "logging_steps": 1,
    "save_strategy": "no",
    "activation_checkpointing": False,
    "report_to": "none",
    "seed": 0,
    "run_name": "smollm2-synthetic-gtpo",
}

COMMAND_HELP = {
    "train": "train with GTPO or GRPO from a YAML recipe (no arguments: the offline default run)",
    "sft": "supervised fine-tuning on gold solutions in the tag format (the paper's SFT baseline)",
    "eval": "pass@k / maj@k of a model on a task",
    "eval-plot": "plot pass@k and maj@k against k from eval results",
    "plot": "training-curve figures from one or more run folders",
    "compare": "run arms (e.g. GTPO vs GRPO) over seeds, resumably, and compare them with 95% intervals",
    "inspect": "one group through GTPO's eyes: conflict spans, λ, entropy and δ (docs/inspect.md)",
}


# ---------------------------------------------------------------------------------------------- arguments


@dataclass
class TaskArguments:
    """What to train on: a task of `gtpo.data.load_task`, with the paper's prompt. `gtpo sft`'s script arguments."""

    task: str = field(
        default="synthetic",
        metadata={"help": "Task of gtpo.data.load_task: gsm8k, math, math500, aime24, aime25, amc23 or synthetic."},
    )
    split: str = field(default="train", metadata={"help": "Dataset split to train on."})
    source: str | None = field(
        default=None,
        metadata={"help": "Load the task from this source instead of its default (e.g. a local JSONL file)."},
    )
    few_shot: int | None = field(
        default=None,
        metadata={
            "help": "Worked examples shown as earlier chat turns before each question (default: the task's own, "
            "1 for synthetic, 0 for the paper's tasks)."
        },
    )
    num_examples: int | None = field(
        default=None,
        metadata={"help": "Train on a random subset of this many rows (drawn with data_seed/seed; default: all)."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace the run in --output_dir (its run.json, metrics, checkpoints, model, figures); "
                  "without it a folder that holds a run is refused (see gtpo.runfolder)."},
    )


@dataclass
class TrainScriptArguments(TaskArguments):
    """`gtpo train`'s script arguments: the task, and the rewards; the rest is GTPOConfig and ModelConfig."""

    reward_funcs: list[str] = field(
        default_factory=lambda: ["format", "accuracy"],
        metadata={"help": "Reward functions by name (gtpo.rewards.REWARD_FUNCS); the paper's: format accuracy."},
    )
    plot: bool = field(default=True, metadata={"help": "Write the training-curve figures into RUN_DIR/figures."})
    collapse_warning: str = field(default="warn", metadata={"help": "Collapse early warning (gtpo.callbacks, docs/inspect.md): off, warn, save (also checkpoint) or stop (also end training).", "choices": ["off", "warn", "save", "stop"]})


class _Parser:
    """A TrlParser whose errors are exceptions (no 300-flag usage dump) and whose recipe keys are checked."""

    def __init__(self, dataclass_types, prog: str, description: str):
        from trl import TrlParser

        class Parser(TrlParser):
            def error(self, message):
                raise UsageError(f"{prog}: {message} (see `{prog} --help`)")

        self.prog = prog
        self.parser = Parser(
            dataclass_types,
            prog=prog,
            usage=f"{prog} [--config RECIPE.yaml] [--KEY VALUE ...]",
            description=description,
            epilog="A recipe is a flat YAML mapping of these keys; flags given after it override its values.",
            allow_abbrev=False,
        )
        actions = self.parser._actions
        self.dests = {a.dest for a in actions if a.dest != "help"}  # recipe keys
        self.flags = {flag for a in actions for flag in a.option_strings if flag.startswith("--")}

    def parse(self, argv: list[str], defaults: dict | None = None):
        """Dataclasses from ``--config`` (or ``defaults`` when none is given) plus command-line overrides.

        Returns (dataclasses, recipe): the recipe is the mapping the run started from, before overrides.
        """
        argv = list(argv)
        recipe: dict = dict(defaults or {})
        if "--config" in argv:
            index = argv.index("--config")
            if index + 1 >= len(argv):
                raise UsageError(f"{self.prog}: --config needs a YAML file")
            recipe = read_recipe(argv[index + 1])
            del argv[index : index + 2]
        env = recipe.get("env") or {}
        if not isinstance(env, dict):
            raise UsageError("`env` in a recipe must be a mapping of environment variables to values")
        for key, value in env.items():  # TrlParser's `env:` block
            os.environ[key] = str(value)
        values = {k: v for k, v in recipe.items() if k != "env"}
        for key in values:
            if key not in self.dests:
                raise UsageError(unknown_key_message(key, self.dests, "recipe", self.prog))
        for token in argv:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in self.flags:
                raise UsageError(unknown_key_message(flag, self.flags, "command-line", self.prog))
        self.parser.set_defaults_with_config(**values)
        return self.parser.parse_args_into_dataclasses(args=argv), recipe


def unknown_key_message(key: str, valid, where: str, prog: str) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    what = "key" if where == "recipe" else "flag"
    return f"unknown {where} {what} {key!r}; {hint}the valid ones are the {len(valid)} listed by `{prog} --help`"


def train_parser() -> _Parser:
    from trl import ModelConfig

    from gtpo.config import GTPOConfig

    return _Parser(
        (TrainScriptArguments, GTPOConfig, ModelConfig),
        prog="gtpo train",
        description="Train with GTPO (algorithm: gtpo) or GRPO (algorithm: grpo). Without --config: the offline "
        "default run (SmolLM2-135M-Instruct on synthetic arithmetic). Every flag below can be a recipe key.",
    )


def sft_parser() -> _Parser:
    from trl import ModelConfig, SFTConfig

    from gtpo.config import _accelerator_available

    parser = _Parser(
        (TaskArguments, SFTConfig, ModelConfig),
        prog="gtpo sft",
        description="Supervised fine-tuning on the task's gold solutions in the paper's tag format (SFT baseline).",
    )
    # As GTPOConfig does: bf16 by default only where an accelerator is (TRL's True fails on a CPU).
    parser.parser.set_defaults_with_config(bf16=_accelerator_available())
    return parser


# ---------------------------------------------------------------------------------------------- train


def run_train(argv: list[str]) -> int:
    from gtpo import GTPOTrainer
    from gtpo.callbacks import CollapseWarningCallback
    from gtpo.rewards import get_reward_funcs

    parser = train_parser()
    (script_args, training_args, model_args), recipe = parser.parse(
        argv, defaults=None if "--config" in argv else DEFAULT_TRAIN_RECIPE
    )
    # Everything the user can get wrong is checked before the run folder is made and the model loaded.
    run_dir = plan_run_dir(training_args, script_args, argv)
    reward_funcs = get_reward_funcs(script_args.reward_funcs)
    check_model_name(model_args, "gtpo train")
    dataset = load_dataset_for(script_args, seed=training_args.data_seed or training_args.seed)
    open_run_dir("train", argv, recipe, script_args, training_args, model_args)
    print(f"gtpo train: {training_args.algorithm} on {script_args.task} with {model_args.model_name_or_path}; run folder {run_dir}")

    def attach_collapse_warning(trainer):  # first: loggers see monitor/*
        CollapseWarningCallback(action=script_args.collapse_warning).attach(trainer)

    result = policy.train_policy(GTPOTrainer, dataset, training_args, model_args, run_dir, "gtpo train",
                                 prepare=attach_collapse_warning, reward_funcs=reward_funcs)
    if training_args.process_index == 0:
        figures = plot_run(run_dir) if script_args.plot else []
        print_summary(run_dir, result["wall"], result["model_dir"], figures)
    return 0


# ---------------------------------------------------------------------------------------------- sft


def run_sft(argv: list[str]) -> int:
    from gtpo.sft import sft_dataset, train_sft

    parser = sft_parser()
    (script_args, training_args, model_args), recipe = parser.parse(argv)
    run_dir = plan_run_dir(training_args, script_args, argv)
    check_model_name(model_args, "gtpo sft")
    dataset = sft_dataset(load_dataset_for(script_args, seed=training_args.data_seed or training_args.seed))
    open_run_dir("sft", argv, recipe, script_args, training_args, model_args)
    print(f"gtpo sft: {script_args.task} gold solutions with {model_args.model_name_or_path}; run folder {run_dir}")
    result = train_sft(dataset, training_args, model_args)
    if training_args.process_index == 0:
        print(f"gtpo sft: done in {result['wall'] / 60:.1f} min; model in {result['model_dir']}")
    return 0


# ---------------------------------------------------------------------------------------------- plot / eval


def _plot_argparser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gtpo plot",
        description="Training-curve PNGs (accuracy and format reward in %, total reward, mean completion entropy, "
        "conflict token fraction, filtered fraction, against step) from the metrics.jsonl of one or more run "
        "folders, several runs on one figure (paper Figures 1, 2 top, 4, 5).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders written by `gtpo train`")
    parser.add_argument("-o", "--output-dir", default=None,
                        help="where the PNGs go (default: RUN_DIR/figures for one run, ./figures for several)")
    parser.add_argument("--labels", nargs="+", default=None, help="legend names, one per RUN_DIR (default: folder names)")
    parser.add_argument("--smooth", type=int, default=None,
                        help="moving-average window in steps (default: about 1/8 of the run, at most 50; 1 = raw)")
    return parser


def run_plot(argv: list[str]) -> int:
    from gtpo.plots import plot_runs

    args = _plot_argparser().parse_args(argv)
    output = args.output_dir or (Path(args.run_dirs[0]) / "figures" if len(args.run_dirs) == 1 else "figures")
    for path in plot_runs(args.run_dirs, output, labels=args.labels, smooth=args.smooth):
        print(path)
    return 0


def _eval_command(kind: str):
    def run(argv: list[str]) -> int:
        from gtpo.eval import cli as eval_cli

        if kind == "eval":
            parser = argparse.ArgumentParser(prog="gtpo eval", description=eval_cli.EVAL_DESCRIPTION,
                                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            eval_cli.add_eval_arguments(parser)
            eval_cli.run_eval_from_args(parser.parse_args(argv))
        else:
            parser = argparse.ArgumentParser(prog="gtpo eval-plot", description=eval_cli.PLOT_DESCRIPTION,
                                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            eval_cli.add_eval_plot_arguments(parser)
            eval_cli.run_eval_plot_from_args(parser.parse_args(argv))
        return 0

    return run


def _lazy_command(module: str, function: str):
    """A subcommand whose module (and its heavy imports) loads only when that subcommand runs."""
    def run(argv: list[str]) -> int:
        return getattr(importlib.import_module(module), function)(argv)

    return run


COMMANDS = {
    "train": run_train,
    "sft": run_sft,
    "eval": _eval_command("eval"),
    "eval-plot": _eval_command("eval-plot"),
    "plot": run_plot,
    "compare": _lazy_command("gtpo.compare", "run_compare"),
    "inspect": _lazy_command("gtpo.inspect_group", "run_inspect"),
}


# ---------------------------------------------------------------------------------------------- main


def _top_help() -> str:
    lines = [
        "usage: gtpo [--debug] [--version] COMMAND [ARGS]",
        "",
        "GTPO (arXiv 2508.03772) on Hugging Face TRL: train, evaluate and plot.",
        "",
        "commands:",
        *(f"  {name:<10} {text}" for name, text in COMMAND_HELP.items()),
        "",
        "options:",
        "  -h, --help  show this message; `gtpo COMMAND --help` shows a command's flags",
        "  --version   print the version",
        "  --debug     show the full traceback on errors (also: GTPO_DEBUG=1)",
        "",
        "examples:",
        "  gtpo train                                            # offline default run, ~10 min on a CPU",
        "  gtpo train --config recipes/qwen2.5-3b/gsm8k/gtpo-g8.yaml --learning_rate 2e-6",
        "  gtpo plot runs/A runs/B --labels GTPO GRPO",
        "  gtpo eval --model runs/A/model --task gsm8k -n 8 --limit 50",
    ]
    return "\n".join(lines)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "what you asked for is wrong": reported in one line, without a traceback."""
    errors = (UsageError, ValueError, KeyError, FileNotFoundError, NotADirectoryError)
    data = sys.modules.get("gtpo.data")  # imported before any data loads, so its error can be raised
    return errors + ((data.TaskSourceError,) if data is not None else ())


def _message(err: BaseException) -> str:
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        return err.args[0]  # str(KeyError) would wrap the message in quotes
    return str(err)


def main(argv: list[str] | None = None) -> int:
    # Before torch loads OpenMP: its threads spin while they wait, which on a small or shared machine
    # makes CPU training many times slower (SmolLM2 generating 8 x 48 tokens with 2 threads on 2 cores:
    # 27-81 s with the default policy, 3.4-5 s with PASSIVE, load averages 0.8-5). A user's setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("GTPO_DEBUG", "") not in ("", "0")
    while argv and argv[0] in ("--debug", "--version", "-h", "--help"):
        flag = argv.pop(0)
        if flag == "--debug":
            debug = True
        elif flag == "--version":
            from gtpo import __version__

            print(f"gtpo {__version__}")
            return 0
        else:
            print(_top_help())
            return 0
    if not argv:
        print(_top_help())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"gtpo: error: unknown command {command!r}{hint}; choose one of {list(COMMANDS)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[command](rest) or 0
    except Exception as err:
        from gtpo.runfolder import os_error_message

        user = isinstance(err, _user_errors())
        message = _message(err) if user else isinstance(err, OSError) and os_error_message(err)  # full disk, ...
        if debug or not message:
            raise
        print(f"gtpo: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gtpo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
