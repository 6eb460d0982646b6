"""The trainer: GTPOConfig and GTPOTrainer on TRL's GRPOTrainer, ⟨H⟩_ini, the temperature-1 entropy, the collapse
callback, recipes, policy training and the SFT baseline.

Names load lazily (TRL is heavy), so `gtpo.trainer.recipe` and friends stay cheap to import.
"""

import importlib

_LAZY = {
    "GTPOConfig": "gtpo.trainer.config",
    "GTPOTrainer": "gtpo.trainer.trainer",
    "CollapseWarningCallback": "gtpo.trainer.callbacks",
    "read_recipe": "gtpo.trainer.recipe",
    "train_policy": "gtpo.trainer.policy",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gtpo.trainer' has no attribute {name!r}")


__all__ = sorted(_LAZY)
