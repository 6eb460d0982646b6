"""Collapse early warning: a ``TrainerCallback`` that watches the logged metrics of a GRPO-family run.

The paper (Sec. 4.2, Fig. 1 and Fig. 4) shows policy collapse arriving in a fixed order: the mean
completion entropy rises past ln 2 first, then the format reward breaks, then accuracy. KL reacts only
after the fact. :class:`CollapseWarningCallback` reads only the ``logs`` dict of ``on_log``, so it works
with TRL's ``GRPOTrainer`` and with ``GTPOTrainer`` alike, and warns once when the smoothed entropy has
risen past ln 2 (or, under GTPO, when the entropy filter is dropping most completions), or, as a late
backstop, when the smoothed format reward has fallen well below its best.

>>> from gtpo.trainer.callbacks import CollapseWarningCallback
>>> trainer.add_callback(CollapseWarningCallback(action="warn"))  # doctest: +SKIP

The rule, its thresholds and how early it warned on recorded runs: docs/inspect.md; the ``monitor/*``
keys it adds to the logs: docs/metrics.md.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from transformers import TrainerCallback

from gtpo.core.paper import LN2

logger = logging.getLogger(__name__)

ACTIONS = ("off", "warn", "save", "stop")

# Where each watched signal is read from, first key present wins. TRL's `entropy` is the token-weighted
# mean completion entropy; GTPO's own per-completion mean is the fallback (docs/metrics.md).
ENTROPY_KEYS = ("entropy", "gtpo/mean_entropy")
FILTERED_KEY = "gtpo/filtered_frac"
DEFAULT_FORMAT_KEY = "rewards/format_reward/mean"


@dataclass
class CollapseRule:
    """Thresholds of the collapse rule (docs/inspect.md).

    An exponential moving average with weight ``alpha`` smooths each signal: s_t = α·x_t + (1−α)·s_{t−1}.
    The entropy signal fires when the smoothed entropy is above ``entropy_threshold`` (ln 2, the paper's
    Eq. 6 constant) AND has risen at least ``entropy_rise`` nats above its lowest smoothed value so far
    (a model that starts above ln 2, like Qwen 2.5 in the paper, is not flagged for being itself), for
    ``patience`` consecutive logs. The filter signal fires when the smoothed fraction of completions
    dropped by GTPO's entropy filter is at least ``filtered_threshold`` for ``patience`` logs. The format
    signal is a backstop, not an early warning: it fires when the smoothed format reward has fallen more
    than ``format_drop`` (a fraction) below its best smoothed value, best > 0, for ``patience`` logs. On
    our recorded runs a too-high learning rate collapsed the output towards zero entropy, which the entropy
    signal cannot see (docs/inspect.md, "Measured"), and ``save``/``stop`` should still act on that.
    """

    alpha: float = 0.3
    entropy_threshold: float = LN2
    entropy_rise: float = 0.2
    filtered_threshold: float = 0.5
    format_drop: float = 0.3
    patience: int = 2
    warmup: int = 0  # logs ignored at the start (the first steps of a run are noisy)

    def __post_init__(self):
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"CollapseRule: alpha must be in (0, 1], got {self.alpha}")
        if self.patience < 1:
            raise ValueError(f"CollapseRule: patience must be >= 1, got {self.patience}")


def _ema(previous: float | None, value: float, alpha: float) -> float:
    return value if previous is None else alpha * value + (1.0 - alpha) * previous


def _number(logs: dict, key: str) -> float | None:
    value = logs.get(key)
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass
class CollapseMonitor:
    """The rule's state over a sequence of logged rows; no trainer needed (tests and scripts replay rows).

    ``update(row)`` returns the ``monitor/*`` metrics for that row, and sets ``fired`` (with ``reasons``
    and ``fired_step``) the first time the rule fires.
    """

    rule: CollapseRule = field(default_factory=CollapseRule)
    format_key: str = DEFAULT_FORMAT_KEY
    entropy: float | None = None
    entropy_floor: float | None = None
    filtered: float | None = None
    format: float | None = None
    format_best: float | None = None
    streak_entropy: int = 0
    streak_filtered: int = 0
    streak_format: int = 0
    seen: int = 0
    fired: bool = False
    fired_step: int | None = None
    reasons: list[str] = field(default_factory=list)

    def update(self, row: dict, step: int | None = None) -> dict:
        rule = self.rule
        entropy = next((v for v in (_number(row, k) for k in ENTROPY_KEYS) if v is not None), None)
        filtered = _number(row, FILTERED_KEY)
        fmt = _number(row, self.format_key)
        if entropy is None and filtered is None and fmt is None:
            return {}  # an eval or end-of-training dict: nothing to watch
        self.seen += 1
        out: dict[str, float] = {}
        if entropy is not None:
            self.entropy = _ema(self.entropy, entropy, rule.alpha)
            self.entropy_floor = self.entropy if self.entropy_floor is None else min(self.entropy_floor, self.entropy)
            rise = self.entropy - self.entropy_floor
            high = self.entropy > rule.entropy_threshold and rise >= rule.entropy_rise
            self.streak_entropy = self.streak_entropy + 1 if high else 0
            out |= {"monitor/entropy_ema": self.entropy, "monitor/entropy_rise": rise}
        if filtered is not None:
            self.filtered = _ema(self.filtered, filtered, rule.alpha)
            self.streak_filtered = self.streak_filtered + 1 if self.filtered >= rule.filtered_threshold else 0
            out["monitor/filtered_frac_ema"] = self.filtered
        if fmt is not None:
            self.format = _ema(self.format, fmt, rule.alpha)
            self.format_best = self.format if self.format_best is None else max(self.format_best, self.format)
            fell = self.format_best > 0 and self.format_best - self.format > rule.format_drop * self.format_best
            self.streak_format = self.streak_format + 1 if fell else 0
            out |= {"monitor/format_ema": self.format, "monitor/format_drop": self.format_best - self.format}
        if not self.fired and self.seen > rule.warmup:
            reasons = []
            if self.streak_entropy >= rule.patience:
                reasons.append(
                    f"the smoothed completion entropy is {self.entropy:.3f} nats, above ln 2 = {LN2:.3f} and "
                    f"{self.entropy - self.entropy_floor:.3f} above its lowest ({self.entropy_floor:.3f}), "
                    f"for {self.streak_entropy} logs"
                )
            if self.streak_filtered >= rule.patience:
                reasons.append(
                    f"the entropy filter drops {100 * self.filtered:.0f}% of completions (smoothed), "
                    f"for {self.streak_filtered} logs"
                )
            if self.streak_format >= rule.patience:
                reasons.append(
                    f"the smoothed format reward ({self.format_key}) has fallen to {self.format:.3f}, more than "
                    f"{100 * rule.format_drop:.0f}% below its best {self.format_best:.3f}, for {self.streak_format} "
                    "logs (the collapse has started; the entropy signal did not fire first)"
                )
            if reasons:
                self.fired, self.fired_step, self.reasons = True, step, reasons
        out["monitor/collapse_warning"] = float(self.fired)
        return out

    def message(self) -> str:
        """The warning: what was seen, what the format reward did, and what to try."""
        seen = "; ".join(self.reasons)
        fmt = ""
        if self.format is not None and self.format_best is not None:
            fmt = f" The format reward ({self.format_key}) is {self.format:.3f} smoothed, best {self.format_best:.3f}."
        return (
            f"possible policy collapse at step {self.fired_step}: {seen}.{fmt} In the paper (Sec. 4.2) entropy "
            "rising past ln 2 comes before the format reward breaks. To try: lower the learning rate; with "
            "GTPO, keep the entropy filter on (entropy_filter auto/always, entropy_threshold ln 2) and raise "
            "entropy_gamma (γ, default 0.1); with GRPO, switch to algorithm gtpo or add the entropy terms."
        )


class CollapseWarningCallback(TrainerCallback):
    """Warn once (and optionally save or stop) when the logged metrics show the start of a policy collapse.

    Reads only ``logs`` in ``on_log``: TRL's ``entropy`` (or ``gtpo/mean_entropy``), the reward named by
    ``format_key`` and, under GTPO, ``gtpo/filtered_frac``. Adds ``monitor/*`` metrics to the same dict,
    so callbacks after it (and the trackers, when it is first in the list: :meth:`attach`) log them.

    ``action``: ``"warn"`` logs a warning; ``"save"`` also sets ``control.should_save`` (a checkpoint
    from before the collapse); ``"stop"`` also sets ``control.should_training_stop``; ``"off"`` does
    nothing at all.
    """

    def __init__(self, action: str = "warn", format_key: str = DEFAULT_FORMAT_KEY, rule: CollapseRule | None = None):
        if isinstance(action, bool):  # YAML reads an unquoted `collapse_warning: off` as False
            action = "warn" if action else "off"
        if action not in ACTIONS:
            raise ValueError(f"collapse_warning must be one of {', '.join(ACTIONS)}, got {action!r}")
        self.action = action
        self.monitor = CollapseMonitor(rule=rule or CollapseRule(), format_key=format_key)

    def attach(self, trainer) -> CollapseWarningCallback:
        """Put this callback first in ``trainer``'s list, so every logger (trackers too) sees ``monitor/*``."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:  # passed in callbacks= as well: move it, never run it twice
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.action == "off" or not logs:
            return
        was_fired = self.monitor.fired
        logs.update(self.monitor.update(logs, step=state.global_step))
        if self.monitor.fired and not was_fired:
            if state.is_world_process_zero:
                logger.warning("%s", self.monitor.message())
            if self.action == "save":
                control.should_save = True
            elif self.action == "stop":
                control.should_save = True  # keep the last pre-collapse weights
                control.should_training_stop = True
