"""`gtpo plot`: training-curve figures from one or more run folders."""

from __future__ import annotations

import argparse
from pathlib import Path


def _plot_argparser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gtpo plot",
        description="Training-curve PNGs (accuracy and format reward in %, total reward, mean completion entropy, "
        "conflict token fraction, filtered fraction, against step) from the metrics.jsonl of one or more run "
        "folders, several runs on one figure (paper Figures 1, 2 top, 4, 5).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders written by `gtpo train`")
    parser.add_argument(
        "-o",
        "--output-dir",
        default=None,
        help="where the PNGs go (default: RUN_DIR/figures for one run, ./figures for several)",
    )
    parser.add_argument(
        "--labels", nargs="+", default=None, help="legend names, one per RUN_DIR (default: folder names)"
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=None,
        help="moving-average window in steps (default: about 1/8 of the run, at most 50; 1 = raw)",
    )
    return parser


def run_plot(argv: list[str]) -> int:
    from gtpo.runs.plots import plot_runs

    args = _plot_argparser().parse_args(argv)
    output = args.output_dir or (Path(args.run_dirs[0]) / "figures" if len(args.run_dirs) == 1 else "figures")
    for path in plot_runs(args.run_dirs, output, labels=args.labels, smooth=args.smooth):
        print(path)
    return 0
