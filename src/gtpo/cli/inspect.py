"""`gtpo inspect`: its arguments, reading a recorded group, and the run of one inspection (gtpo.inspection)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gtpo import core
from gtpo.cli.arguments import RecipeParser
from gtpo.errors import InvalidInput
from gtpo.inspection.group import (
    DEFAULTS,
    RECIPE_KEYS,
    SCALE_REWARDS,
    analyse_group,
    completion_entropy,
    grade,
    prompt_ids,
    sample_completions,
    tokenize_completions,
)

logger = logging.getLogger(__name__)


def read_group(path: str) -> dict:
    """A recorded group: JSON with ``prompt`` (text or chat messages), ``completions`` (texts) and
    ``rewards`` (one number per completion); ``answer`` optional. Errors name the file and the fix."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"group file {path!r} not found")
    try:
        group = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    need = "give a JSON object with prompt, completions (list of texts) and rewards (one number each)"
    if not isinstance(group, dict) or any(k not in group for k in ("prompt", "completions", "rewards")):
        raise InvalidInput(f"{path}: missing key(s); {need}")
    comps, rewards = group["completions"], group["rewards"]
    if not isinstance(comps, list) or not comps or not all(isinstance(c, str) for c in comps):
        raise InvalidInput(f"{path}: completions must be a non-empty list of texts; {need}")
    if not isinstance(rewards, list) or len(rewards) != len(comps):
        raise InvalidInput(
            f"{path}: {len(comps)} completions but rewards has "
            f"{len(rewards) if isinstance(rewards, list) else 'no list'}; {need}"
        )
    bad = [
        i
        for i, r in enumerate(rewards)
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)
    ]
    if bad:
        raise InvalidInput(f"{path}: rewards[{bad[0]}] = {rewards[bad[0]]!r} is not a finite number")
    return group


@dataclass
class InspectArguments:
    """`gtpo inspect`'s arguments. Settings left unset (None) come from ``--config`` (a training recipe), else
    from :data:`gtpo.inspection.group.DEFAULTS`."""

    model: str | None = field(
        default=None, metadata={"help": "model: smollm2 (default, offline), tiny, a hub id, a folder or a run's model/"}
    )
    task: str | None = field(default=None, metadata={"help": "task of gtpo.tasks.load_task (default synthetic)"})
    split: str | None = field(
        default=None, metadata={"help": "split of the task to take the prompt from (default train)"}
    )
    source: str | None = field(default=None, metadata={"help": "load the task from this source (e.g. a JSONL file)"})
    column_map: str | None = field(
        default=None,
        metadata={
            "help": "for a --source file whose columns are named otherwise: FIELD=COLUMN pairs, e.g. "
            "question=problem,answer=solution"
        },
    )
    run: str | None = field(
        default=None,
        metadata={
            "help": "a training run's folder: show a group of its completion record (completions/*.parquet) as the "
            "step's loss saw it, without loading the model (--step, --index)"
        },
    )
    step: int | None = field(default=None, metadata={"help": "with --run: the recorded step (default the newest)"})
    index: int = field(
        default=0, metadata={"help": "row of the task to take the prompt from; with --run, the group of the step"}
    )
    prompt: str | None = field(
        default=None, metadata={"help": "a question of your own instead of --index (give --answer for accuracy)"}
    )
    answer: str | None = field(default=None, metadata={"help": "gold answer for --prompt"})
    group: str | None = field(
        default=None, metadata={"help": "a recorded group (JSON: prompt, completions, rewards) instead of sampling"}
    )
    num_generations: int | None = field(
        default=None, metadata={"aliases": ["-G"], "help": "completions sampled (G; default 8)"}
    )
    temperature: float | None = field(default=None, metadata={"help": "sampling temperature (default 1.0)"})
    top_p: float | None = field(default=None, metadata={"help": "nucleus sampling mass (default 1 = off)"})
    top_k: int | None = field(default=None, metadata={"help": "top-k filtering (default 0 = off)"})
    max_completion_length: int | None = field(default=None, metadata={"help": "tokens per completion (default 96)"})
    few_shot: int | None = field(default=None, metadata={"help": "worked examples before the question"})
    scale_rewards: str | None = field(
        default=None, metadata={"choices": SCALE_REWARDS, "help": "advantage scaling, as TRL's (default group)"}
    )
    reward_funcs: list[str] | None = field(
        default=None, metadata={"help": "reward functions by name (default: format accuracy)"}
    )
    combine: str | None = field(
        default=None,
        metadata={
            "choices": ("union", "product", "guard"),
            "help": "λ shown in colour: union (paper text), product (authors' code) or guard (conflict_guard); all "
            "three are in the JSON (default union, guard with --guard or a recipe's conflict_guard: true)",
        },
    )
    guard: bool | None = field(
        default=None, metadata={"help": "show the stall guard's λ (a recipe's conflict_guard; default false)"}
    )
    positive_weight: float | None = field(
        default=None,
        metadata={"help": "λ of positive conflict tokens (a recipe's conflict_positive_weight; default 2)"},
    )
    entropy_filter: str | None = field(
        default=None, metadata={"choices": tuple(core.ENTROPY_FILTERS), "help": "δ's filter (default auto)"}
    )
    entropy_threshold: float | None = field(default=None, metadata={"help": "δ's threshold in nats (default ln 2)"})
    initial_entropy: float | None = field(
        default=None, metadata={"help": "⟨H⟩_ini for δ (default: the recipe's, else the group's mean ⟨H⟩)"}
    )
    gamma: float | None = field(default=None, metadata={"help": "γ of Eq. 7 (default 0.1)"})
    dtype: str | None = field(default=None, metadata={"help": "model dtype (default float32)"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    output_dir: str = field(
        default="inspect", metadata={"aliases": ["-o"], "help": "where group.json and group.png go"}
    )
    color: str = field(
        default="auto",
        metadata={
            "choices": ("auto", "always", "never"),
            "help": "ANSI colour: auto = on a terminal, without NO_COLOR",
        },
    )


def _config_keys(recipe: dict) -> dict:
    """``--config`` is a training recipe or a file of inspect's own keys: a recipe's keys that concern one group
    are renamed by RECIPE_KEYS, its keys that only configure training (output_dir, seed, learning_rate, ...) are
    left alone. Any other key is kept, for the parser to reject with its nearest valid spellings."""
    from gtpo.cli.arguments import train_parser

    training = train_parser().dests
    return {RECIPE_KEYS.get(k, k): v for k, v in recipe.items() if k in RECIPE_KEYS or k not in training}


def inspect_parser() -> RecipeParser:
    return RecipeParser(
        (InspectArguments,),
        prog="gtpo inspect",
        description="Sample one group (or read a recorded one) and show GTPO's conflict spans, λ, entropy and δ.",
        usage="gtpo inspect [--config RECIPE.yaml] [--KEY VALUE ...]",
        epilog="--config takes a training recipe (the model, task, sampling and GTPO settings are read from it; "
        "its training-only keys are ignored) or a YAML mapping of these flags' names; flags typed after it win. "
        "Every flag with an underscore is also spelled with hyphens.",
        config_keys=_config_keys,
    )


def parse_inspect_args(argv: list[str]) -> InspectArguments:
    """`gtpo inspect`'s command line (and --config) as :class:`InspectArguments`; nothing is run."""
    (args,), _ = inspect_parser().parse(argv)
    return args


def settings_from(args: InspectArguments) -> dict:
    """DEFAULTS, then what --config and the flags set."""
    settings = dict(DEFAULTS)
    settings.update({k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None})
    if settings["guard"] and args.combine is None:
        settings["combine"] = "guard"  # a guarded run's λ, unless a view is asked for
    if settings["num_generations"] < 2:
        raise InvalidInput(
            f"-G must be at least 2 (a group needs two completions to compare), got {settings['num_generations']}"
        )
    return settings


def run_inspect(argv: list[str]) -> int:
    from gtpo.inspection import render as inspect_render
    from gtpo.models import load_model, load_tokenizer, resolve_model

    args = parse_inspect_args(argv)
    if args.run is not None:
        return _inspect_record(args)
    if args.step is not None:
        raise InvalidInput("--step reads a run's completion record: give --run RUN_DIR too")
    s = settings_from(args)
    if args.group and (args.prompt or args.index != 0):
        raise InvalidInput("--group reads a recorded group: leave out --prompt and --index")
    if args.prompt and "accuracy" in s["reward_funcs"] and args.answer is None:
        raise InvalidInput("--prompt with the accuracy reward needs --answer GOLD (or --reward_funcs format)")
    resolve_model(s["model"])  # a bad model name fails here, before anything slow
    group = read_group(args.group) if args.group else None
    prompt, answer = _prompt_and_answer(args, s, group)
    tokenizer = load_tokenizer(s["model"])
    model = load_model(s["model"], dtype=s["dtype"]).eval()
    p_ids = torch.tensor(prompt_ids(tokenizer, prompt))  # (P,)
    if group is not None:
        ids, mask = tokenize_completions(tokenizer, group["completions"])
        texts, rewards, parts = group["completions"], torch.tensor(group["rewards"], dtype=torch.float32), {}
    else:
        p_ids, ids, mask = sample_completions(
            model,
            tokenizer,
            prompt,
            num_generations=s["num_generations"],
            temperature=s["temperature"],
            max_completion_length=s["max_completion_length"],
            top_p=s["top_p"],
            top_k=s["top_k"] or 0,
            seed=args.seed,
        )
        texts = [tokenizer.decode(r[m], skip_special_tokens=True) for r, m in zip(ids, mask, strict=False)]
        rewards, parts = grade(s["reward_funcs"], texts, prompt, answer)
    entropy = completion_entropy(model, p_ids, ids, mask)  # (G, T)
    analysis = analyse_group(
        ids,
        mask,
        rewards,
        scale_rewards=s["scale_rewards"],
        positive_weight=s["positive_weight"],
        token_entropy=entropy,
        entropy_filter=s["entropy_filter"],
        entropy_threshold=s["entropy_threshold"],
        initial_entropy=s["initial_entropy"],
        gamma=s["gamma"],
    )
    tokens = [[tokenizer.decode([int(t)]) for t in r[m]] for r, m in zip(ids, mask, strict=False)]
    record = inspect_render.to_record(analysis, prompt, texts, tokens, parts, s)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "group.json").write_text(json.dumps(record, indent=2, ensure_ascii=False))
    inspect_render.plot_group(record, out / "group.png", combine=s["combine"])
    print(inspect_render.terminal_text(record, combine=s["combine"], color=inspect_render.use_color(args.color)))
    print(f"gtpo inspect: wrote {out / 'group.json'} and {out / 'group.png'}")
    return 0


def _inspect_record(args: InspectArguments) -> int:
    """`gtpo inspect --run RUN [--step N] [--index K]`: a recorded group rendered from the record alone."""
    from gtpo.inspection import render as inspect_render
    from gtpo.inspection.recorded import recorded_group

    if args.group or args.prompt:
        raise InvalidInput("--run shows a recorded group: leave out --group and --prompt")
    record, combine = recorded_group(args.run, args.step, args.index)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "group.json").write_text(json.dumps(record, indent=2, ensure_ascii=False))
    inspect_render.plot_group(record, out / "group.png", combine=combine)
    print(inspect_render.terminal_text(record, combine=combine, color=inspect_render.use_color(args.color)))
    print(f"gtpo inspect: wrote {out / 'group.json'} and {out / 'group.png'}")
    return 0


def _prompt_and_answer(args, s: dict, group: dict | None):
    if group is not None:
        return group["prompt"], group.get("answer")
    from gtpo.tasks import TASKS, build_prompt, load_task
    from gtpo.tasks.sources import parse_column_map

    if args.prompt:
        task = TASKS.get(s["task"])  # the task's own examples and default count, as load_task applies them
        few_shot = task.few_shot_examples(s["few_shot"]) if task else (s["few_shot"] or 0)
        return build_prompt(args.prompt, few_shot=few_shot), args.answer
    dataset = load_task(
        s["task"], s["split"], source=s["source"], few_shot=s["few_shot"], column_map=parse_column_map(s["column_map"])
    )
    if not 0 <= args.index < len(dataset):
        raise InvalidInput(
            f"--index {args.index} is out of range: {s['task']}/{s['split']} has rows 0..{len(dataset) - 1}"
        )
    row = dataset[args.index]
    return row["prompt"], row["answer"]
