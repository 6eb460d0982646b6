"""`gtpo plot`: training-curve figures from one or more run folders."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gtpo.cli.arguments import RecipeParser

DESCRIPTION = (
    "Training-curve PNGs (accuracy and format reward in %, total reward, mean completion entropy, conflict token "
    "fraction, filtered fraction, against step) from the metrics.jsonl of one or more run folders, several runs on "
    "one figure (paper Figures 1, 2 top, 4, 5)."
)


@dataclass
class PlotArguments:
    """`gtpo plot`'s arguments."""

    run_dirs: list[str] = field(
        default_factory=list, metadata={"help": "run folders written by `gtpo train`; also given positionally"}
    )
    output_dir: str | None = field(
        default=None,
        metadata={
            "aliases": ["-o"],
            "help": "where the PNGs go (default: RUN_DIR/figures for one run, ./figures for several)",
        },
    )
    labels: list[str] | None = field(
        default=None, metadata={"help": "legend names, one per RUN_DIR (default: folder names)"}
    )
    smooth: int | None = field(
        default=None,
        metadata={"help": "moving-average window in steps (default: about 1/8 of the run, at most 50; 1 = raw)"},
    )


def plot_parser() -> RecipeParser:
    return RecipeParser(
        (PlotArguments,),
        prog="gtpo plot",
        description=DESCRIPTION,
        usage="gtpo plot RUN_DIR [RUN_DIR ...] [--labels NAME ...] [--output_dir DIR] [--smooth N]",
        epilog="Every flag with an underscore is also spelled with hyphens.",
        positional=("run_dirs", "RUN_DIR", "run folders written by `gtpo train`"),
    )


def parse_plot_args(argv: list[str]) -> PlotArguments:
    """`gtpo plot`'s command line as :class:`PlotArguments`; nothing is run."""
    from gtpo.errors import UsageError

    (args,), _ = plot_parser().parse(argv)
    if not args.run_dirs:
        raise UsageError("gtpo plot: give at least one run folder (see `gtpo plot --help`)")
    return args


def run_plot(argv: list[str]) -> int:
    from gtpo.runs.plots import plot_runs

    args = parse_plot_args(argv)
    output = args.output_dir or (Path(args.run_dirs[0]) / "figures" if len(args.run_dirs) == 1 else "figures")
    for path in plot_runs(args.run_dirs, output, labels=args.labels, smooth=args.smooth):
        print(path)
    return 0
