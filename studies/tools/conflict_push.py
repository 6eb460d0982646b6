"""What the conflict correction did to each recorded step of a run, in tokens: the shared opening and ending it acted
on, and the net push it gave them (exploratory; issue 38, item 3: why GTPO stalls on the format's partial credit).

For each step of a run's completion record (`completions/`, written by every `gtpo train` run) it prints the
group's rewards, the forward span's text (the longest one, from a positive completion if any), the backward span's
text, and two sums over the forward-span positions of all completions:

- ``push``: Σ_i Σ_{t ∈ M^fw_i} λ_{i,t} · A'_i: the total advantage-weighted update the loss gives the shared opening
  (λ from the record: 2 on a positive's span token, 0 on a negative's);
- ``plain``: the same with λ = 1, what GRPO (or GTPO without the correction) gives those very tokens. With group-
  normalised advantages this is near 0 where positives and negatives share the opening; the correction makes it
  2 · Σ_{positives} A'_i · |span|, all positive;
- ``guard``: the same with the stall guard's λ (`conflict_guard`: 0 on span tokens whose sharers' advantages sum
  below 0, 1 on the others; `gtpo.core.contested_tokens` on the recorded ids and A_i), what the guard would give.

    .venv/bin/python studies/tools/conflict_push.py studies/smollm2-synthetic-lr1e-3-e/runs/gtpo/seed200 [--steps 1 5]
    .venv/bin/python studies/tools/conflict_push.py --table studies/smollm2-synthetic-lr1e-3-e/runs/*/seed*   # per run

Reads the records only (no model). Each line: ``step R=[rewards] push P plain Q guard U  fw 'text'  bw 'text'``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gtpo.runs import completions as records  # noqa: E402


def guard_lambda(c: dict, group_size: int) -> list[list[float]]:
    """Per recorded row, the guard's λ over its tokens, from the record's ids, A_i and span lengths."""
    import torch

    from gtpo import core

    ids = c["completion_ids"]
    t = max(len(row) for row in ids)
    tokens = torch.tensor([row + [0] * (t - len(row)) for row in ids])  # (n, T)
    mask = torch.tensor([[True] * len(row) + [False] * (t - len(row)) for row in ids])  # (n, T)
    pos = torch.arange(t)
    lengths = mask.sum(-1, keepdim=True)  # (n, 1)
    fw = pos < torch.tensor(c["forward_span"]).unsqueeze(-1)  # (n, T)
    bw = (pos >= lengths - torch.tensor(c["backward_span"]).unsqueeze(-1)) & mask  # (n, T)
    adv = torch.tensor(c["advantage"], dtype=torch.float32)
    contested = core.contested_tokens(tokens, mask, adv, group_size, fw, bw)
    lam = core.conflict_weights(fw, bw, adv, group_size=group_size, contested=contested)  # (n, T)
    return [lam[i, : len(row)].tolist() for i, row in enumerate(ids)]


def step_summary(step_record: dict) -> dict:
    """The push on the forward spans of one recorded step (all its recorded groups), and their texts."""
    c = step_record["columns"]
    guard_lam = guard_lambda(c, int(step_record["metadata"]["group_size"]))
    push = plain = guard = 0.0
    shown, shown_key = None, None  # the row whose spans are printed: the longest forward span, positives first
    for i, tokens in enumerate(c["completion_tokens"]):
        used = c["advantage_used"][i] or 0.0  # None where the loss had not run on the row by the logging step
        fw = c["forward_span"][i]
        lam = records.lambda_row(c["lambda_positions"][i], c["lambda_values"][i], len(tokens))
        push += sum(lam[:fw]) * used
        plain += fw * used
        guard += sum(guard_lam[i][:fw]) * used
        key = (fw, c["advantage"][i] > 0)
        if shown_key is None or key > shown_key:
            shown, shown_key = i, key
    tokens = c["completion_tokens"][shown]
    return {
        "rewards": c["reward"],
        "push": push,
        "plain": plain,
        "guard": guard,
        "forward": "".join(tokens[: c["forward_span"][shown]]),
        "backward": "".join(tokens[len(tokens) - c["backward_span"][shown] :]),
    }


FULL_FORMAT = 10.0  # the format reward of a completion in the full format (partial credit: 1; study E's rule)


def run_row(run: str | Path, last_step: int = 15) -> dict:
    """One run's mechanism figures over steps 1..last_step of its record: whether it stalled (no completion with the
    full format, study E's rule read from the record), its step-1 forward span, the first step whose eight rewards
    were all equal (no gradient left), and push / plain / guard summed over the steps before that step (or all)."""
    steps = [t for t in records.recorded_steps(run) if t <= last_step]
    recorded = {t: records.read_step(run, t) for t in steps}  # each file read once
    summaries = {t: step_summary(recorded[t]) for t in steps}
    formats = {t: recorded[t]["columns"].get("format_reward") or [] for t in steps}
    full = next((t for t in steps if any(f is not None and f >= FULL_FORMAT for f in formats[t])), None)
    flat = next((t for t in steps if len(set(summaries[t]["rewards"])) == 1), None)
    before = [t for t in steps if flat is None or t < flat]
    return {
        "run": str(run),
        "steps": len(steps),
        "stalled": full is None,
        "first_full_format": full,
        "opening": summaries[steps[0]]["forward"] if steps else "",
        "first_flat_step": flat,
        **{key: sum(summaries[t][key] for t in before) for key in ("push", "plain", "guard")},
    }


def table(runs: list[str], last_step: int = 15) -> list[str]:
    """The per-run rows of `run_row` as a markdown table."""
    lines = [
        "| run | stalled | first full format | step-1 shared opening | first all-equal step | push | plain | guard |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        r = run_row(run, last_step)
        opening = r["opening"].replace("\n", "⏎").replace("|", "\\|")
        lines.append(
            f"| {r['run']} | {'yes' if r['stalled'] else 'no'} | {r['first_full_format'] or '—'} | `{opening}` | "
            f"{r['first_flat_step'] or '—'} | {r['push']:+.1f} | {r['plain']:+.1f} | {r['guard']:+.1f} |"
        )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders with a completions/ record")
    parser.add_argument("--steps", type=int, nargs=2, metavar=("FIRST", "LAST"), help="only these steps")
    parser.add_argument("--table", action="store_true", help="one markdown row per run (`run_row`), steps 1-15")
    args = parser.parse_args(argv)
    if args.table:
        print("\n".join(table(args.runs)))
        return
    for run in args.runs:
        steps = records.recorded_steps(run)
        if steps and not records.read_step(run, steps[0])["metadata"]["lambda_applied"]:
            print(f"({run}: λ was not applied by this run's loss; push is what the correction would have given)")
        if args.steps:
            steps = [s for s in steps if args.steps[0] <= s <= args.steps[1]]
        print(f"== {run}: {len(steps)} recorded steps")
        for step in steps:
            s = step_summary(records.read_step(run, step))
            rewards = "[" + " ".join(f"{r:g}" for r in s["rewards"]) + "]"
            print(
                f"{step:3d} R={rewards}  push {s['push']:+7.2f} plain {s['plain']:+7.2f} guard {s['guard']:+7.2f}  "
                f"fw {s['forward']!r}  bw {s['backward']!r}"
            )


if __name__ == "__main__":
    main()
