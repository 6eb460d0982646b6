"""The aggregation of ``gtpo compare``: per-run numbers, per-arm intervals, paired differences, figures.

From the run folders alone (``OUT/runs/<arm>/seed<S>/metrics.jsonl`` and, with ``--eval``,
``OUT/runs/<arm>/seed<S>/eval/<task>/results.json``):

- per run: the mean of the last ``window`` logged steps of each summary metric (:data:`METRICS`), the
  held-out pass@k / maj@k, and the stability measures (:func:`stability`);
- per arm: the mean over seeds with its 95% t-interval (:func:`gtpo.compare.stats.mean_interval`);
- per pair of arms: the paired difference over the seeds both finished (:func:`gtpo.compare.stats.paired_difference`);
- figures: the panels of ``gtpo plot`` (:data:`gtpo.runs.plots.PANELS`), per arm the mean over seeds of the
  smoothed curves with a 95% band, and one stability panel per run.

A pre-registered study (its folder holds ``PREREGISTRATION.md``) is analysed once, after its last run: until every
run of ``compare.json`` has finished its summary withholds every estimate (per-arm numbers, paired differences,
stability, figures) and says only how many runs have finished, so refreshing it after each run is no interim look
(docs/studies/method.md; docs/studies/d.md says what an earlier summary showed). Complete, it gets the full
summary like any other study.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path

from gtpo.compare import stats
from gtpo.compare.curves import METRICS, PANELS_BY_NAME, last_window, panel_series, step_rows
from gtpo.compare.study import run_dir, run_status
from gtpo.core.paper import LN2
from gtpo.runs.metrics_log import read_metrics
from gtpo.runs.plots import moving_average, panel_keys

logger = logging.getLogger(__name__)

PREREGISTRATION = "PREREGISTRATION.md"


def stability(steps: list[int], format_pct: list[float], entropy: list[float], window: int, format_drop: float) -> dict:
    """Collapse measures of one run, on moving averages over ``window`` steps (one step is one noisy group).

    - ``format_drop_steps``: steps where the smoothed format % is more than ``format_drop`` points below the
      best smoothed value so far; ``first_format_drop``: the first such step; ``max_format_drop``: the
      largest fall below the best so far (points).
    - ``entropy_crosses_ln2``: the first step where the smoothed entropy goes from ≤ ln 2 to > ln 2 (the
      threshold of Eq. 6; a run that starts above ln 2 crosses only after having come below);
      ``entropy_above_ln2_last``: whether the last smoothed value is above ln 2.
    """
    out = {
        "format_drop_steps": [],
        "first_format_drop": None,
        "max_format_drop": None,
        "entropy_crosses_ln2": None,
        "entropy_above_ln2_last": None,
    }
    if format_pct:
        smooth = moving_average(format_pct, window)
        best, worst = -math.inf, 0.0
        for step, value in zip(steps, smooth, strict=False):
            best = max(best, value)
            worst = max(worst, best - value)
            if best - value > format_drop:
                out["format_drop_steps"].append(step)
        out["max_format_drop"] = worst
        out["first_format_drop"] = out["format_drop_steps"][0] if out["format_drop_steps"] else None
    if entropy:
        smooth = moving_average(entropy, window)
        for v0, s1, v1 in zip(smooth, steps[1:], smooth[1:], strict=False):
            if v0 <= LN2 < v1:
                out["entropy_crosses_ln2"] = s1
                break
        out["entropy_above_ln2_last"] = smooth[-1] > LN2
    return out


def _eval_results(folder: Path) -> dict:
    """pass@k / maj@k of a run from RUN/eval/<task>/results.json (flattened to 'pass@4': value in %)."""
    found = {}
    for path in sorted(folder.glob("eval/*/results.json")):
        results = json.loads(path.read_text())
        for metric in ("pass@k", "maj@k"):
            for k, value in results.get(metric, {}).items():
                found[f"{metric[:-2]}@{k} %"] = 100 * value
    return found


def collect(spec, out: Path, window: int, format_drop: float, include_unfinished: bool) -> dict:
    """Per-run numbers of every run folder that has metrics (see the module docstring)."""

    runs = {}
    for arm in spec.arms:
        for seed in spec.seeds:
            folder = run_dir(out, arm.name, seed)
            status = run_status(folder)
            if status != "finished" and not (include_unfinished and (folder / "metrics.jsonl").is_file()):
                continue
            runs[(arm.name, seed)] = {"status": status, "rows": step_rows(read_metrics(folder)), "folder": folder}
    keys = {}
    all_runs = [(name, r["rows"]) for name, r in runs.items()]
    for metric, panel in METRICS.items():  # one key per panel for all runs, as `gtpo plot` chooses
        keys[metric] = dict(zip(runs, panel_keys(PANELS_BY_NAME[panel], all_runs), strict=False)) if runs else {}
    for name, run in runs.items():
        rows = run["rows"]
        run["steps"] = len(rows)
        run["last_window"] = {}
        curves = {}
        for metric, panel in METRICS.items():
            steps, values = panel_series(PANELS_BY_NAME[panel], rows, keys[metric][name])
            curves[metric] = (steps, values)
            run["last_window"][metric] = last_window(values, window)
        fsteps, fvals = curves["format %"]
        esteps, evals = curves["entropy"]
        run["stability"] = stability(fsteps, fvals, evals if esteps == fsteps else [], window, format_drop)
        run["eval"] = _eval_results(run["folder"])
    return runs


def finished_seeds(spec, out: Path) -> dict[str, list[int]]:
    """Per arm of ``spec``, the seeds whose run under OUT has finished."""
    return {a.name: [s for s in spec.seeds if run_status(run_dir(out, a.name, s)) == "finished"] for a in spec.arms}


def withholds_estimates(spec, out: Path, finished: dict[str, list[int]] | None = None) -> bool:
    """Whether OUT is a pre-registered study (it holds PREREGISTRATION.md) with a run of ``spec`` not yet finished:
    then nothing may read its outcomes (no interim look), neither its summary nor a tool that walks the studies.
    ``finished``: :func:`finished_seeds` where the caller has it already (else read from the run folders)."""
    finished = finished_seeds(spec, out) if finished is None else finished
    done = sum(len(seeds) for seeds in finished.values())
    return (Path(out) / PREREGISTRATION).is_file() and done < len(spec.arms) * len(spec.seeds)


def folder_withholds_estimates(out: Path) -> bool:
    """:func:`withholds_estimates` for the study folder OUT, its spec read from its compare.json (none: False)."""
    from gtpo.compare.study import SPEC_FILE, Spec

    spec = Path(out) / SPEC_FILE
    return spec.is_file() and withholds_estimates(Spec.from_json(json.loads(spec.read_text())), out)


def aggregate(
    spec, out: Path, window: int = 10, format_drop: float = 20.0, include_unfinished: bool = False, figures: bool = True
) -> dict:
    """Write OUT/summary.json, OUT/summary.md and (``figures``) OUT/figures/; return the summary dict."""
    out = Path(out)
    runs = collect(spec, out, window, format_drop, include_unfinished)
    arm_names = [a.name for a in spec.arms]
    finished = finished_seeds(spec, out)
    total, done = len(arm_names) * len(spec.seeds), sum(len(v) for v in finished.values())
    if withholds_estimates(spec, out, finished):
        return _withhold(out, runs, finished, total, done, window, format_drop, include_unfinished)
    metric_names = list(METRICS) + sorted({m for r in runs.values() for m in r["eval"]}, key=_eval_order)
    per_seed = {a: {m: {} for m in metric_names} for a in arm_names}
    for (arm, seed), run in runs.items():
        for metric in metric_names:
            value = run["last_window"].get(metric, run["eval"].get(metric))
            if value is not None:
                per_seed[arm][metric][seed] = value
    arms = {}
    for arm in arm_names:
        arms[arm] = {
            "finished_seeds": finished[arm],
            "aggregated_seeds": sorted(s for a, s in runs if a == arm),
            "metrics": {m: stats.mean_interval(list(v.values())).as_dict() for m, v in per_seed[arm].items() if v},
        }
    pairs = []
    for a, b in itertools.combinations(arm_names, 2):
        for metric in metric_names:
            diff = stats.paired_difference(per_seed[a][metric], per_seed[b][metric])
            if diff is not None:
                pairs.append(
                    {"a": a, "b": b, "metric": metric, "diff": diff.as_dict(), "verdict": stats.verdict(diff, a, b)}
                )
    summary = {
        "window": window,
        "format_drop": format_drop,
        "include_unfinished": include_unfinished,
        "total_runs": total,
        "finished_runs": done,
        "arms": arms,
        "pairs": pairs,
        "runs": {
            f"{a}/seed{s}": {
                "status": r["status"],
                "steps": r["steps"],
                "last_window": r["last_window"],
                "eval": r["eval"],
                "stability": r["stability"],
            }
            for (a, s), r in runs.items()
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(summary_markdown(summary, metric_names))
    if runs and figures:
        from gtpo.compare.figures import plot_arms, plot_stability

        plot_arms(runs, arm_names, out / "figures")  # smoothing as `gtpo plot`: about 1/8 of the run
        plot_stability(runs, arm_names, spec.seeds, out / "figures" / "stability.png", window, format_drop)
    return summary


def _withhold(out: Path, runs: dict, finished: dict, total: int, done: int, window, format_drop, unfinished) -> dict:
    """The summary of an incomplete pre-registered study: which runs have finished, no estimate (no figures)."""
    summary = {
        "window": window,
        "format_drop": format_drop,
        "include_unfinished": unfinished,
        "total_runs": total,
        "finished_runs": done,
        "withheld": f"pre-registered ({PREREGISTRATION}): estimates withheld until all {total} runs have finished",
        "arms": {arm: {"finished_seeds": seeds} for arm, seeds in finished.items()},
        "pairs": [],
        "runs": {f"{a}/seed{s}": {"status": r["status"], "steps": r["steps"]} for (a, s), r in runs.items()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        f"# gtpo compare: summary ({done} of {total} runs finished)",
        "",
        f"**Pre-registered study, not complete**: this folder has a {PREREGISTRATION}, so the study is analysed "
        f"once, after its last run. Until all {total} runs have finished, this summary shows no estimate (no "
        "per-arm numbers, no paired differences, no stability, no figures): only which runs have finished.",
        "",
        "| arm | finished seeds |",
        "|---|---|",
    ]
    lines += [f"| {arm} | {','.join(map(str, seeds)) or 'none'} |" for arm, seeds in finished.items()]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return summary


def _eval_order(name: str) -> tuple:
    kind, _, k = name.partition("@")  # "pass@4 %": pass@k before maj@k, then k ascending
    return (kind != "pass", kind, int(k.split()[0]) if k.split()[0].isdigit() else 0)


def _fmt(interval: dict, digits: int = 2) -> str:
    return stats.Interval(**interval).format(digits)


def summary_markdown(summary: dict, metric_names: list[str]) -> str:
    """The tables of summary.md: arms, paired differences, stability per run."""
    w = summary["window"]
    lines = [f"# gtpo compare: summary ({summary['finished_runs']} of {summary['total_runs']} runs finished)", ""]
    if summary["finished_runs"] < summary["total_runs"]:
        lines += ["**Partial**: not every run has finished; the numbers below cover the runs listed per arm.", ""]
    if summary["include_unfinished"]:
        lines += ["Unfinished runs are included (their last logged window): marked `partial` below.", ""]
    lines += [
        f"Per arm: mean over seeds [95% t-interval] of the last {w} logged steps (training metrics) and of "
        "the held-out evaluation; format and accuracy in % of their maximum (10).",
        "",
    ]
    header = ["arm", "seeds"] + metric_names
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm, data in summary["arms"].items():
        seeds = ",".join(map(str, data["aggregated_seeds"])) or "none"
        cells = [_fmt(data["metrics"][m]) if m in data["metrics"] else "–" for m in metric_names]
        lines.append(f"| {arm} | {seeds} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Paired differences (a − b, same seeds) with 95% t-intervals:",
        "",
        "| a − b | metric | difference [95% CI] | n | reading |",
        "|---|---|---|---|---|",
    ]
    for pair in summary["pairs"]:
        lines.append(
            f"| {pair['a']} − {pair['b']} | {pair['metric']} | {_fmt(pair['diff'])} | {pair['diff']['n']} "
            f"| {pair['verdict']} |"
        )
    lines += [
        "",
        f"Stability per run (moving average over {w} steps): format drop = more than "
        f"{summary['format_drop']:g} points below its best so far; entropy crossing = first step the "
        "entropy goes above ln 2 from below.",
        "",
        "| run | status | steps | first format drop | drop steps | largest drop (points) "
        "| entropy crosses ln 2 | entropy > ln 2 at the end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in summary["runs"].items():
        st = run["stability"]
        status = run["status"] if run["status"] == "finished" else f"partial ({run['status']})"
        largest = "–" if st["max_format_drop"] is None else f"{st['max_format_drop']:.1f}"
        lines.append(
            f"| {name} | {status} | {run['steps']} | {st['first_format_drop'] or '–'} "
            f"| {len(st['format_drop_steps'])} | {largest} | {st['entropy_crosses_ln2'] or '–'} "
            f"| {'yes' if st['entropy_above_ln2_last'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"
