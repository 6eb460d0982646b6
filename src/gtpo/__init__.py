"""GTPO: Group-relative Trajectory-based Policy Optimization (arXiv 2508.03772) on Hugging Face TRL.

`from gtpo import GTPOTrainer, GTPOConfig` is the one-line swap from TRL's GRPOTrainer/GRPOConfig.
The trainer classes are imported lazily so that `import gtpo.core` stays light (no TRL import).
"""

from gtpo.lazy import lazy_getattr
from gtpo.version import __version__

_LAZY = {"GTPOTrainer": "gtpo.trainer.trainer", "GTPOConfig": "gtpo.trainer.config"}


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["GTPOConfig", "GTPOTrainer", "__version__"]
