"""`gtpo inspect`: its arguments, reading a recorded group, and the run of one inspection (gtpo.inspection)."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import torch

from gtpo import core
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
        raise ValueError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    need = "give a JSON object with prompt, completions (list of texts) and rewards (one number each)"
    if not isinstance(group, dict) or any(k not in group for k in ("prompt", "completions", "rewards")):
        raise ValueError(f"{path}: missing key(s); {need}")
    comps, rewards = group["completions"], group["rewards"]
    if not isinstance(comps, list) or not comps or not all(isinstance(c, str) for c in comps):
        raise ValueError(f"{path}: completions must be a non-empty list of texts; {need}")
    if not isinstance(rewards, list) or len(rewards) != len(comps):
        raise ValueError(
            f"{path}: {len(comps)} completions but rewards has "
            f"{len(rewards) if isinstance(rewards, list) else 'no list'}; {need}"
        )
    bad = [
        i
        for i, r in enumerate(rewards)
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)
    ]
    if bad:
        raise ValueError(f"{path}: rewards[{bad[0]}] = {rewards[bad[0]]!r} is not a finite number")
    return group


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gtpo inspect",
        description="Sample one group (or read a recorded one) and show GTPO's conflict spans, λ, entropy and δ.",
    )
    p.add_argument("--config", help="take model, task, sampling and GTPO settings from this training recipe")
    p.add_argument("--model", help="model: smollm2 (default, offline), tiny, a hub id, a folder or a run's model/")
    p.add_argument("--task", help="task of gtpo.tasks.load_task (default synthetic)")
    p.add_argument("--split", default="train")
    p.add_argument("--source", help="load the task from this source (e.g. a local JSONL file)")
    p.add_argument(
        "--column_map",
        "--column-map",
        default=None,
        help="for a --source file whose columns are named otherwise: FIELD=COLUMN pairs, e.g. "
        "question=problem,answer=solution",
    )
    p.add_argument("--index", type=int, default=0, help="row of the task to take the prompt from (default 0)")
    p.add_argument("--prompt", help="a question of your own instead of --index (give --answer for accuracy)")
    p.add_argument("--answer", help="gold answer for --prompt")
    p.add_argument("--group", help="a recorded group (JSON: prompt, completions, rewards) instead of sampling")
    p.add_argument("-G", "--num-generations", dest="num_generations", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--max-completion-length", dest="max_completion_length", type=int)
    p.add_argument("--few-shot", dest="few_shot", type=int)
    p.add_argument("--scale-rewards", dest="scale_rewards", choices=SCALE_REWARDS)
    p.add_argument("--reward-funcs", dest="reward_funcs", nargs="+")
    p.add_argument("--combine", choices=("union", "product"), help="λ shown in colour (both are in the JSON)")
    p.add_argument("--entropy-filter", dest="entropy_filter", choices=tuple(core.ENTROPY_FILTERS))
    p.add_argument("--entropy-threshold", dest="entropy_threshold", type=float)
    p.add_argument(
        "--initial-entropy",
        dest="initial_entropy",
        type=float,
        help="⟨H⟩_ini for δ (default: the recipe's, else the group's mean ⟨H⟩)",
    )
    p.add_argument("--gamma", type=float, help="γ of Eq. 7 (default 0.1)")
    p.add_argument("--dtype", help="model dtype (default float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output-dir", default="inspect", help="where group.json and group.png go (default inspect/)")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="ANSI colour: auto = only on a terminal and without NO_COLOR",
    )
    return p


def settings_from(args: argparse.Namespace) -> dict:
    """DEFAULTS, then the recipe's keys, then the flags given."""
    settings = dict(DEFAULTS)
    if args.config:
        from gtpo.trainer.recipe import read_recipe

        settings.update({RECIPE_KEYS[k]: v for k, v in read_recipe(args.config).items() if k in RECIPE_KEYS})
    settings.update({k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None})
    if settings["num_generations"] < 2:
        raise ValueError(
            f"-G must be at least 2 (a group needs two completions to compare), got {settings['num_generations']}"
        )
    return settings


def run_inspect(argv: list[str]) -> int:
    from gtpo.inspection import render as inspect_render
    from gtpo.models import load_model, load_tokenizer, resolve_model

    args = build_parser().parse_args(argv)
    s = settings_from(args)
    if args.group and (args.prompt or args.index != 0):
        raise ValueError("--group reads a recorded group: leave out --prompt and --index")
    if args.prompt and "accuracy" in s["reward_funcs"] and args.answer is None:
        raise ValueError("--prompt with the accuracy reward needs --answer GOLD (or --reward-funcs format)")
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


def _prompt_and_answer(args, s: dict, group: dict | None):
    if group is not None:
        return group["prompt"], group.get("answer")
    from gtpo.tasks import build_prompt, load_task
    from gtpo.tasks.sources import parse_column_map

    if args.prompt:
        few_shot = s["few_shot"] if s["few_shot"] is not None else (1 if s["task"] == "synthetic" else 0)
        return build_prompt(args.prompt, few_shot=few_shot), args.answer
    dataset = load_task(
        s["task"], args.split, source=args.source, few_shot=s["few_shot"], column_map=parse_column_map(args.column_map)
    )
    if not 0 <= args.index < len(dataset):
        raise ValueError(
            f"--index {args.index} is out of range: {s['task']}/{args.split} has rows 0..{len(dataset) - 1}"
        )
    row = dataset[args.index]
    return row["prompt"], row["answer"]
