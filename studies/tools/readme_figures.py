"""The figures of the offline default run (docs/offline-default-run.md, linked from the README), computed from
committed raw data, so they cannot go stale.

The default run (`gtpo train`, no arguments) is recipes/smollm2/synthetic/gtpo.yaml with seed 0; study A
(studies/smollm2-synthetic-lr2e-4) ran exactly that, and its GRPO twin, in float32, and committed their
metrics.jsonl and held-out evaluations. This prints the page's blocks from those files;
tests/test_readme_figures.py checks that docs/offline-default-run.md holds them verbatim.

    .venv/bin/python studies/tools/readme_figures.py          # print the blocks
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUDY = Path("studies/smollm2-synthetic-lr2e-4")
RUNS = {"GTPO": STUDY / "runs/gtpo/seed0", "GRPO": STUDY / "runs/grpo/seed0"}
COLUMNS = (("total reward (max 20)", "reward"), ("format (max 10)", "rewards/format_reward/mean"),
           ("accuracy (max 10)", "rewards/accuracy_reward/mean"))  # fmt: skip


def _rows(run: Path) -> list[dict]:
    lines = (ROOT / run / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "reward" in row]


def _means(rows: list[dict], key: str, n: int = 10) -> tuple[float, float]:
    values = [float(row[key]) for row in rows if key in row]
    return sum(values[:n]) / len(values[:n]), sum(values[-n:]) / len(values[-n:])


def training_table() -> str:
    lines = [
        "| mean over steps 1–10 → 31–40 | " + " | ".join(label for label, _ in COLUMNS) + " | steps' compute time |",
        "|---|---|---|---|---|",
    ]
    for arm, run in RUNS.items():
        rows = _rows(run)
        cells = [f"{a:.2f} → {b:.2f}" for a, b in (_means(rows, key) for _, key in COLUMNS)]
        minutes = sum(row.get("step_time", 0.0) for row in rows) / 60
        lines.append(f"| {arm} (`{run}`) | " + " | ".join(cells) + f" | {minutes:.1f} min |")
    return "\n".join(lines)


def initial_entropy() -> str:
    rows = _rows(RUNS["GTPO"])
    value = next(row["gtpo/initial_entropy"] for row in rows if "gtpo/initial_entropy" in row)
    return f"⟨H⟩_ini = {value:.3f} nats"


def eval_table() -> str:
    lines = ["| model (100 held-out problems, n = 8) | pass@1 | pass@8 | maj@8 |", "|---|---|---|---|"]
    for arm, run in RUNS.items():
        results = json.loads((ROOT / run / "eval/synthetic/results.json").read_text())
        figures = (results["pass@k"]["1"], results["pass@k"]["8"], results["maj@k"]["8"])
        lines.append(f"| + {arm}, 40 steps | " + " | ".join(f"{100 * v:.1f} %" for v in figures) + " |")
    return "\n".join(lines)


def blocks() -> list[str]:
    """The page's figures, each a piece of text docs/offline-default-run.md must contain."""
    return [training_table(), initial_entropy(), eval_table()]


if __name__ == "__main__":
    sys.stdout.write("\n\n".join(blocks()) + "\n")
