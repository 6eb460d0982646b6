"""Where GTPO's lock-in runs, in tokens: what Eq. 5 and the entropy terms did to each recorded group's opening, split
into the part whose whole prefix a positive and a negative completion share (the common prefix, where the sharers'
gradients are identical and GRPO's summed update is the group's exact evidence) and the part shared by position only
(exploratory; read from the completion records, no model).

    .venv/bin/python studies/tools/lockin_tokens.py two-step studies/smollm2-two-step-g      # G: low seeds vs others
    .venv/bin/python studies/tools/lockin_tokens.py one-step studies/smollm2-synthetic-lr1e-3-e  # E: stalled vs not

Per recorded group (one per step) and completion i, with λ_{i,t} the recorded λ, A_i the advantage (its sign decides
Eq. 5), A'_i the advantage the loss weighted (after δ_i and the shift -γ⟨H⟩_i of Eq. 7) and w_i = 1/|o_i| (loss_type
grpo), a set of tokens P gets the *push* Σ_i Σ_{t∈P_i} λ_{i,t}·A'_i·w_i (up to the tokens' gradients and 1/N; what the
run's loss gave P) and the *plain push* Σ_i Σ_{t∈P_i} A'_i·w_i (the same group's update without the correction). The
*entropy part* is the push with A'_i - A_i in place of A'_i (the shift and δ), split into its *filter part* (δ_i·A_i −
A_i: the updates Eq. 6's filter removed) and its *γ part* (A'_i − δ_i·A_i: the shift of Eq. 7). Token sets: the common
prefix (`gtpo.core.common_prefix_conflicts` on the recorded ids and A_i), the rest of the forward span (position
only), the backward span, and, on the two-step task, the single-equation opening: the tokens up to the "=" of a
completion whose first equation holds three numbers ("9 + 5 + 7 = 21."), and the rest of such a completion outside
both spans (*after the opening*: its result and answer, where Eq. 5 leaves A'_i to act and δ_i can remove it). A GRPO
run's record holds the spans and λ its group would have had: its push is its plain push.

Output: per run, windows of 10 steps, JSON (the study document quotes the tables; labelled exploratory there).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "studies" / "tools"))

WINDOWS = ((1, 10), (11, 20), (21, 30), (31, 40))
_FIRST_EQUATION = re.compile(r"<reasoning>\s*([^=\n]*?)=")  # the text before the first "=" of the reasoning
_NUMBER = re.compile(r"\d+")


def single_equation_opening(tokens: list[str]) -> int:
    """The number of leading tokens up to and including the first "=" when the first equation holds three numbers
    (the single-equation form "9 + 5 + 7 = 21."), else 0."""
    text = "".join(tokens)
    match = _FIRST_EQUATION.search(text)
    if match is None or len(_NUMBER.findall(match.group(1))) < 3:
        return 0
    end, used = match.end(), 0
    for k, piece in enumerate(tokens):
        used += len(piece)
        if used >= end:
            return k + 1
    return len(tokens)


def group_terms(columns: dict, rows: list[int], group_size: int) -> dict:
    """Pushes of one recorded group (module docstring), its single-equation share and the sign-flip flags."""
    import torch

    from gtpo import core
    from gtpo.runs.completions import lambda_row

    ids = [columns["completion_ids"][i] for i in rows]
    t = max(1, max(len(r) for r in ids))
    tokens = torch.tensor([r + [0] * (t - len(r)) for r in ids])  # (G, T)
    mask = torch.tensor([[True] * len(r) + [False] * (t - len(r)) for r in ids])  # (G, T)
    adv = torch.tensor([float(columns["advantage"][i]) for i in rows])  # (G,) A_i
    kept = torch.tensor([0.0 if columns["entropy_filtered"][i] else 1.0 for i in rows])  # (G,) δ_i
    used = torch.tensor([float(columns["advantage_used"][i] or 0.0) for i in rows])  # (G,) A'_i
    pos = torch.arange(t)
    lengths = mask.sum(-1, keepdim=True)  # (G, 1)
    fw = pos < torch.tensor([columns["forward_span"][i] for i in rows]).unsqueeze(-1)  # (G, T)
    bw = (pos >= lengths - torch.tensor([columns["backward_span"][i] for i in rows]).unsqueeze(-1)) & mask
    lam = torch.tensor([lambda_row(columns["lambda_positions"][i], columns["lambda_values"][i], t) for i in rows])
    common = core.common_prefix_conflicts(tokens, mask, adv, group_size, fw)  # (G, T)
    opening_len = torch.tensor([single_equation_opening(list(columns["completion_tokens"][i])) for i in rows])
    opening = (pos < opening_len.unsqueeze(-1)) & mask  # (G, T)
    w = 1.0 / lengths.squeeze(-1).clamp(min=1)  # (G,)
    has_opening = opening_len > 0  # (G,)
    after = mask & has_opening.unsqueeze(-1) & ~opening & ~fw & ~bw  # a single-equation completion's own rest
    sets = {"common prefix": common, "position only": fw & ~common, "backward": bw & ~fw, "opening": opening,
            "after the opening": after}  # fmt: skip

    def summed(where, per_row, weights=lam):
        """Σ_i Σ_{t∈P_i} weights_{i,t}·per_row_i·w_i over the tokens ``where`` (G, T)."""
        return float((where * weights * (per_row * w).unsqueeze(-1)).sum())

    out = {"single-equation share": float(has_opening.float().mean())}
    for name, where in sets.items():
        out[f"{name}: tokens"] = int(where.sum())
        out[f"{name}: push"] = summed(where, used)
        out[f"{name}: plain"] = summed(where, used, 1.0)
        out[f"{name}: entropy part"] = summed(where, used - adv)
        out[f"{name}: filter part"] = summed(where, kept * adv - adv)
        out[f"{name}: gamma part"] = summed(where, used - kept * adv)
    filtered, negative = kept == 0, adv < 0
    out["filtered"] = int(filtered.sum())
    out["filtered negatives"] = int((filtered & negative).sum())
    out["filtered single-equation negatives"] = int((filtered & negative & has_opening).sum())
    out["single-equation negatives"] = int((negative & has_opening).sum())
    # The group's evidence on the opening (GRPO's update, Σ A_i·w_i over its tokens) against what is left of it once
    # Eq. 6 has dropped completions (Σ δ_i·A_i·w_i): the filter alone turns it from down (or none) to up.
    evidence, after_filter = summed(opening, adv, 1.0), summed(opening, kept * adv, 1.0)
    out["opening flipped by the filter"] = int(evidence <= 0 < after_filter)
    out["opening in common prefix"] = int((opening & common).sum())
    out["opening in forward span"] = int((opening & fw).sum())
    # The correction turns the group's update on the opening from down (or none) to up.
    out["opening flipped"] = int(out["opening: plain"] <= 0 < out["opening: push"] and out["opening: tokens"] > 0)
    return out


def run_terms(run: Path) -> dict[int, dict]:
    """group_terms of every recorded step of a run (the first group of each)."""
    from gtpo.runs import completions as records

    steps = {}
    for step in records.recorded_steps(run):
        record = records.read_step(run, step)
        c, g = record["columns"], int(record["metadata"]["group_size"])
        rows = [i for i, group in enumerate(c["group"]) if group == c["group"][0]]
        steps[step] = group_terms(c, rows, g)
    return steps


def windows(steps: dict[int, dict]) -> dict[str, dict]:
    """Per window of steps: the mean single-equation share and the summed pushes, token counts and flips."""
    out = {}
    for lo, hi in WINDOWS:
        inside = [steps[s] for s in steps if lo <= s <= hi]
        if not inside:
            continue
        out[f"{lo}-{hi}"] = {
            key: (statistics.fmean if key == "single-equation share" else sum)(row[key] for row in inside)
            for key in inside[0]
        }
    return out


def _run_groups(task: str, study: Path) -> dict[str, list[Path]]:
    """The runs to compare: G's low seeds (GTPO held-out pass@1 below 11 %) and the others, per arm; or E's stalled
    runs (no full-format group in 15 steps, the registered rule) and the others, per arm."""
    from analyze_preregistered import pass_at_1, study_e

    runs = sorted(p for p in (study / "runs").glob("*/seed*") if (p / "completions").is_dir())
    if task == "two-step":
        low = {p.name for p in runs if p.parent.name == "gtpo" and (pass_at_1(p) or 0) < 11}
        kind = {p: "low seeds" if p.name in low else "other seeds" for p in runs}
    else:
        stalled = study_e(study)["stalled"]
        kind = {p: "stalled" if int(p.name[4:]) in stalled.get(p.parent.name, []) else "other" for p in runs}
    groups: dict[str, list[Path]] = {}
    for p in runs:
        groups.setdefault(f"{p.parent.name}, {kind[p]}", []).append(p)
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=("two-step", "one-step"))
    parser.add_argument("study", type=Path, help="a study folder whose runs have completion records")
    args = parser.parse_args(argv)
    result = {}
    for label, runs in sorted(_run_groups(args.task, args.study).items()):
        per_run = {p.name: windows(run_terms(p)) for p in runs}
        keys = next(iter(per_run.values()))
        result[label] = {
            "runs": sorted(per_run),
            "windows": {
                window: {
                    key: statistics.fmean(r[window][key] for r in per_run.values() if window in r)
                    for key in keys[window]
                }
                for window in keys
            },
            "per run": per_run,
        }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
