"""Figures of ``gtpo compare``: the panels of ``gtpo plot`` with one mean curve and 95% band per arm, and
one stability panel per run. Curves come from :mod:`gtpo.compare.curves`."""

from __future__ import annotations

import math
from pathlib import Path

from gtpo.compare import stats
from gtpo.compare.curves import METRICS, PANELS_BY_NAME, panel_series
from gtpo.core.paper import LN2
from gtpo.runs.plots import KEY_LABELS, PANELS, auto_window, moving_average, panel_keys


def arm_band(curves: list[tuple[list[int], list[float]]], window: int):
    """(steps, mean, low, high) of one arm: each seed's curve smoothed with a trailing moving average over
    ``window`` steps, then at every step any seed logged the mean and 95% t-band over the seeds that have it (the
    band is the mean itself where only one has). Steps differ between seeds in the panels drawn on steps with a
    learning signal (the conflict fraction: a step whose group got equal rewards has none), where the steps all
    seeds share can be a handful; and in a study aggregated with unfinished runs."""
    smoothed = [dict(zip(steps, moving_average(values, window), strict=False)) for steps, values in curves]
    steps = sorted(set().union(*smoothed)) if smoothed else []
    mean, low, high = stats.column_band([[curve[step] for curve in smoothed if step in curve] for step in steps])
    return steps, mean, low, high


def _setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_arms(runs: dict, arm_names: list[str], out_dir: Path, window: int | None = None) -> list[Path]:
    """training_curves.png and one PNG per panel: per arm, the mean over seeds with its 95% band."""

    plt = _setup()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(runs)
    rows = [(name, runs[name]["rows"]) for name in names]
    longest = max((len(r) for _, r in rows), default=1)
    window = window or auto_window(longest)
    drawn_panels = []
    for panel in PANELS:
        keys = dict(zip(names, panel_keys(panel, rows), strict=False))
        arms = {}
        for arm in arm_names:
            curves = [panel_series(panel, runs[n]["rows"], keys[n]) for n in names if n[0] == arm and keys[n]]
            curves = [c for c in curves if c[0]]
            if curves:
                arms[arm] = (len(curves), arm_band(curves, window))
        if arms:
            drawn_panels.append((panel, arms, sorted({k for k in keys.values() if k})))
    written = []
    columns = 3 if len(drawn_panels) <= 6 else 4
    overview, axes = plt.subplots(2, columns, figsize=(5 * columns, 8), constrained_layout=True, squeeze=False)
    for ax in axes.flat[len(drawn_panels) :]:
        ax.set_visible(False)
    for (panel, arms, used), ax in zip(drawn_panels, axes.flat, strict=False):
        _draw_bands(ax, panel, arms, used, arm_names)
    overview.suptitle(f"Mean over seeds with 95% band, cut to the metric's range (moving average over {window} steps)")
    path = out_dir / "training_curves.png"
    overview.savefig(path, dpi=110)
    plt.close(overview)
    written.append(path)
    for panel, arms, used in drawn_panels:
        fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
        _draw_bands(ax, panel, arms, used, arm_names)
        path = out_dir / f"{panel.name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def clip_band(values: list[float], bounds: tuple[float | None, float | None]) -> list[float]:
    """A band edge cut to the range the metric can take (a t-band of 2-3 seeds can reach past it: a mean of
    percentages is never above 100, nor an entropy below 0)."""
    lower, upper = (-math.inf if bounds[0] is None else bounds[0]), (math.inf if bounds[1] is None else bounds[1])
    return [min(max(v, lower), upper) for v in values]


def _draw_bands(ax, panel, arms: dict, used: list[str], arm_names: list[str]) -> None:
    for arm, (n, (steps, mean, low, high)) in arms.items():
        color = f"C{arm_names.index(arm)}"
        ax.plot(steps, mean, color=color, linewidth=2, label=f"{arm} (n={n})")
        if n > 1:
            ax.fill_between(
                steps, clip_band(low, panel.bounds), clip_band(high, panel.bounds), color=color, alpha=0.2, linewidth=0
            )
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel if len(used) != 1 or used[0] not in KEY_LABELS else KEY_LABELS[used[0]])
    ax.grid(True, alpha=0.3)
    if panel.from_zero:  # as `gtpo plot`: a curve at 0 stays visible, an all-zero panel gets a unit axis
        top = max((max(clip_band(high, panel.bounds)) for _, (_, (_, _, _, high)) in arms.items() if high), default=0.0)
        top = top * 1.05 if top > 0 else 1.0
        ax.set_ylim(bottom=-0.02 * top, top=top)
    if panel.hline:
        value, text = panel.hline
        ax.axhline(value, color="gray", linestyle="--", linewidth=1, label=text)
    ax.legend(fontsize=8)


def plot_stability(
    runs: dict, arm_names: list[str], seeds: list[int], path: Path, window: int, format_drop: float
) -> Path:
    """One panel per run (rows: arms, columns: seeds): smoothed format % (left axis) with its drop steps
    shaded orange, smoothed entropy (right axis) with ln 2 and the first upward crossing marked."""

    plt = _setup()
    fig, axes = plt.subplots(
        len(arm_names),
        len(seeds),
        figsize=(4 * len(seeds), 2.8 * len(arm_names)),
        constrained_layout=True,
        squeeze=False,
    )
    names = list(runs)
    rows = [(name, runs[name]["rows"]) for name in names]
    fkeys = dict(zip(names, panel_keys(PANELS_BY_NAME[METRICS["format %"]], rows), strict=False))
    ekeys = dict(zip(names, panel_keys(PANELS_BY_NAME[METRICS["entropy"]], rows), strict=False))
    for i, arm in enumerate(arm_names):
        for j, seed in enumerate(seeds):
            ax = axes[i][j]
            ax.set_title(f"{arm} / seed {seed}", fontsize=9)
            run = runs.get((arm, seed))
            if run is None:
                ax.text(0.5, 0.5, "not finished", ha="center", va="center", transform=ax.transAxes, color="gray")
                continue
            steps, fmt = panel_series(PANELS_BY_NAME["format"], run["rows"], fkeys[(arm, seed)])
            if steps:
                ax.plot(steps, moving_average(fmt, window), color="C0", linewidth=1.5)
            for step in run["stability"]["format_drop_steps"]:
                ax.axvspan(step - 0.5, step + 0.5, color="C1", alpha=0.25, linewidth=0)
            ax.set_ylim(0, 105)
            ax.set_ylabel("format % (C0)", fontsize=8)
            ax.set_xlabel("step", fontsize=8)
            twin = ax.twinx()
            esteps, ent = panel_series(PANELS_BY_NAME["entropy"], run["rows"], ekeys[(arm, seed)])
            if esteps:
                twin.plot(esteps, moving_average(ent, window), color="C3", linewidth=1.2)
            twin.axhline(LN2, color="gray", linestyle="--", linewidth=1)
            crossing = run["stability"]["entropy_crosses_ln2"]
            if crossing:
                twin.axvline(crossing, color="C3", linestyle=":", linewidth=1)
            twin.set_ylabel("entropy (C3)", fontsize=8)
    fig.suptitle(
        f"Stability per run: blue = format %, red = entropy, dashed = ln 2; orange = format more than "
        f"{format_drop:g} points below its best (moving averages over {window} steps)",
        fontsize=10,
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
