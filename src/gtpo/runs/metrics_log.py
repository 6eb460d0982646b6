"""The run folder's log: every dict the trainer logs, one JSON line each, in ``RUN_DIR/metrics.jsonl``.

Figures (``gtpo plot``) are drawn from this file, never from live training state, so a run can be
plotted while it trains, after it crashed, or next to runs made elsewhere.

>>> from gtpo.runs.metrics_log import MetricsLogger, read_metrics
>>> trainer.add_callback(MetricsLogger("runs/demo"))  # doctest: +SKIP
>>> rows = read_metrics("runs/demo")  # doctest: +SKIP
>>> rows[0]["step"], rows[0]["reward"]  # doctest: +SKIP
(1, 4.75)
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from transformers import TrainerCallback

from gtpo.runs.jsonl import read_jsonl

METRICS_FILE = "metrics.jsonl"


def _plain(value):
    """A JSON-safe number or string: tensors and numpy scalars become floats, NaN/inf become null."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


class MetricsLogger(TrainerCallback):
    """Append each ``on_log`` dict to ``run_dir/metrics.jsonl`` as ``{"step": ..., "time": ..., **logs}``.

    Only the main process writes, one whole line per write, flushed. ``step`` is the optimizer step the
    dict was logged at; ``time`` is seconds of training since the run began (wall clock). On resume from
    a checkpoint at step N (:func:`prepare_for_resume`) rows past N are dropped first, so each step is
    logged once, and ``time`` continues from the row of step N.
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE
        self._start = None
        self._offset = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.time()
        if state.is_world_process_zero and self.path.exists():
            # global_step > 0 here only when Trainer restored it from a checkpoint.
            self._offset = prepare_for_resume(self.path, state.global_step if state.global_step > 0 else None)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        elapsed = self._offset + time.time() - self._start if self._start is not None else None
        row = {"step": state.global_step, "time": elapsed, **{k: _plain(v) for k, v in logs.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


def prepare_for_resume(path: str | Path, step: int | None) -> float:
    """Make ``path`` (a metrics.jsonl) ready for appending; return the ``time`` to continue from.

    A torn last line (a kill mid-write) is cut, unless it is a whole JSON row that only lacks its newline.
    With ``step`` (resuming from the checkpoint of that step), rows logged after it and the closing
    summary rows (``train_runtime``) are dropped, as an uninterrupted run would not have them. The file is
    replaced atomically. Lines that are not JSON before the last are kept (``read_metrics`` names them).
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    if tail.strip():
        try:
            if isinstance(json.loads(tail), dict):
                lines.append(tail)
        except json.JSONDecodeError:
            pass
    kept, offset = [], 0.0
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            kept.append(line)
            continue
        if step is not None and isinstance(row, dict):
            if not isinstance(row.get("step"), int) or row["step"] > step or "train_runtime" in row:
                continue
            if isinstance(row.get("time"), (int, float)):
                offset = max(offset, float(row["time"]))
        kept.append(line)
    new = "".join(line + "\n" for line in kept)
    if new != text:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, path)
    return offset


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl`` (or of that file given directly), in order."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir}: give a run folder written by `gtpo train`")
    return read_jsonl(path, _metrics_row_problem)


def _metrics_row_problem(row) -> str | None:
    if not isinstance(row, dict) or not isinstance(row.get("step"), int) or isinstance(row["step"], bool):
        return "a metrics row must be a JSON object with an integer 'step'"
    return None


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping rows that do not carry it (e.g. the final summary)."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


def first_last_means(rows: list[dict], key: str, n: int = 10) -> tuple[float, float] | None:
    """Mean of ``key`` over the first ``n`` and the last ``n`` logged steps; None when it was never logged."""
    _, values = series(rows, key)
    if not values:
        return None
    head, tail = values[:n], values[-n:]
    return sum(head) / len(head), sum(tail) / len(tail)
