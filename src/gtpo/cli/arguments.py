"""The arguments of `gtpo train` and `gtpo sft`: their script dataclasses, the offline default recipe, and a
TrlParser whose errors are one line and whose recipe keys are checked against the flags."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

from gtpo.cli.recipe import read_recipe
from gtpo.errors import UsageError, user_input
from gtpo.tasks import TASKS

# The offline default: `gtpo train` with no --config. Same keys as a recipe (recipes/smollm2/synthetic/).
# Measured on a 2-core CPU: see README "The offline default run".
DEFAULT_TRAIN_RECIPE: dict = {
    "model_name_or_path": "smollm2",
    # bfloat16 where the CPU or GPU computes it (generation ~40% faster than float32 on a CPU with AMX), float32
    # elsewhere: emulated bf16 is ~10x slower (gtpo.trainer.policy.auto_dtype). PEFT keeps LoRA weights float32.
    "dtype": "auto",
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


@dataclass
class TaskArguments:
    """What to train on: a task of `gtpo.tasks.load_task`, with the paper's prompt. `gtpo sft`'s script arguments."""

    task: str = field(
        default="synthetic",
        metadata={
            "help": f"Task of gtpo.tasks.load_task: one of {', '.join(TASKS)} (gtpo.tasks.register_task adds one)."
        },
    )
    split: str = field(default="train", metadata={"help": "Dataset split to train on."})
    source: str | None = field(
        default=None,
        metadata={"help": "Load the task from this source instead of its default (e.g. a local JSONL file)."},
    )
    column_map: str | None = field(
        default=None,
        metadata={
            "help": "For a --source file whose columns are named otherwise: FIELD=COLUMN pairs, e.g. "
            "question=problem,answer=solution (fields: question, answer, solution, id, level, subject; in a "
            "recipe also a mapping)."
        },
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
        metadata={
            "help": "Replace the run in --output_dir (its run.json, metrics, checkpoints, model, figures); "
            "without it a folder that holds a run is refused (see gtpo.runs.folder)."
        },
    )


@dataclass
class TrainScriptArguments(TaskArguments):
    """`gtpo train`'s script arguments: the task, and the rewards; the rest is GTPOConfig and ModelConfig."""

    reward_funcs: list[str] = field(
        default_factory=lambda: ["format", "accuracy"],
        metadata={"help": "Reward functions by name (gtpo.tasks.REWARD_FUNCS); the paper's: format accuracy."},
    )
    plot: bool = field(default=True, metadata={"help": "Write the training-curve figures into RUN_DIR/figures."})
    collapse_warning: str = field(
        default="warn",
        metadata={
            "help": "Collapse early warning (gtpo.trainer.callbacks, docs/inspect.md): off, warn (each time it "
            "turns on; it clears when the condition ends), save (also checkpoint) or stop (also end training).",
            "choices": ["off", "warn", "save", "stop"],
        },
    )


class RecipeParser:
    """Every verb's parser: transformers' HfArgumentParser (through TRL's TrlParser) over the verb's dataclasses.

    snake_case flags, each also spelled with hyphens (``--output_dir`` or ``--output-dir``); ``--config FILE.yaml``
    gives any flag's value from a flat YAML mapping (flags typed after it win); errors are one line (a
    :class:`UsageError`, no 300-flag usage dump) and an unknown key or flag names its nearest valid spellings.

    Args:
        dataclass_types: the verb's argument dataclasses, in the order :meth:`parse` returns them.
        prog: the command, e.g. ``"gtpo eval"``; in messages.
        description, usage, epilog: for ``--help``.
        positional: ``(name, metavar, help)`` of a positional list argument (``gtpo plot RUN_DIR ...``): its
            values are given to the first dataclass's field ``name`` (also a flag and a config key), after the
            flag's.
        config_keys: turns the YAML mapping of ``--config`` into this parser's keys (``gtpo inspect`` reads
            a training recipe); by default every key must be one of the parser's.
    """

    def __init__(
        self,
        dataclass_types,
        prog: str,
        description: str,
        *,
        usage: str | None = None,
        epilog: str = "A recipe is a flat YAML mapping of these keys; flags given after it override its values.",
        positional: tuple[str, str, str] | None = None,
        config_keys=None,
        raw_description: bool = False,
    ):
        import argparse

        from trl import TrlParser

        class Parser(TrlParser):
            def error(self, message):
                raise UsageError(f"{prog}: {message} (see `{prog} --help`)")

        class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
            pass

        self.prog = prog
        self.positional = positional
        self.config_keys = config_keys
        self.parser = Parser(
            dataclass_types,
            prog=prog,
            usage=usage or f"{prog} [--config FILE.yaml] [--KEY VALUE ...]",
            description=description,
            epilog=epilog,
            allow_abbrev=False,
            formatter_class=Formatter if raw_description else argparse.ArgumentDefaultsHelpFormatter,
        )
        actions = self.parser._actions
        for action in actions:  # "(default: None)" says nothing: the help text tells what happens instead
            if action.default in (None, []) and action.help and "%(default)" not in action.help:
                action.help += NO_DEFAULT
        self.dests = {a.dest for a in actions if a.dest != "help"}  # config keys
        self.flags = {flag for a in actions for flag in a.option_strings if flag.startswith("--")}
        if positional is not None:
            _, metavar, help_text = positional
            self.parser.add_argument(_POSITIONAL, nargs="*", metavar=metavar, default=[], help=help_text + NO_DEFAULT)

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
        if self.config_keys is not None:
            values = self.config_keys(values)
        for key in values:
            if key not in self.dests:
                raise UsageError(unknown_key_message(key, self.dests, "recipe", self.prog))
        for token in argv:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in self.flags:
                raise UsageError(unknown_key_message(flag, self.flags, "command-line", self.prog))
        with user_input():  # GTPOConfig's, GRPOConfig's and transformers' refusals of the values given
            self.parser.set_defaults_with_config(**values)
            outputs = self.parser.parse_args_into_dataclasses(args=argv)
        if self.positional is not None:
            *outputs, extra = outputs
            first = outputs[0]
            name = self.positional[0]
            setattr(first, name, list(getattr(first, name) or []) + list(getattr(extra, _POSITIONAL)))
            outputs = tuple(outputs)
        return outputs, recipe


_POSITIONAL = "positional_values"
# Appended to the help of flags whose default is None and explained in words: it formats to nothing, and its
# presence tells argparse.ArgumentDefaultsHelpFormatter not to add "(default: None)".
NO_DEFAULT = "%(default).0s"


def unknown_key_message(key: str, valid, where: str, prog: str) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    what = "key" if where == "recipe" else "flag"
    return f"unknown {where} {what} {key!r}; {hint}the valid ones are the {len(valid)} listed by `{prog} --help`"


def train_parser() -> RecipeParser:
    from trl import ModelConfig

    from gtpo.trainer.config import GTPOConfig

    return RecipeParser(
        (TrainScriptArguments, GTPOConfig, ModelConfig),
        prog="gtpo train",
        description="Train with GTPO (algorithm: gtpo) or GRPO (algorithm: grpo). Without --config: the offline "
        "default run (SmolLM2-135M-Instruct on synthetic arithmetic). Every flag below can be a recipe key.",
    )


def sft_parser() -> RecipeParser:
    from trl import ModelConfig, SFTConfig

    from gtpo.trainer.config import accelerator_available

    parser = RecipeParser(
        (TaskArguments, SFTConfig, ModelConfig),
        prog="gtpo sft",
        description="Supervised fine-tuning on the task's gold solutions in the paper's tag format (SFT baseline).",
    )
    # As GTPOConfig does: bf16 by default only where an accelerator is (TRL's True fails on a CPU).
    parser.parser.set_defaults_with_config(bf16=accelerator_available())
    return parser
