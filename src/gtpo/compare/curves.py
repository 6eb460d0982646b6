"""A run's curves as the study reads them: one row per step, a panel's series in its unit (the key choice and
scale of `gtpo plot`), and the mean of the last window of steps. Shared by the summary and the figures."""

from __future__ import annotations

from gtpo.runs.metrics_log import series
from gtpo.runs.plots import NO_SIGNAL_KEY, PANELS

PANELS_BY_NAME = {p.name: p for p in PANELS}
# Summary metric -> the `gtpo plot` panel it reads (same key choice and scale: format/accuracy in %).
METRICS = {"reward": "reward", "format %": "format", "accuracy %": "accuracy", "entropy": "entropy"}


def step_rows(rows: list[dict]) -> list[dict]:
    """One row per step, the last one logged for it (a resumed run may have logged a step twice), in step order;
    rows without a reward (the trainer's final summary) are left out."""
    by_step = {}
    for row in rows:
        if "reward" in row or any(k.startswith("rewards/") for k in row):
            by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def panel_series(panel, rows: list[dict], key: str | None) -> tuple[list[int], list[float]]:
    """(steps, values in the panel's unit) of one run, as `gtpo plot` draws them."""
    if key is None:
        return [], []
    if panel.needs_signal:
        rows = [row for row in rows if row.get(NO_SIGNAL_KEY) != 1]
    steps, values = series(rows, key)
    return steps, [v * panel.scale for v in values]


def last_window(values: list[float], window: int) -> float | None:
    tail = values[-window:]
    return sum(tail) / len(tail) if tail else None
