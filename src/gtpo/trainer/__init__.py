"""The trainer: GTPOConfig and GTPOTrainer on TRL's GRPOTrainer, ⟨H⟩_ini, the collapse callback, policy training and
the SFT baseline; the forward its hooks score with (the fused head, the temperature-1 entropy, the packed layout) is
`gtpo.forward`'s.

Names load lazily (TRL is heavy). `read_recipe` lives with its reader, the command line (`gtpo.cli.recipe`); its
public name here is kept for code that imported it from the trainer (loaded lazily, so the trainer imports no cli).
"""

from gtpo.lazy import lazy_getattr

_LAZY = {
    "GTPOConfig": "gtpo.trainer.config",
    "GTPOTrainer": "gtpo.trainer.trainer",
    "CollapseWarningCallback": "gtpo.trainer.callbacks",
    "read_recipe": "gtpo.cli.recipe",
    "train_policy": "gtpo.trainer.policy",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
__all__ = sorted(_LAZY)
