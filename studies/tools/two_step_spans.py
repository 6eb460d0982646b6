"""On the two-step task, how often GTPO's protection meets the case it is for: a negative completion (A < 0) whose
forward conflict span (the leading tokens it shares with positive and negative completions of its group, paper Sec.
5.1) holds a correct first step, so Eq. 5 keeps that step from being pushed down (issue 48, items 3 and 5).

    .venv/bin/python studies/tools/two_step_spans.py studies/smollm2-two-step-pilot/runs/gtpo/seed390 [RUN ...]

Read from a run's completion record (RUN/completions/completions_NNNNN.parquet, one group per step): per completion
its question (the prompt's last user turn), its tokens as decoded pieces (`completion_tokens`), its advantage A (before
the entropy shift: the sign that decides Eq. 5) and its forward span length in tokens (`forward_span`). A span holds
the correct first step when the joined text of its tokens reaches `gtpo.tasks.two_step.first_step_end` of the whole
completion's joined text (the step "a op1 b = x" computed right, up to x's last digit).

Per run it prints the counts over all recorded steps: negative completions; those with a correct first step anywhere;
those whose forward span holds it (the share of negatives: study G's registered secondary outcome; and of the
negatives with a correct first step). A GRPO run records the spans its group would have had (the record is written
for both algorithms), so the same count says how often GRPO pushes such a step down.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gtpo.tasks.two_step import first_step_end  # noqa: E402


def _question(prompt) -> str:
    """The last user turn of a recorded prompt (the question; the earlier user turns are the worked examples)."""
    return [message["content"] for message in prompt if message["role"] == "user"][-1]


def completion_counts(tokens, forward_span: int, advantage: float, question: str) -> dict[str, bool]:
    """What one recorded completion contributes: whether it is negative, has a correct first step, and whether its
    forward span (its first ``forward_span`` tokens) holds that whole step."""
    text = "".join(tokens)
    end = first_step_end(text, question)
    negative = advantage < 0
    in_span = end is not None and len("".join(tokens[:forward_span])) >= end
    return {
        "negative": negative,
        "negative, correct first step": negative and end is not None,
        "negative, span holds the correct first step": negative and in_span,
    }


def run_counts(run: Path) -> dict:
    """The counts over every recorded step of ``run`` (module docstring), with the two shares in %."""
    import pandas as pd

    files = sorted((run / "completions").glob("completions_*.parquet"))
    if not files:
        raise SystemExit(f"{run}: no completion record (completions/completions_*.parquet)")
    totals = {"completions": 0, "negative": 0, "negative, correct first step": 0,
              "negative, span holds the correct first step": 0}  # fmt: skip
    for path in files:
        for row in pd.read_parquet(path).itertuples(index=False):
            counts = completion_counts(
                list(row.completion_tokens), int(row.forward_span), float(row.advantage), _question(row.prompt)
            )
            totals["completions"] += 1
            for key, value in counts.items():
                totals[key] += value
    held = totals["negative, span holds the correct first step"]
    totals["share of negatives, %"] = 100 * held / totals["negative"] if totals["negative"] else None
    step = totals["negative, correct first step"]
    totals["share of negatives with a correct first step, %"] = 100 * held / step if step else None
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with a completions/ record")
    args = parser.parse_args(argv)
    print(json.dumps({str(run): run_counts(run) for run in args.runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
