"""pass@k and maj@k against k for several models, from ``results.json`` files alone.

The layout follows the paper's Figure 2 (bottom): one row per task, one column per metric, one line per
model; Figure 3 (AIME, pass@k only) is ``metrics=("pass@k",)``. The x axis is log2(k), y is percent.

>>> plot_results(["out/eval/gtpo/gsm8k", "out/eval/grpo/gsm8k"], "pass_maj.png")  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from gtpo.errors import InvalidInput
from gtpo.eval.runner import RESULTS_FILE

METRICS = ("pass@k", "maj@k")


def find_results(paths: Sequence[str | Path]) -> list[Path]:
    """Results files from paths that are ``results.json`` files or folders holding them (searched
    recursively, sorted), in the order given."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            inside = sorted(path.rglob(RESULTS_FILE))
            if not inside:
                raise InvalidInput(f"no {RESULTS_FILE} under {path}; run `gtpo eval` first or give the file")
            found.extend(inside)
        else:
            raise InvalidInput(f"results path {raw!r} does not exist; give {RESULTS_FILE} files or their run folders")
    return found


def load_results(path: str | Path) -> dict:
    """One results file, checked for the fields the plots need."""
    path = Path(path)
    try:
        results = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as err:
        raise InvalidInput(
            f"{path}:{err.lineno}: not valid JSON ({err.msg}); re-run `gtpo eval` to rewrite it"
        ) from None
    except UnicodeDecodeError as err:
        raise InvalidInput(f"{path}: not UTF-8 text ({err.reason}); re-run `gtpo eval` to rewrite it") from None
    if not isinstance(results, dict):
        raise InvalidInput(f"{path} is not a gtpo eval results file: a JSON {type(results).__name__}, not an object")
    missing = [key for key in ("task", "ks", *METRICS) if key not in results]
    if missing:
        raise InvalidInput(f"{path} is not a gtpo eval results file: missing {missing}")
    return results


def plot_results(
    paths: Sequence[str | Path],
    output: str | Path,
    labels: Sequence[str] | None = None,
    metrics: Sequence[str] = METRICS,
    title: str | None = None,
) -> Path:
    """Draw pass@k / maj@k vs k, one line per results file, one row per task; save a PNG and return its path.

    labels: one per results file (after expanding folders); default each file's ``label`` (model name).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise InvalidInput(f"unknown metrics {unknown or list(metrics)}; valid: {list(METRICS)}")
    files = find_results(paths)
    if labels is not None and len(labels) != len(files):
        raise InvalidInput(f"got {len(labels)} labels for {len(files)} results files: {[str(f) for f in files]}")
    runs = [load_results(f) for f in files]
    names = (
        list(labels)
        if labels is not None
        else [r.get("label") or r.get("model", f.parent.name) for r, f in zip(runs, files, strict=False)]
    )
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(dict.fromkeys(names))}

    fig, axes = plt.subplots(
        len(tasks), len(metrics), figsize=(4.6 * len(metrics), 3.6 * len(tasks)), squeeze=False, constrained_layout=True
    )
    for row, task in enumerate(tasks):
        for col, metric in enumerate(metrics):
            ax = axes[row][col]
            all_ks: set[int] = set()
            for run, name in zip(runs, names, strict=False):
                if run["task"] != task:
                    continue
                ks = [int(k) for k in run["ks"]]
                values = [100.0 * run[metric][str(k)] for k in ks]
                all_ks.update(ks)
                ax.plot(ks, values, marker="o", markersize=3.5, linewidth=1.6, color=colors[name], label=name)
            ax.set_xscale("log", base=2)
            ticks = sorted(all_ks)
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(k) for k in ticks])
            ax.set_xlabel("k")
            ax.set_ylabel(f"{metric} (%)")
            split = next((r.get("split") for r in runs if r["task"] == task), None)
            ax.set_title(f"{task}{f' ({split})' if split else ''}: {metric}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    # matplotlib picks the format from the suffix and appends ".png" when there is none: name the file
    # ourselves, so the path returned (and printed) is the one written.
    output = Path(output)
    if not output.suffix:
        output = output.with_suffix(".png")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(output, dpi=150)
    except (OSError, ValueError) as err:
        raise InvalidInput(
            f"cannot write the figure to {output} (-o): {getattr(err, 'strerror', None) or err}"
        ) from None
    finally:
        plt.close(fig)
    return output
