"""The no-progress warning and the signal-loss line (`gtpo.trainer.callbacks.ProgressMonitor`): hand-made rows replayed
through the callback as a trainer would, their smoothing recomputed by hand, and the rule's figures on study G's runs
(the runs it was set on) recomputed from their metrics.jsonl.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_callbacks import replay  # noqa: E402

from gtpo.trainer.callbacks import ACCURACY_KEY, ZERO_STD_KEY, CollapseWarningCallback, ProgressMonitor  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _ema(values, alpha=0.3):
    out, ema = [], None
    for x in values:
        ema = x if ema is None else alpha * x + (1 - alpha) * ema
        out.append(ema)
    return out


def test_no_progress_turns_on_from_step_15_after_three_flat_logs_and_clears_when_accuracy_rises(caplog):
    accuracy = [0.0] * 22 + [10.0] * 3  # flat at 0, then every completion right
    rows = [{ACCURACY_KEY: a, "loss": 0.1} for a in accuracy]
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.callbacks"):
        _, logged = replay(CollapseWarningCallback(action="warn"), rows)
    flags = [row["monitor/no_progress"] for row in logged]
    # Held from step 15 (ema 0 <= 0.6), on at step 17 (patience 3); at step 23 the ema is 3.0: off.
    assert flags == [0.0] * 16 + [1.0] * 6 + [0.0] * 3
    assert [row["monitor/accuracy_ema"] for row in logged] == pytest.approx(_ema(accuracy))
    # The line names what to try; not the common-prefix option, which did not prevent the lock-in in its screen.
    assert caplog.text.count("no progress at step 17") == 1 and "To try: algorithm grpo" in caplog.text
    assert "conflict_exclude_common_prefix" not in caplog.text


def test_signal_loss_is_the_mean_share_of_equal_reward_groups_over_the_last_ten_logs(caplog):
    zero_std = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # one group a step
    rows = [{ZERO_STD_KEY: z, "loss": 0.1} for z in zero_std]
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.callbacks"):
        _, logged = replay(CollapseWarningCallback(action="warn"), rows)
    # By hand: steps 1-10 hold 8 ones (on at step 10, a full window); 2-11 hold 9; 3-12 hold 8; 4-13 hold 7 (off).
    assert [row["monitor/signal_loss"] for row in logged] == [0.0] * 9 + [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [row["monitor/zero_std_mean"] for row in logged][9:12] == pytest.approx([0.8, 0.9, 0.8])
    assert caplog.text.count("little signal left at step 10") == 1 and "80% of groups" in caplog.text
    assert "monitor/no_progress" not in logged[0]  # no accuracy key: no no-progress line


def test_rows_without_the_inputs_change_nothing_and_off_adds_nothing():
    monitor = ProgressMonitor()
    assert monitor.update({"eval_loss": 1.0}, step=30) == {}
    _, logged = replay(CollapseWarningCallback(action="off"), [{ACCURACY_KEY: 0.0, ZERO_STD_KEY: 1.0}] * 25)
    assert not any(key.startswith("monitor/") for row in logged for key in row)


def _steps(run: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows if "loss" in row}


def _held_out(run: Path) -> float:
    return 100 * json.loads((run / "eval" / "two-step" / "results.json").read_text())["pass@k"]["1"]


def test_the_rule_on_study_g_the_runs_it_was_set_on():
    # The rule's docstring: on G's 40 runs it turns on at all 7 runs whose held-out pass@1 ended below 11 %, at steps
    # 17-25, and at 3 of the other 33, all GRPO. Recomputed by replaying each committed metrics.jsonl.
    runs = sorted((ROOT / "studies" / "smollm2-two-step-g" / "runs").glob("*/seed*"))
    assert len(runs) == 40
    fired_low, fired_other, low, steps = [], [], [], []
    for run in runs:
        monitor = ProgressMonitor()
        for step, row in sorted(_steps(run).items()):
            monitor.update(row, step)
        failed = _held_out(run) < 11
        low += [run] if failed else []
        if monitor.fired_step["no_progress"] is not None:
            (fired_low if failed else fired_other).append(f"{run.parent.name}/{run.name}")
            steps += [monitor.fired_step["no_progress"]] if failed else []
    assert len(low) == 7 and len(fired_low) == 7 and (min(steps), max(steps)) == (17, 25)
    assert sorted(fired_other) == ["grpo/seed402", "grpo/seed403", "grpo/seed410"]
