"""Studies: several arms (recipes, or variants of one) over several seeds, each an ordinary `gtpo train` run,
aggregated into per-arm means with 95% intervals, paired differences, stability counts and band figures."""

from gtpo.compare.stats import Interval, band, mean_interval, paired_difference
from gtpo.compare.study import EVAL_DEFAULTS, Arm, Spec, plan, run_all, run_dir

__all__ = [
    "EVAL_DEFAULTS",
    "Arm",
    "Interval",
    "Spec",
    "band",
    "mean_interval",
    "paired_difference",
    "plan",
    "run_all",
    "run_dir",
]
