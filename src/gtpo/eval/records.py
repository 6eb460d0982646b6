"""The files of an evaluation folder: ``samples.jsonl`` (one record per completion, appended batch by batch,
fsynced) and JSON files written atomically. An interrupted append can only tear the last line, which reading cuts
(:func:`gtpo.runs.jsonl.read_jsonl`), so a rerun continues where the last complete batch ended."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from gtpo.runs.jsonl import read_jsonl

# Fields of a record that results are computed from.
REQUIRED_FIELDS = ("problem_id", "sample_index", "answer", "correct", "length", "truncated")


def record_problem(record) -> str | None:
    """Why ``record`` is not a samples.jsonl record (a phrase), or None."""
    if not isinstance(record, dict):
        return f"a record must be a JSON object, got {type(record).__name__}"
    missing = [key for key in REQUIRED_FIELDS if key not in record]
    if missing:
        return f"record lacks {missing}"
    if isinstance(record["sample_index"], bool) or not isinstance(record["sample_index"], int):
        return f"sample_index must be an integer, got {record['sample_index']!r}"
    return None


def read_records(path: str | Path) -> list[dict]:
    """Records of ``samples.jsonl``; the last line is repaired in place so that appending continues cleanly.

    A valid record is never thrown away. The last line is the only one an interrupted append can leave
    behind: if it is a complete record that only lacks its newline, the newline is added; if it is torn
    (not a valid record: cut mid-write, or zeros after a crash), it is cut. A bad line anywhere else is an
    error naming the file and line: that is damage, not an interrupted write.
    """
    path = Path(path)
    if not path.exists():
        return []
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a records file; use another --output_dir")
    return read_jsonl(path, record_problem, what="JSON record", repair=True)


def append_records(path: Path, records: Iterable[dict]) -> None:
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())  # the batch is on disk before the next one starts
    except OSError as err:  # a full disk, a quota: the samples already written stay valid
        raise ValueError(
            f"cannot write {path}: {err.strerror or err}; free space (or fix permissions) and "
            "re-run the same command: finished samples are kept"
        ) from None


def write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        raise ValueError(
            f"cannot write {path}: {err.strerror or err}; free space (or fix permissions) and re-run "
            "the same command: finished samples are kept"
        ) from None
