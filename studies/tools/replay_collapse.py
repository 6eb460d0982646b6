#!/usr/bin/env python
"""Replay recorded metrics through the collapse rule and measure it: lead time and false alarms.

For each run (a run folder or its metrics.jsonl) it prints the step the rule of
``gtpo.trainer.callbacks.CollapseWarningCallback`` would have warned at, the step the format reward fell, the
lead time (fall − warning, in logged steps) and a verdict:

- fall: the first step where the smoothed format reward (EMA, same α as the rule) is more than
  ``--fall-drop`` (a fraction, default 0.25) of its best smoothed value below that best, for
  ``--fall-patience`` (3) logs in a row (a one-step blip that recovers is no collapse), and the best is
  at least ``--min-best`` (so a run that never learned the format cannot "fall");
- ``early``: warned before the fall; ``late``: warned at or after it; ``missed``: fell, no warning;
  ``false alarm``: warned, never fell; ``quiet``: neither.

    python studies/tools/replay_collapse.py studies/smollm2-synthetic-lr2e-4/runs/*/seed* runs/*/
    python studies/tools/replay_collapse.py RUN_DIR --json out.json

Bad input (a missing file, a line that is not JSON) ends in one line naming the file, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gtpo.runs.metrics_log import read_metrics
from gtpo.trainer.callbacks import DEFAULT_FORMAT_KEY, SIGNALS, CollapseMonitor, CollapseRule


def step_rows(rows: list[dict]) -> list[dict]:
    """One row per training step (the last one logged for it), in step order; summary rows dropped."""
    by_step = {}
    for row in rows:
        if isinstance(row.get("step"), int) and ("entropy" in row or "gtpo/mean_entropy" in row):
            by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)]


def fall_step(rows: list[dict], key: str, alpha: float, drop: float, min_best: float, patience: int = 3) -> int | None:
    """First step of ``patience`` logs in a row whose smoothed format is > drop·best below its best."""
    ema = best = None
    streak = []
    for row in rows:
        value = row.get(key)
        if not isinstance(value, (int, float)):
            continue
        ema = value if ema is None else alpha * value + (1 - alpha) * ema
        best = ema if best is None else max(best, ema)
        streak = streak + [row["step"]] if best >= min_best and best - ema > drop * best else []
        if len(streak) >= patience:
            return streak[0]
    return None


def measure(path: str, key: str, rule: CollapseRule, drop: float, min_best: float, fall_patience: int = 3) -> dict:
    rows = step_rows(read_metrics(path))
    monitor = CollapseMonitor(rule=rule, format_key=key)
    for row in rows:
        monitor.update(row, step=row["step"])
    warn = monitor.fired_step
    fall = fall_step(rows, key, rule.alpha, drop, min_best, fall_patience)
    if fall is not None:
        verdict = "missed" if warn is None else ("early" if warn < fall else "late")
    else:
        verdict = "false alarm" if warn is not None else "quiet"
    return {
        "run": str(path),
        "steps": len(rows),
        "last_step": rows[-1]["step"] if rows else None,
        "warning_step": warn,
        "fall_step": fall,
        "lead_steps": fall - warn if warn is not None and fall is not None else None,
        "verdict": verdict,
        "reasons": monitor.reasons,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders or metrics.jsonl files")
    parser.add_argument("--format-key", default=DEFAULT_FORMAT_KEY)
    parser.add_argument("--fall-drop", type=float, default=0.25, help="relative fall from the best (default 0.25)")
    parser.add_argument("--fall-patience", type=int, default=3, help="logs in a row below (default 3)")
    parser.add_argument("--min-best", type=float, default=5.0, help="best smoothed format needed to fall (default 5)")
    parser.add_argument("--alpha", type=float, default=CollapseRule.alpha)
    parser.add_argument("--patience", type=int, default=CollapseRule.patience)
    parser.add_argument("--entropy-rise", type=float, default=CollapseRule.entropy_rise)
    parser.add_argument("--entropy-threshold", type=float, default=CollapseRule.entropy_threshold)
    parser.add_argument("--signals", nargs="+", choices=SIGNALS, default=list(CollapseRule().signals))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    try:
        rule = CollapseRule(
            alpha=args.alpha,
            patience=args.patience,
            entropy_rise=args.entropy_rise,
            entropy_threshold=args.entropy_threshold,
            signals=tuple(args.signals),
        )
        results = [
            measure(p, args.format_key, rule, args.fall_drop, args.min_best, args.fall_patience) for p in args.runs
        ]
    except (FileNotFoundError, ValueError) as err:
        print(f"replay_collapse: error: {err}", file=sys.stderr)
        return 2
    print(f"{'run':60s} {'steps':>5s} {'warn':>5s} {'fall':>5s} {'lead':>5s}  verdict")
    for r in results:
        cells = [
            str(r[k]) if r[k] is not None else "-" for k in ("last_step", "warning_step", "fall_step", "lead_steps")
        ]
        print(f"{r['run'][-60:]:60s} {cells[0]:>5s} {cells[1]:>5s} {cells[2]:>5s} {cells[3]:>5s}  {r['verdict']}")
    fell = [r for r in results if r["fall_step"] is not None]
    calm = [r for r in results if r["fall_step"] is None]
    early = [r for r in fell if r["verdict"] == "early"]
    alarms = [r for r in calm if r["verdict"] == "false alarm"]
    print(
        f"collapsed (format fell): {len(fell)}; warned before the fall: {len(early)}"
        + (f" (lead {', '.join(str(r['lead_steps']) for r in early)} steps)" if early else "")
    )
    print(f"not collapsed: {len(calm)}; false alarms: {len(alarms)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
