"""Training curves from run folders: the paper's Figures 1, 2 (top), 4 and 5, for one run or several.

Each figure is drawn from ``RUN_DIR/metrics.jsonl`` (see :mod:`gtpo.runs.metrics_log`), one line per run:

- ``accuracy.png``, ``format.png``: the mean accuracy / format reward of a step as a percentage of its
  maximum, 10 (paper Sec. 6.1: "100% corresponds to a reward of 10");
- ``reward.png``: the mean total reward (the sum of the reward functions, max 20 with the paper's two);
- ``entropy.png``: the mean completion entropy ⟨H⟩, with the ln 2 threshold of Eq. (6) marked;
- ``conflict.png``: the fraction of valid completion tokens inside a conflict span (Sec. 5.1), over
  completions with A ≠ 0; steps where no completion had A ≠ 0 (all rewards of every group equal) are
  left out, since no conflict is defined there;
- ``filtered.png``: the fraction of completions removed by the entropy filter δ_i (Eq. 6);
- ``kl.png``: GRPO's KL to its reference model (Figure 1, bottom), when a run logged it (β > 0);
- ``training_curves.png``: all of the above on one page.

Raw per-step values are drawn faint and a trailing moving average on top, as in the paper's plots.

>>> from gtpo.runs.plots import plot_runs
>>> plot_runs(["runs/gtpo", "runs/grpo"], "figures/")  # doctest: +SKIP
[PosixPath('figures/training_curves.png'), PosixPath('figures/accuracy.png'), ...]
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from gtpo.core.paper import LN2
from gtpo.errors import InvalidInput
from gtpo.runs.metrics_log import read_metrics, series

logger = logging.getLogger(__name__)

REWARD_MAX = 10.0  # each of the paper's two rewards scores at most 10 (Sec. 16.1)


@dataclass(frozen=True)
class Panel:
    """One curve family: which logged key(s) it reads, and how it is scaled and labelled."""

    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...] = ()  # the first key a run has is used (GTPO's own metric before TRL's)
    pattern: str | None = None  # or: the first key matching this regex
    scale: float = 1.0
    hline: tuple[float, str] | None = None
    from_zero: bool = False  # a fraction or a percentage: the axis starts at 0
    # Steps where every completion of every group had the same reward have no A ≠ 0 row, so no conflict
    # is defined there (the logged 0 is 0/0); such steps are left out of the curve rather than drawn as 0.
    needs_signal: bool = False
    # The range the metric (so any mean of it) can take, None for no bound; `gtpo compare` cuts its 95% t-bands,
    # which at 2-3 seeds reach far past it (a format band up to 200 %), to this range.
    bounds: tuple[float | None, float | None] = (None, None)

    def key_for(self, rows: list[dict]) -> str | None:
        present = {k for row in rows for k in row}
        for key in self.keys:
            if key in present:
                return key
        if self.pattern:
            matches = sorted(k for k in present if re.fullmatch(self.pattern, k))
            return matches[0] if matches else None
        return None


def _reward_panel(reward: str) -> Panel:
    """The panel of one of the paper's 0-10 rewards (TRL logs ``rewards/<function name>/mean``), in % of its maximum."""
    return Panel(
        reward,
        f"{reward.capitalize()} reward",
        f"{reward} (%)",
        pattern=rf"rewards/[^/]*{reward}[^/]*/mean",
        scale=100 / REWARD_MAX,
        from_zero=True,
        bounds=(0.0, 100.0),
    )


PANELS = (
    _reward_panel("accuracy"),
    _reward_panel("format"),
    Panel("reward", "Total reward", "mean total reward", keys=("reward",), from_zero=True),
    Panel(
        "entropy",
        "Mean completion entropy",
        "entropy (nats)",
        keys=("gtpo/mean_entropy", "entropy"),
        hline=(LN2, "ln 2"),
        bounds=(0.0, None),
    ),
    Panel(
        "conflict",
        "Conflict token fraction",
        "fraction of tokens (rows with A ≠ 0)",
        keys=("gtpo/conflict_token_frac",),
        from_zero=True,
        needs_signal=True,
        bounds=(0.0, 1.0),
    ),
    Panel(
        "filtered",
        "Filtered completions (δ_i = 0)",
        "fraction of completions",
        keys=("gtpo/filtered_frac",),
        from_zero=True,
        bounds=(0.0, 1.0),
    ),
    # Figure 1 (bottom): GRPO's KL to the reference model, logged by TRL only when beta > 0.
    Panel("kl", "KL divergence (GRPO, β > 0)", "KL to the reference (nats)", keys=("kl",), from_zero=True),
)

NO_SIGNAL_KEY = "frac_reward_zero_std"  # TRL: share of groups whose rewards all agree


# Axis labels that say which definition a curve uses, where a panel can read more than one key.
KEY_LABELS = {
    "gtpo/mean_entropy": "mean over completions of ⟨H⟩_i (nats)",
    "entropy": "token-mean entropy (nats, TRL)",
}


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def auto_window(n_steps: int) -> int:
    """Smoothing window: about an eighth of the run, between 1 and 50 steps."""
    return min(50, max(1, n_steps // 8))


def plot_runs(
    run_dirs: list[str | Path],
    out_dir: str | Path,
    labels: list[str] | None = None,
    smooth: int | None = None,
) -> list[Path]:
    """Write the PNG figures for ``run_dirs`` into ``out_dir``; return the paths written.

    ``labels``: one legend entry per run (default: the folder names). ``smooth``: moving-average window
    in steps (default :func:`auto_window`; 1 draws the raw values only). A panel no run logged is left
    out of the per-metric files and marked "not logged" on the overview.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise InvalidInput("give at least one run folder")
    labels = list(labels) if labels else [d.resolve().name for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise InvalidInput(f"{len(labels)} labels for {len(run_dirs)} runs: give one label per run folder")
    if smooth is not None and smooth < 1:
        raise InvalidInput(f"smooth must be a window of at least 1 step, got {smooth}")
    runs = [(label, read_metrics(d)) for label, d in zip(labels, run_dirs, strict=False)]
    for run_dir, (_, rows) in zip(run_dirs, runs, strict=False):
        if not rows:
            raise InvalidInput(f"{run_dir}: its metrics.jsonl has no logged step yet; plot it once a step is logged")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidInput(f"output folder {out_dir} is a file: give a folder for the figures (-o)")
    out_dir.mkdir(parents=True, exist_ok=True)

    written = []
    # The overview leaves out the KL panel unless some run logged KL (GTPO never does).
    shown = [p for p in PANELS if p.name != "kl" or any(p.key_for(rows) for _, rows in runs)]
    columns = 3 if len(shown) <= 6 else 4
    overview, axes = plt.subplots(2, columns, figsize=(5 * columns, 8), constrained_layout=True, squeeze=False)
    for ax in axes.flat[len(shown) :]:
        ax.set_visible(False)
    for panel, ax in zip(shown, axes.flat, strict=False):
        if not _draw(ax, panel, runs, smooth):
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    overview.suptitle("Training curves")
    path = out_dir / "training_curves.png"
    overview.savefig(path, dpi=110)
    plt.close(overview)
    written.append(path)

    for panel in PANELS:
        fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
        if _draw(ax, panel, runs, smooth):
            path = out_dir / f"{panel.name}.png"
            fig.savefig(path, dpi=110)
            written.append(path)
        else:
            logger.debug("no run logged %s; %s.png not written", panel.title.lower(), panel.name)
        plt.close(fig)
    return written


def panel_keys(panel: Panel, runs: list[tuple[str, list[dict]]]) -> list[str | None]:
    """The key each run's curve reads. A key every run logged wins, so that runs are compared on one
    definition (e.g. TRL's token-mean ``entropy`` when a GRPO run has no ``gtpo/mean_entropy``)."""
    present = [{k for row in rows for k in row} for _, rows in runs]
    for key in panel.keys:
        if all(key in keys for keys in present):
            return [key] * len(runs)
    return [panel.key_for(rows) for _, rows in runs]


def _draw(ax, panel: Panel, runs: list[tuple[str, list[dict]]], smooth: int | None) -> bool:
    """Draw one panel's curves on ``ax``; False when no run has the metric."""
    drawn, top = False, 0.0
    keys = panel_keys(panel, runs)
    for index, ((label, rows), key) in enumerate(zip(runs, keys, strict=False)):
        if key is None:
            continue
        if panel.needs_signal:
            rows = [row for row in rows if row.get(NO_SIGNAL_KEY) != 1]
        steps, values = series(rows, key)
        if not steps:
            continue
        values = [v * panel.scale for v in values]
        top = max(top, max(values))
        color = f"C{index}"
        window = smooth or auto_window(len(values))
        if window > 1:
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
            ax.plot(steps, moving_average(values, window), color=color, linewidth=2, label=label)
        else:
            ax.plot(steps, values, color=color, linewidth=1.5, marker="." if len(steps) < 30 else None, label=label)
        drawn = True
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    used = sorted({k for k in keys if k is not None})
    ax.set_ylabel(panel.ylabel if len(used) != 1 or used[0] not in KEY_LABELS else KEY_LABELS[used[0]])
    ax.grid(True, alpha=0.3)
    if drawn:
        if panel.from_zero:
            top = top * 1.05 if top > 0 else 1.0
            ax.set_ylim(bottom=-0.02 * top, top=top)  # a curve at 0 stays visible above the axis
        if panel.hline:
            value, text = panel.hline
            ax.axhline(value, color="gray", linestyle="--", linewidth=1, label=text)
        ax.legend(fontsize=8)
    return drawn
