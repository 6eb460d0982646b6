"""Run folders: one training run per folder (run.json, metrics.jsonl, checkpoints, model/), its metrics log, its
resume, and its training-curve figures (`gtpo plot`).

Names load lazily: `gtpo.runs.metrics_log` needs transformers and `gtpo.runs.plots` matplotlib.
"""

from gtpo.lazy import lazy_getattr

_LAZY = {
    "read_jsonl": "gtpo.runs.jsonl",
    "utc_timestamp": "gtpo.runs.folder",
    "run_status": "gtpo.runs.folder",
    "latest_checkpoint": "gtpo.runs.folder",
    "read_record": "gtpo.runs.folder",
    "MetricsLogger": "gtpo.runs.metrics_log",
    "read_metrics": "gtpo.runs.metrics_log",
    "series": "gtpo.runs.metrics_log",
    "PANELS": "gtpo.runs.plots",
    "plot_runs": "gtpo.runs.plots",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
__all__ = sorted(_LAZY)
