"""The trainer: GTPOConfig and GTPOTrainer on TRL's GRPOTrainer, ⟨H⟩_ini, the temperature-1 entropy, the collapse
callback, recipes, policy training and the SFT baseline.

Names load lazily (TRL is heavy), so `gtpo.trainer.recipe` and friends stay cheap to import.
"""

from gtpo.lazy import lazy_getattr

_LAZY = {
    "GTPOConfig": "gtpo.trainer.config",
    "GTPOTrainer": "gtpo.trainer.trainer",
    "CollapseWarningCallback": "gtpo.trainer.callbacks",
    "read_recipe": "gtpo.trainer.recipe",
    "train_policy": "gtpo.trainer.policy",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
__all__ = sorted(_LAZY)
