"""The files of an evaluation folder: ``run.json`` (the settings that define its samples, checked on every resume),
``samples.jsonl`` (one record per completion, appended batch by batch, fsynced) and JSON files written atomically.
An interrupted append can only tear the last line, which reading cuts (:func:`gtpo.runs.jsonl.read_jsonl`), so a
rerun continues where the last complete batch ended."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from gtpo.errors import InvalidInput
from gtpo.runs.folder import utc_timestamp
from gtpo.runs.jsonl import read_jsonl

RUN_FILE = "run.json"  # the settings that define the samples
SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.json"

# Settings that decide what the samples are: they must match to add to an existing run folder (batch_size, backend,
# dtype and limit may change between invocations: more problems can be added). "sampler" is recorded only when not
# the default, so folders written before it existed stay resumable.
RUN_KEYS = (
    "model",
    "task",
    "split",
    "source",
    "few_shot",
    "num_samples",
    "seed",
    "sampling",
    "system_prompt",
    "column_map",
    "sampler",
)

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
        raise InvalidInput(f"{path} is a directory, not a records file; use another --output_dir")
    return read_jsonl(path, record_problem, what="JSON record", repair=True)


def append_records(path: Path, records: Iterable[dict]) -> None:
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())  # the batch is on disk before the next one starts
    except OSError as err:  # a full disk, a quota: the samples already written stay valid
        raise InvalidInput(
            f"cannot write {path}: {err.strerror or err}; free space (or fix permissions) and "
            "re-run the same command: finished samples are kept"
        ) from None


def write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        raise InvalidInput(
            f"cannot write {path}: {err.strerror or err}; free space (or fix permissions) and re-run "
            "the same command: finished samples are kept"
        ) from None


def record_resume(run_json: Path, done: int, total: int, dtype: str | None, batch_size: int) -> None:
    """Append one resume of an evaluation to its run.json's ``resumes``: when it started, how many of the ``total``
    samples were already recorded, and the settings that may change between invocations (dtype, batch size)."""
    record = json.loads(run_json.read_text(encoding="utf-8-sig"))
    entry = {"at": utc_timestamp(), "samples_done": done, "samples_total": total, "dtype": dtype,
             "batch_size": batch_size}  # fmt: skip
    record.setdefault("resumes", []).append(entry)
    write_json_atomic(run_json, record)


class OrderedBatchWriter:
    """Appends each batch's records as soon as the batch is graded, in batch order, from whichever thread finishes
    grading it: a kill loses at most the batches still generating or grading. An error while writing (a full
    disk) is kept and raised in the caller's thread by :meth:`raise_error` or :meth:`finish`."""

    def __init__(self, write):
        self._write = write
        self._lock = threading.Lock()
        self._queue: collections.deque[list] = collections.deque()
        self._error: BaseException | None = None

    def add(self, futures: list) -> None:
        with self._lock:
            self._queue.append(futures)
        for future in futures:
            future.add_done_callback(self._drain)
        self._drain()

    def _drain(self, _future=None) -> None:
        with self._lock:
            while self._error is None and self._queue and all(f.done() for f in self._queue[0]):
                futures = self._queue.popleft()
                try:
                    self._write([f.result() for f in futures])
                except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                    self._error = error

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def finish(self) -> None:
        """Wait for every batch's grading, write what is left, raise a writing error."""
        with self._lock:
            pending = [f for futures in self._queue for f in futures]
        concurrent.futures.wait(pending)
        self._drain()
        self.raise_error()


def effective_few_shot(task: str, few_shot: int | None) -> int | None:
    """The number of worked examples actually shown: None means the task's default (0 for GSM8K)."""
    from gtpo.tasks import TASKS

    return TASKS[task].default_few_shot if few_shot is None and task in TASKS else few_shot


def check_or_write_run_file(run_dir: Path, settings: dict) -> bool:
    """Write run.json (True), or check that the recorded one has the same settings (False)."""
    path = run_dir / RUN_FILE
    if not path.exists():
        if (run_dir / SAMPLES_FILE).exists():
            raise InvalidInput(
                f"{run_dir} holds {SAMPLES_FILE} but no {RUN_FILE}: cannot tell how those "
                "samples were drawn; use another output directory"
            )
        write_json_atomic(path, {**settings, "created": utc_timestamp()})
        return True
    try:
        recorded = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidInput(
            f"{path}: not valid JSON ({err}); it records how the samples beside it were drawn: "
            "restore it, or use another --output_dir"
        ) from None
    if not isinstance(recorded, dict):
        raise InvalidInput(f"{path}: a JSON {type(recorded).__name__}, not an object; use another --output_dir")
    # Run folders written before few_shot was resolved recorded None for "the task's default".
    recorded["few_shot"] = effective_few_shot(settings["task"], recorded.get("few_shot"))
    diffs = [
        f"{key}: recorded {recorded.get(key)!r}, now {settings.get(key)!r}"
        for key in RUN_KEYS
        if recorded.get(key) != settings.get(key)
    ]
    if diffs:
        raise InvalidInput(
            f"run folder {run_dir} was started with different settings; its samples would be mixed with new "
            f"ones. Use another --output_dir, or the recorded settings. Differences: " + "; ".join(diffs)
        )
    return False
