"""The no-progress warning and the signal-loss line replayed on every committed run (exploratory; their rule was set on
study G's runs only, `gtpo.trainer.callbacks.ProgressRule`), as `studies/tools/collapse_warning_table.py` does for the
collapse warning; and `gtpo/push_against_group`, recomputed from the completion records, at G's low seeds and the rest.

    .venv/bin/python studies/tools/lockin_warning_table.py                 # every study under studies/ (*)
    .venv/bin/python studies/tools/lockin_warning_table.py runs/*-smollm2-synthetic-gtpo   # any run folders

A run *failed* when its held-out pass@1 ended below 11 % (G's low seeds' bound) where it was evaluated, else when its
training accuracy reward averaged at most 0.6 (6 % of completions right) over its last 5 logged steps. Per study and
arm: the runs, the failed ones, the warning's hits (failed, warned), misses and false alarms (warned, not failed) with
the steps it turned on at, runs too short for it to turn on (fewer than 17 steps: studies E, the ablations, the guard
screen), and the runs where the signal-loss line turned on, with the first step. (*) But a pre-registered study still
running: its runs are not read before its last one (they are listed as withheld).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gtpo.compare.report import folder_withholds_estimates  # noqa: E402

FAILED_BELOW = 11.0  # held-out pass@1 in points
TRAINING_FLOOR, LAST_STEPS = 0.6, 5  # accuracy reward, where no held-out evaluation exists


def _shortest() -> int:
    from gtpo.trainer.callbacks import ProgressRule

    rule = ProgressRule()
    return rule.after + rule.patience - 1


SHORTEST = _shortest()  # 17: shorter runs (the 15-step studies) are listed as too short, not judged


def step_rows(run: Path) -> dict[int, dict]:
    """The last logged training row of each step of ``run/metrics.jsonl``."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows if "loss" in row}


def held_out(run: Path) -> float | None:
    """Held-out pass@1 in points, from the run's one evaluation (eval/<task>/results.json), or None."""
    found = sorted((run / "eval").glob("*/results.json"))
    return 100 * json.loads(found[0].read_text())["pass@k"]["1"] if found else None


def _finished(run: Path) -> bool:
    try:
        return json.loads((run / "run.json").read_text()).get("status") == "finished"
    except (OSError, ValueError):
        return False


def judge(run: Path) -> dict:
    """What the monitor said on one run, and whether the run failed (module docstring)."""
    from gtpo.trainer.callbacks import ACCURACY_KEY, ProgressMonitor

    rows = step_rows(run)
    monitor = ProgressMonitor()
    for step in sorted(rows):
        monitor.update(rows[step], step)
    score = held_out(run)
    if score is not None:
        failed = score < FAILED_BELOW
    else:
        last = [rows[s].get(ACCURACY_KEY, 0.0) for s in sorted(rows)[-LAST_STEPS:]]
        failed = bool(last) and statistics.fmean(last) <= TRAINING_FLOOR
    return {"run": f"{run.parent.name}/{run.name}", "steps": len(rows), "held_out": score, "failed": failed,
            **{f"{name} from": step for name, step in monitor.fired_step.items()}}  # fmt: skip


def push_against_group(run: Path) -> dict[int, float]:
    """`gtpo/push_against_group` of each recorded step, from the record's ids, A_i, spans and λ (what the trainer
    logs where one group is the whole step)."""
    import torch

    from gtpo import core
    from gtpo.runs import completions as records

    out = {}
    for step in records.recorded_steps(run):
        record = records.read_step(run, step)
        c, g = record["columns"], int(record["metadata"]["group_size"])
        ids = c["completion_ids"]
        t = max(1, max(len(r) for r in ids))
        tokens = torch.tensor([r + [0] * (t - len(r)) for r in ids])
        mask = torch.tensor([[True] * len(r) + [False] * (t - len(r)) for r in ids])
        pos, lengths = torch.arange(t), mask.sum(-1, keepdim=True)
        fw = pos < torch.tensor(c["forward_span"]).unsqueeze(-1)
        bw = (pos >= lengths - torch.tensor(c["backward_span"]).unsqueeze(-1)) & mask
        lam = torch.tensor(
            [records.lambda_row(p, v, t) for p, v in zip(c["lambda_positions"], c["lambda_values"], strict=True)]
        )
        adv = torch.tensor([float(a) for a in c["advantage"]])
        out[step] = float(core.push_against_group(tokens, mask, adv, g, fw, bw, lam))
    return out


def study_table(runs: list[Path]) -> dict:
    """Counts per arm (module docstring)."""
    arms: dict[str, dict] = {}
    for run in runs:
        if not _finished(run):  # a run still going (a study in the background) is not judged
            continue
        row = judge(run)
        arm = arms.setdefault(run.parent.name, {"runs": 0, "failed": 0, "hits": [], "misses": [], "false alarms": [],
                                                "too short": [], "signal loss": []})  # fmt: skip
        arm["runs"] += 1
        if row["steps"] < SHORTEST:  # the warning cannot turn on before step `after + patience - 1`
            arm["too short"].append(run.name)
            continue
        arm["failed"] += row["failed"]
        warned = row["no_progress from"] is not None
        name = f"{run.name}@{row['no_progress from']}" if warned else run.name
        if row["failed"]:
            arm["hits" if warned else "misses"].append(name)
        elif warned:
            arm["false alarms"].append(name)
        if row["signal_loss from"] is not None:
            arm["signal loss"].append(f"{run.name}@{row['signal_loss from']}")
    return arms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders (default: every study's runs)")
    parser.add_argument("--push", action="store_true", help="also gtpo/push_against_group at G's runs")
    args = parser.parse_args(argv)
    result = {}
    if args.runs:
        result["runs"] = study_table(args.runs)
    else:
        for study in sorted((ROOT / "studies").iterdir()):
            if folder_withholds_estimates(study):  # no outcome read before its last run
                result.setdefault("withheld (pre-registered, still running)", []).append(study.name)
                continue
            runs = sorted(p for p in study.glob("runs/*/seed*") if (p / "metrics.jsonl").is_file())
            if runs:
                result[study.name] = study_table(runs)
    if args.push:
        g = ROOT / "studies" / "smollm2-two-step-g" / "runs" / "gtpo"
        means = {}
        for run in sorted(g.glob("seed*")):
            values = push_against_group(run)
            means[run.name] = {
                "held_out": held_out(run),
                **{
                    f"steps {lo}-{hi}": statistics.fmean(values[s] for s in values if lo <= s <= hi)
                    for lo, hi in ((1, 5), (6, 10), (11, 20))
                },  # fmt: skip
            }
        result["push_against_group, G's gtpo runs"] = means
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
