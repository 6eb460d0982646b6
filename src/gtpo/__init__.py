"""GTPO: Group-relative Trajectory-based Policy Optimization (arXiv 2508.03772) on Hugging Face TRL.

`from gtpo import GTPOTrainer, GTPOConfig` is the one-line swap from TRL's GRPOTrainer/GRPOConfig.
The trainer classes are imported lazily so that `import gtpo.core` stays light (no TRL import).
"""

from gtpo.version import __version__

_LAZY = {"GTPOTrainer": "gtpo.trainer.trainer", "GTPOConfig": "gtpo.trainer.config"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gtpo' has no attribute {name!r}")


__all__ = ["GTPOConfig", "GTPOTrainer", "__version__"]
