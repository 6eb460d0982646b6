"""Collapse early warning: a ``TrainerCallback`` that watches the logged metrics of a GRPO-family run.

:class:`CollapseWarningCallback` reads only the ``logs`` dict of ``on_log``, so it works with TRL's ``GRPOTrainer``
and with ``GTPOTrainer`` alike. It warns when the completions run to the length limit (the runaway of the project's
studies B, C and F), when no completion earns the full format for several steps (the partial-format stall of
studies C and E), or, as a late backstop, when the smoothed format reward has fallen well below its best; the flag
``monitor/collapse_warning`` is 1 while one of these holds and 0 again when none does. The paper's entropy signal
(Sec. 4.2: entropy rises past ln 2 before the format breaks) and the entropy filter's share are available and off
by default: replayed on the committed runs they added false alarms and no warning in time.

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
CLIPPED_KEY = "completions/clipped_ratio"  # TRL: share of the step's completions cut at max_completion_length
DEFAULT_FORMAT_KEY = "rewards/format_reward/mean"

# Every signal the rule knows, and the ones it watches by default. The entropy signal (the paper's Sec. 4.2 order)
# and the filter signal are off by default: replayed on the committed runs (studies/tools/collapse_warning_table.py)
# they warned in time on no failed run that the length and stall signals missed, and added false alarms (the entropy
# signal's included the offline default run's at step 3). docs/inspect.md, "Measured".
SIGNALS = ("length", "stall", "format", "filtered", "entropy")
DEFAULT_SIGNALS = ("length", "stall", "format")


@dataclass
class CollapseRule:
    """Thresholds of the collapse rule (docs/inspect.md, "The rule").

    Each signal is a condition checked at every log; it is *on* once it has held for its patience in logs in a
    row, and off again at the first log where it does not hold. The warning (``monitor/collapse_warning``) is on
    while any watched signal is on. An exponential moving average with weight ``alpha`` smooths the length,
    filter, format and entropy inputs: s_t = α·x_t + (1−α)·s_{t−1}.

    - ``length``: the smoothed share of completions cut at the length limit (TRL's ``completions/clipped_ratio``)
      is at least ``clipped_threshold``, for ``patience`` logs: the runaway of studies B, C and F.
    - ``stall``: no completion of the step earned more than ``stall_format`` (the format reward's step mean is at
      most it: with the 0/1/10 format reward and G completions, one full-format completion makes the mean at
      least 10/G > 1), for ``stall_patience`` logs: the partial-format stall of studies C and E.
    - ``filtered``: the smoothed fraction of completions dropped by GTPO's entropy filter is at least
      ``filtered_threshold``, for ``patience`` logs.
    - ``format``: the smoothed format reward is more than ``format_drop`` (a fraction) below its best smoothed
      value (best > 0), for ``patience`` logs: a backstop, the collapse has started.
    - ``entropy`` (not watched by default): the smoothed entropy is above ``entropy_threshold`` (ln 2, the
      paper's Eq. 6 constant) and at least ``entropy_rise`` nats above its lowest smoothed value so far, for
      ``patience`` logs.

    ``signals`` names the watched ones; ``warmup`` logs at the start never turn the warning on (their values
    still enter the averages).
    """

    alpha: float = 0.3
    patience: int = 2
    signals: tuple[str, ...] = DEFAULT_SIGNALS
    clipped_threshold: float = 0.5
    stall_format: float = 1.0
    stall_patience: int = 6
    filtered_threshold: float = 0.5
    format_drop: float = 0.3
    entropy_threshold: float = LN2
    entropy_rise: float = 0.2
    warmup: int = 0

    def __post_init__(self):
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"CollapseRule: alpha must be in (0, 1], got {self.alpha}")
        if self.patience < 1 or self.stall_patience < 1:
            raise ValueError(
                f"CollapseRule: patience must be >= 1, got patience={self.patience}, "
                f"stall_patience={self.stall_patience}"
            )
        unknown = [s for s in self.signals if s not in SIGNALS]
        if unknown:
            raise ValueError(f"CollapseRule: unknown signal(s) {unknown}; choose from {', '.join(SIGNALS)}")
        self.signals = tuple(self.signals)

    def patience_of(self, signal: str) -> int:
        """Logs in a row the signal's condition must hold before it is on."""
        return self.stall_patience if signal == "stall" else self.patience


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

    ``update(row, step)`` returns the ``monitor/*`` metrics for that row. ``active`` is whether the warning is on
    now (``reasons`` says why); ``episodes`` lists each stretch it was on as ``[first step, first step off]``
    (``None`` while still on); ``fired`` and ``fired_step`` keep whether and where it first turned on.
    """

    rule: CollapseRule = field(default_factory=CollapseRule)
    format_key: str = DEFAULT_FORMAT_KEY
    entropy: float | None = None
    entropy_floor: float | None = None
    filtered: float | None = None
    clipped: float | None = None
    format: float | None = None
    format_best: float | None = None
    streaks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIGNALS, 0))
    seen: int = 0
    active: bool = False
    fired: bool = False
    fired_step: int | None = None
    reasons: list[str] = field(default_factory=list)
    episodes: list[list[int | None]] = field(default_factory=list)

    def _conditions(self, row: dict) -> tuple[dict[str, bool | None], dict[str, float]]:
        """Update the averages from one row; each signal's condition at this row (None: its input is absent) and
        the ``monitor/*`` values."""
        rule, out = self.rule, {}
        held: dict[str, bool | None] = dict.fromkeys(SIGNALS)
        entropy = next((v for v in (_number(row, k) for k in ENTROPY_KEYS) if v is not None), None)
        if entropy is not None:
            self.entropy = _ema(self.entropy, entropy, rule.alpha)
            self.entropy_floor = self.entropy if self.entropy_floor is None else min(self.entropy_floor, self.entropy)
            rise = self.entropy - self.entropy_floor
            held["entropy"] = self.entropy > rule.entropy_threshold and rise >= rule.entropy_rise
            out |= {"monitor/entropy_ema": self.entropy, "monitor/entropy_rise": rise}
        filtered = _number(row, FILTERED_KEY)
        if filtered is not None:
            self.filtered = _ema(self.filtered, filtered, rule.alpha)
            held["filtered"] = self.filtered >= rule.filtered_threshold
            out["monitor/filtered_frac_ema"] = self.filtered
        clipped = _number(row, CLIPPED_KEY)
        if clipped is not None:
            self.clipped = _ema(self.clipped, clipped, rule.alpha)
            held["length"] = self.clipped >= rule.clipped_threshold
            out["monitor/clipped_ema"] = self.clipped
        fmt = _number(row, self.format_key)
        if fmt is not None:
            self.format = _ema(self.format, fmt, rule.alpha)
            self.format_best = self.format if self.format_best is None else max(self.format_best, self.format)
            drop = self.format_best - self.format
            held["format"] = self.format_best > 0 and drop > rule.format_drop * self.format_best
            held["stall"] = fmt <= rule.stall_format  # the raw step mean: one full-format completion lifts it
            out |= {"monitor/format_ema": self.format, "monitor/format_drop": self.format_best - self.format}
        return held, out

    def _reason(self, signal: str) -> str:
        rule, streak = self.rule, self.streaks[signal]
        if signal == "length":
            return (
                f"{100 * self.clipped:.0f}% of completions run to the length limit (smoothed {CLIPPED_KEY}, at least "
                f"{100 * rule.clipped_threshold:.0f}% for {streak} logs): a runaway"
            )
        if signal == "stall":
            return (
                f"no completion earned more than {rule.stall_format:g} ({self.format_key}) for {streak} logs: "
                "the format is stuck at partial credit, a stall"
            )
        if signal == "filtered":
            return f"the entropy filter drops {100 * self.filtered:.0f}% of completions (smoothed), for {streak} logs"
        if signal == "format":
            return (
                f"the smoothed format reward ({self.format_key}) has fallen to {self.format:.3f}, more than "
                f"{100 * rule.format_drop:.0f}% below its best {self.format_best:.3f}, for {streak} logs "
                "(the collapse has started)"
            )
        return (
            f"the smoothed completion entropy is {self.entropy:.3f} nats, above ln 2 = {LN2:.3f} and "
            f"{self.entropy - self.entropy_floor:.3f} above its lowest ({self.entropy_floor:.3f}), for {streak} logs"
        )

    def update(self, row: dict, step: int | None = None) -> dict:
        """Feed one logged row; returns its ``monitor/*`` metrics ({} for a row without any watched input)."""
        held, out = self._conditions(row)
        if not out:
            return {}  # an eval or end-of-training dict: nothing to watch
        self.seen += 1
        for signal, holds in held.items():
            if holds is not None:  # a missing input leaves the streak as it was
                self.streaks[signal] = self.streaks[signal] + 1 if holds else 0
        on = [s for s in self.rule.signals if self.streaks[s] >= self.rule.patience_of(s)]
        now = bool(on) and self.seen > self.rule.warmup
        if now and not self.active:  # it turns on: say what was seen then
            self.reasons = [self._reason(s) for s in on]
            self.episodes.append([step, None])
            if not self.fired:
                self.fired, self.fired_step = True, step
        elif self.active and not now:
            self.episodes[-1][1] = step
        self.active = now
        out["monitor/stall_streak"] = float(self.streaks["stall"])
        out["monitor/collapse_warning"] = float(self.active)
        return out

    def message(self, step: int | None = None) -> str:
        """The warning: what was seen at ``step`` (default: where it first turned on), and what to try."""
        seen = "; ".join(self.reasons)
        fmt = ""
        if self.format is not None and self.format_best is not None:
            fmt = f" The format reward ({self.format_key}) is {self.format:.3f} smoothed, best {self.format_best:.3f}."
        return (
            f"possible policy collapse at step {self.fired_step if step is None else step}: {seen}.{fmt} To try: "
            "lower the learning rate; for a stall under GTPO, conflict_guard true (docs/studies/"
            "stall-guard.md); with GTPO keep the entropy filter on and raise entropy_gamma (γ, default 0.1); "
            "with GRPO, switch to algorithm gtpo or add the entropy terms. The warning clears when the "
            "condition ends (docs/inspect.md)."
        )

    def cleared_message(self, step: int | None) -> str:
        """The line logged when the warning turns off again."""
        return f"collapse warning cleared at step {step}: no watched signal holds any more"


# Two lines beside the collapse rule, on their own flags (the collapse rule and its replayed table stay as they were).
ACCURACY_KEY = "rewards/accuracy_reward/mean"  # the project's accuracy reward: 0 or 10 per completion
ZERO_STD_KEY = "frac_reward_zero_std"  # TRL: share of the step's groups whose rewards are all equal (A = 0 throughout)


@dataclass
class ProgressRule:
    """Thresholds of the no-progress warning and the signal-loss line (docs/inspect.md, "No progress, no signal").

    - ``no_progress``: from step ``after`` on, the smoothed accuracy reward (``accuracy_key``, EMA weight ``alpha``) is
      at most ``floor``, for ``patience`` logs. Set on study G's 40 runs only (the accuracy reward is 0 or 10, so 0.6
      is 6 % of completions right; chosen over after 10-25, floor 0.3-1, patience 2-5): it turned on at all 7 runs
      whose held-out pass@1 ended below 11 % (GTPO's lock-in into the single-equation opening), at steps 17-25, and
      at 3 of the other 33, all GRPO (docs/studies/lockin.md). It sees the symptom, not the cause:
      `gtpo/push_against_group`, the cause's own measure, did not tell those runs apart.
    - ``signal_loss``: the share of groups with all-equal rewards (TRL's ``frac_reward_zero_std``), averaged over the
      last ``window`` logs, is at least ``zero_std``: A = 0 for most completions, little left to learn from. With one
      group a step (the offline default run) that is 8 of the last 10 steps.
    """

    alpha: float = 0.3
    after: int = 15
    floor: float = 0.6
    patience: int = 3
    zero_std: float = 0.8
    window: int = 10


@dataclass
class ProgressMonitor:
    """The no-progress and signal-loss state over logged rows (replayable without a trainer, as `CollapseMonitor`).

    ``update(row, step)`` returns ``monitor/accuracy_ema``, ``monitor/zero_std_mean``, ``monitor/no_progress`` and
    ``monitor/signal_loss`` (1 while on); ``turned_on`` lists the names that turned on at that row.
    """

    rule: ProgressRule = field(default_factory=ProgressRule)
    accuracy_key: str = ACCURACY_KEY
    accuracy: float | None = None
    zero_std: list[float] = field(default_factory=list)  # the last `window` values
    streaks: dict[str, int] = field(default_factory=lambda: {"no_progress": 0, "signal_loss": 0})
    on: dict[str, bool] = field(default_factory=lambda: {"no_progress": False, "signal_loss": False})
    fired_step: dict[str, int | None] = field(default_factory=lambda: {"no_progress": None, "signal_loss": None})
    turned_on: list[str] = field(default_factory=list)

    def update(self, row: dict, step: int | None = None) -> dict:
        rule, out, held = self.rule, {}, {}
        accuracy, zero_std = _number(row, self.accuracy_key), _number(row, ZERO_STD_KEY)
        if accuracy is not None:
            self.accuracy = _ema(self.accuracy, accuracy, rule.alpha)
            held["no_progress"] = step is not None and step >= rule.after and self.accuracy <= rule.floor
            out["monitor/accuracy_ema"] = self.accuracy
        if zero_std is not None:
            self.zero_std = [*self.zero_std, zero_std][-rule.window :]
            mean = sum(self.zero_std) / len(self.zero_std)
            held["signal_loss"] = len(self.zero_std) == rule.window and mean >= rule.zero_std
            out["monitor/zero_std_mean"] = mean
        self.turned_on = []
        for name, holds in held.items():
            self.streaks[name] = self.streaks[name] + 1 if holds else 0
            now = self.streaks[name] >= (rule.patience if name == "no_progress" else 1)
            if now and not self.on[name]:
                self.turned_on.append(name)
                self.fired_step[name] = step if self.fired_step[name] is None else self.fired_step[name]
            self.on[name] = now
            out[f"monitor/{name}"] = float(now)
        return out

    def message(self, name: str, step: int | None) -> str:
        """The line logged when ``name`` turns on."""
        if name == "signal_loss":
            return (
                f"little signal left at step {step}: over the last {len(self.zero_std)} logs "
                f"{100 * sum(self.zero_std) / len(self.zero_std):.0f}% of groups ({ZERO_STD_KEY}) had all-equal "
                "rewards, so their advantages are 0 and they teach nothing; the "
                "prompts are all solved or all failed at this temperature. To try: harder or easier prompts, more "
                "generations per prompt, a higher temperature, or stop here."
            )
        return (
            f"no progress at step {step}: the smoothed accuracy reward ({self.accuracy_key}) is {self.accuracy:.2f}, "
            f"at most {self.rule.floor:g} since step {self.rule.after}. Under GTPO this is how the studies' lock-in "
            "looked: the runs locked into one opening and stayed there (docs/studies/lockin.md). "
            "To try: algorithm grpo, which did not lock in at those seeds; entropy_filter never (Eq. 6 off), which "
            "took 5 of the 7 out of it in an exploratory screen; under GRPO, a lower learning rate."
        )


class CollapseWarningCallback(TrainerCallback):
    """Warn (and optionally save or stop) when the logged metrics show a run running away or stalling.

    Reads only ``logs`` in ``on_log``: ``completions/clipped_ratio``, the reward named by ``format_key`` and, when
    their signals are watched, TRL's ``entropy`` (or ``gtpo/mean_entropy``) and ``gtpo/filtered_frac``. Adds
    ``monitor/*`` metrics to the same dict, so callbacks after it (and the trackers, when it is first in the list:
    :meth:`attach`) log them.

    ``action``: ``"warn"`` logs a warning each time the flag turns on, and a line when it clears; ``"save"`` also
    sets ``control.should_save`` when it turns on (a checkpoint from before that stretch); ``"stop"`` also sets
    ``control.should_training_stop``; ``"off"`` does nothing at all.
    """

    def __init__(self, action: str = "warn", format_key: str = DEFAULT_FORMAT_KEY, rule: CollapseRule | None = None):
        if isinstance(action, bool):  # YAML reads an unquoted `collapse_warning: off` as False
            action = "warn" if action else "off"
        if action not in ACTIONS:
            raise ValueError(f"collapse_warning must be one of {', '.join(ACTIONS)}, got {action!r}")
        self.action = action
        self.monitor = CollapseMonitor(rule=rule or CollapseRule(), format_key=format_key)
        self.progress = ProgressMonitor()  # the no-progress warning and the signal-loss line: logged, never act

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
        was_active = self.monitor.active
        progress = self.progress.update(logs, step=state.global_step)
        logs.update(self.monitor.update(logs, step=state.global_step))
        logs.update(progress)  # {} for a row without its inputs (an eval or end-of-training dict)
        for name in self.progress.turned_on if state.is_world_process_zero else ():
            logger.warning("%s", self.progress.message(name, state.global_step))
        if self.monitor.active and not was_active:
            if state.is_world_process_zero:
                logger.warning("%s", self.monitor.message(state.global_step))
            if self.action == "save":
                control.should_save = True  # each time it turns on: the weights from before that stretch
            elif self.action == "stop":
                control.should_save = True  # keep the last pre-collapse weights
                control.should_training_stop = True
        elif was_active and not self.monitor.active and state.is_world_process_zero:
            logger.warning("%s", self.monitor.cleared_message(state.global_step))
