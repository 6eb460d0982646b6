"""CollapseWarningCallback: hand-made metric sequences replayed through ``on_log`` as a trainer would."""

import logging
import math
from pathlib import Path

import pytest
from transformers import TrainerCallback as TrainerCallbackBase
from transformers import TrainerControl, TrainerState, TrainingArguments

from cli_helpers import load_script  # noqa: E402
from gtpo.trainer.callbacks import DEFAULT_SIGNALS, CollapseMonitor, CollapseRule, CollapseWarningCallback

FMT = "rewards/format_reward/mean"
CLIP = "completions/clipped_ratio"
# The paper's entropy signal with the format backstop: not watched by default (docs/inspect.md), still available.
PAPER_RULE = CollapseRule(signals=("entropy", "format"))


def replay(callback, rows):
    """Feed rows to on_log at steps 1..n; returns (control after each row, the logged dicts)."""
    state, args = TrainerState(), TrainingArguments(output_dir="unused", report_to="none")
    controls, logged = [], []
    for step, row in enumerate(rows, start=1):
        state.global_step = step
        control = TrainerControl()
        logs = dict(row)
        callback.on_log(args, state, control, logs=logs)
        controls.append(control)
        logged.append(logs)
    return controls, logged


def collapsing_run():
    """Entropy low, then rising past ln 2 from step 6; the format reward holds until step 10, then falls."""
    entropy = [0.45, 0.42, 0.40, 0.41, 0.43, 0.70, 0.95, 1.20, 1.40, 1.60, 1.80, 2.0, 2.1, 2.2]
    fmt = [10, 10, 10, 10, 10, 10, 10, 10, 9.5, 9, 6, 3, 1, 0]
    return [{"entropy": h, FMT: f, "loss": 0.1} for h, f in zip(entropy, fmt, strict=False)]


def healthy_run():
    """Entropy falling slowly with noise below ln 2 (one isolated spike), format reward steady."""
    entropy = [0.66, 0.44, 0.52, 1.10, 0.42, 0.50, 0.48, 0.44, 0.53, 0.43, 0.42, 0.40, 0.26, 0.21, 0.13, 0.10]
    return [{"entropy": h, FMT: 10.0 if i != 3 else 6.6} for i, h in enumerate(entropy)]


def format_fall_step(rows, drop=0.25, alpha=0.3):
    """Independent recomputation: first step whose smoothed format is `drop`·best below its best."""
    ema, best = None, None
    for step, row in enumerate(rows, start=1):
        ema = row[FMT] if ema is None else alpha * row[FMT] + (1 - alpha) * ema
        best = ema if best is None else max(best, ema)
        if best - ema > drop * best:
            return step
    return None


def test_rising_entropy_warns_before_the_format_reward_falls(caplog):
    rows = collapsing_run()
    callback = CollapseWarningCallback(action="warn", rule=PAPER_RULE)
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.callbacks"):
        controls, logged = replay(callback, rows)
    warned = [s for s, logs in enumerate(logged, start=1) if logs["monitor/collapse_warning"] == 1.0]
    fall = format_fall_step(rows)
    assert fall is not None and warned and warned[0] < fall
    # Hand EMA (α=0.3) of the entropy: 0.640 at step 7 (below ln 2), 0.808 at step 8 (rise 0.385 above the
    # floor 0.423), 0.986 at step 9: two logs in a row, so with patience 2 the warning is at step 9; the
    # smoothed format reward falls 25% below its best at step 12.
    assert warned[0] == 9 and fall == 12
    assert len([r for r in caplog.records if "possible policy collapse" in r.getMessage()]) == 1  # warns once
    message = caplog.records[0].getMessage()
    assert "ln 2" in message and "learning rate" in message and "entropy_gamma" in message
    assert not any(c.should_training_stop or c.should_save for c in controls)  # warn only


def test_entropy_ema_matches_a_plain_recomputation():
    rows = collapsing_run()
    _, logged = replay(CollapseWarningCallback(rule=PAPER_RULE), rows)
    ema = rows[0]["entropy"]
    for row, logs in zip(rows[1:], logged[1:], strict=False):
        ema = 0.3 * row["entropy"] + 0.7 * ema
        assert logs["monitor/entropy_ema"] == pytest.approx(ema)


@pytest.mark.parametrize("rule", [None, PAPER_RULE], ids=["shipped", "paper-entropy"])
def test_flat_healthy_run_never_warns(caplog, rule):
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.callbacks"):
        _, logged = replay(CollapseWarningCallback(rule=rule), healthy_run())
    assert all(logs["monitor/collapse_warning"] == 0.0 for logs in logged)
    assert not caplog.records


def test_model_that_starts_above_ln2_is_not_flagged_for_its_own_entropy():
    # Qwen-like: entropy ~1.0 from the start, flat: above ln 2 but never risen above its floor.
    rows = [{"entropy": 1.0 + 0.02 * math.sin(i), FMT: 10.0} for i in range(30)]
    _, logged = replay(CollapseWarningCallback(rule=PAPER_RULE), rows)
    assert not any(logs["monitor/collapse_warning"] for logs in logged)


def test_stop_action_stops_training_at_the_warning_step_and_saves():
    controls, logged = replay(CollapseWarningCallback(action="stop", rule=PAPER_RULE), collapsing_run())
    stopped = [s for s, c in enumerate(controls, start=1) if c.should_training_stop]
    assert stopped == [9]
    assert controls[8].should_save


def test_save_action_saves_once_without_stopping():
    controls, _ = replay(CollapseWarningCallback(action="save", rule=PAPER_RULE), collapsing_run())
    assert [s for s, c in enumerate(controls, start=1) if c.should_save] == [9]
    assert not any(c.should_training_stop for c in controls)


def test_off_action_adds_nothing_to_the_logs():
    controls, logged = replay(CollapseWarningCallback(action="off"), collapsing_run())
    assert all(not any(k.startswith("monitor/") for k in logs) for logs in logged)


def test_gtpo_filtered_fraction_alone_triggers_the_warning():
    # Entropy flat and low; the filter starts dropping most completions at step 4 (EMA ≥ 0.5 from step 5).
    frac = [0.0, 0.0, 0.0, 0.9, 0.9, 0.9, 0.9]
    rows = [{"entropy": 0.3, "gtpo/filtered_frac": f, FMT: 10.0} for f in frac]
    _, logged = replay(CollapseWarningCallback(rule=CollapseRule(signals=("filtered",))), rows)
    # EMA: 0, 0, 0, 0.27, 0.459, 0.5913, 0.68391 -> ≥0.5 at steps 6 and 7 -> patience 2 -> step 7.
    assert [s for s, row in enumerate(logged, 1) if row["monitor/collapse_warning"]][0] == 7
    assert logged[-1]["monitor/filtered_frac_ema"] == pytest.approx(0.68391)


def test_custom_format_key_is_read_and_rows_without_signals_are_left_alone():
    monitor = CollapseMonitor(format_key="rewards/my_format/mean")
    assert monitor.update({"eval_loss": 1.0}) == {}
    out = monitor.update({"rewards/my_format/mean": 4.0})
    assert out["monitor/format_ema"] == 4.0 and out["monitor/format_drop"] == 0.0


def test_bad_action_and_rule_are_one_line_errors():
    with pytest.raises(ValueError, match="collapse_warning must be one of off, warn, save, stop"):
        CollapseWarningCallback(action="panic")
    with pytest.raises(ValueError, match="patience must be >= 1"):
        CollapseRule(patience=0)
    with pytest.raises(ValueError, match="unknown signal.*choose from length, stall, format, filtered, entropy"):
        CollapseRule(signals=("length", "kl"))


def test_gtpo_train_reads_collapse_warning_from_recipe_and_flag(tmp_path):
    from gtpo.cli import arguments

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: smollm2\ncollapse_warning: off\n")  # YAML: False
    (script_args, _, _), _ = arguments.train_parser().parse(["--config", str(recipe)])
    assert CollapseWarningCallback(action=script_args.collapse_warning).action == "off"
    (script_args, _, _), _ = arguments.train_parser().parse(["--config", str(recipe), "--collapse_warning", "stop"])
    assert script_args.collapse_warning == "stop"
    (script_args, _, _), _ = arguments.train_parser().parse([], arguments.DEFAULT_TRAIN_RECIPE)
    assert script_args.collapse_warning == "warn"  # on by default, warning only


def test_gtpo_train_bad_collapse_warning_is_one_line(capsys):
    from gtpo import cli

    assert cli.main(["train", "--collapse_warning", "panic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gtpo: error: ") and "invalid choice: 'panic'" in err[-1] and "stop" in err[-1]


def _replay_script():
    return load_script("replay_collapse")


def test_replay_script_measures_lead_time_and_false_alarms(tmp_path, capsys):
    import json

    script = _replay_script()
    runs = {"collapse": collapsing_run(), "healthy": healthy_run()}
    for name, rows in runs.items():
        (tmp_path / name).mkdir()
        lines = [json.dumps({"step": s, **row}) for s, row in enumerate(rows, start=1)]
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    paper = ["--signals", "entropy", "format"]
    assert script.main([str(tmp_path / "collapse"), str(tmp_path / "healthy"), "--json", str(out), *paper]) == 0
    results = {Path(r["run"]).name: r for r in json.loads(out.read_text())}
    # The callback test's hand figures: warning at 9; fall 12 is the first of 3 steps 25% below the best.
    assert results["collapse"]["warning_step"] == 9 and results["collapse"]["fall_step"] == format_fall_step(
        runs["collapse"]
    )
    assert results["collapse"]["lead_steps"] == 3 and results["collapse"]["verdict"] == "early"
    assert results["healthy"]["verdict"] == "quiet"
    assert "false alarms: 0" in capsys.readouterr().out


def test_replay_script_bad_file_is_one_line_error(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    assert _replay_script().main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metrics.jsonl:2" in err[0]


@pytest.mark.parametrize("algorithm", ["trl-grpo", "gtpo"])
def test_stop_action_ends_a_real_trl_and_gtpo_run_and_trackers_see_monitor_keys(tmp_path, tiny_model_path, algorithm):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from trl import GRPOConfig, GRPOTrainer

    from gtpo import GTPOConfig, GTPOTrainer
    from trainer_helpers import FixedGeneration, make_dataset, table_reward

    class Collector(TrainerCallbackBase):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))

    base, config = (GRPOTrainer, GRPOConfig) if algorithm == "trl-grpo" else (GTPOTrainer, GTPOConfig)
    trainer_cls = type("Fixed", (FixedGeneration, base), {})
    extra = {} if algorithm == "trl-grpo" else {"initial_entropy": 1.0}
    args = config(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=3,
        report_to=[],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        gradient_checkpointing=False,
        **extra,
    )
    collector = Collector()
    trainer = trainer_cls(
        model=tiny_model_path,
        reward_funcs=table_reward,
        args=args,
        train_dataset=make_dataset(16),
        callbacks=[collector],
    )
    # A rule that fires on the first log: the random tiny model's entropy (~6 nats) is above 0.
    CollapseWarningCallback(
        action="stop", rule=CollapseRule(signals=("entropy",), entropy_threshold=0.0, entropy_rise=-1.0, patience=1)
    ).attach(trainer)
    trainer.train()
    assert trainer.state.global_step == 1  # stopped at the warning, not at max_steps=3
    assert (tmp_path / "out" / "checkpoint-1").is_dir()  # and saved there
    assert collector.logs[0]["monitor/collapse_warning"] == 1.0
    assert collector.logs[0]["monitor/entropy_ema"] == pytest.approx(collector.logs[0]["entropy"])


FIXTURES = (
    Path(__file__).parents[1] / "fixtures" / "collapse"
)  # reduced copies of real metrics.jsonl (SmolLM2, synthetic)


def _rows(name):
    import json

    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def test_real_lr3e3_collapse_is_caught_by_the_format_backstop_not_by_entropy():
    # lr 3e-3 GTPO: the format reward goes 10 -> 1 from step 5 while entropy heads to 0 (no rise past ln 2).
    rows = _rows("gtpo-lr3e-3.jsonl")
    monitor = CollapseMonitor()
    for row in rows:
        monitor.update(row, step=row["step"])
    # Plain recomputation of the backstop: EMA (α=0.3) of the format reward, 30% below its running best,
    # two logs in a row.
    ema = best = None
    streak, expected = 0, None
    for row in rows:
        x = row[FMT]
        ema = x if ema is None else 0.3 * x + 0.7 * ema
        best = ema if best is None else max(best, ema)
        streak = streak + 1 if best - ema > 0.3 * best else 0
        if streak == 2 and expected is None:
            expected = row["step"]
    assert expected is not None and monitor.fired_step == expected
    assert len(monitor.reasons) == 1 and "format reward" in monitor.reasons[0]  # entropy never fired


def test_real_default_lr_gtpo_run_is_quiet():
    monitor = CollapseMonitor()
    for row in _rows("gtpo-lr1e-3.jsonl"):
        monitor.update(row, step=row["step"])
    assert not monitor.fired


def test_replay_script_on_recorded_runs_reports_the_late_backstop_and_the_grpo_alarm(tmp_path):
    import json

    script = _replay_script()
    names = ("gtpo-lr3e-3.jsonl", "gtpo-lr1e-3.jsonl", "grpo-lr1e-3.jsonl")

    def results(*extra):
        out = tmp_path / "r.json"
        assert script.main([str(FIXTURES / n) for n in names] + ["--json", str(out), *extra]) == 0
        return {Path(r["run"]).stem: r for r in json.loads(out.read_text())}

    shipped = results()
    # The collapse: fall (3 smoothed logs 25% below the best) at the first step of that streak; the
    # backstop (30%, 2 logs) cannot come before it.
    assert shipped["gtpo-lr3e-3"]["verdict"] == "late" and shipped["gtpo-lr3e-3"]["lead_steps"] <= 0
    assert shipped["gtpo-lr1e-3"]["verdict"] == "quiet"
    # GRPO at lr 1e-3: entropy 1.44 and 1.47 at steps 6-7 with a format dip that recovers: the paper's entropy
    # signal raised a false alarm there (the old default); the shipped rule stays quiet.
    assert shipped["grpo-lr1e-3"]["verdict"] == "quiet"
    paper = results("--signals", "entropy", "format")
    assert paper["grpo-lr1e-3"]["verdict"] == "false alarm" and "entropy" in paper["grpo-lr1e-3"]["reasons"][0]


# ------------------------------------------------------------------ the shipped rule: warns, clears, stays quiet


def test_shipped_rule_watches_the_length_stall_and_format_signals():
    assert DEFAULT_SIGNALS == ("length", "stall", "format") and CollapseRule().signals == DEFAULT_SIGNALS
    assert CollapseRule().stall_patience == 6 and CollapseRule().clipped_threshold == 0.5


def test_length_signal_warns_while_completions_run_to_the_limit_and_clears_after(caplog):
    # Half the group or more cut at the limit for three steps, then none; the format stays full.
    clipped = [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    rows = [{CLIP: c, FMT: 10.0, "entropy": 0.3} for c in clipped]
    callback = CollapseWarningCallback(action="warn")
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.callbacks"):
        _, logged = replay(callback, rows)
    # Hand EMA (α = 0.3): 0, 0, 0.3, 0.51, 0.657, 0.4599, ...: at least 0.5 at steps 4 and 5, so with patience 2
    # the warning is on at step 5 only and off again at step 6.
    assert [row["monitor/clipped_ema"] for row in logged][:6] == pytest.approx([0, 0, 0.3, 0.51, 0.657, 0.4599])
    assert [row["monitor/collapse_warning"] for row in logged] == [0, 0, 0, 0, 1, 0, 0, 0]
    assert callback.monitor.episodes == [[5, 6]] and callback.monitor.fired_step == 5
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("possible policy collapse at step 5: 66% of completions run")
    assert lines[1] == "collapse warning cleared at step 6: no watched signal holds any more"


def test_stall_signal_warns_after_six_steps_without_a_full_format_completion_and_clears_when_one_comes():
    # Format means <= 1.0 mean no completion earned the full format (10 of 8 completions' sum makes >= 1.25).
    fmt = [0.5, 1.0, 1.0, 0.875, 1.0, 1.0, 1.0, 2.25, 1.0]
    rows = [{CLIP: 0.0, FMT: f} for f in fmt]
    _, logged = replay(CollapseWarningCallback(), rows)
    # Steps 1-7 hold the condition: six in a row at step 6 -> on at 6 and 7; step 8 has a full-format completion.
    assert [row["monitor/stall_streak"] for row in logged] == [1, 2, 3, 4, 5, 6, 7, 0, 1]
    assert [row["monitor/collapse_warning"] for row in logged] == [0, 0, 0, 0, 0, 1, 1, 0, 0]


def test_warning_turns_on_again_and_save_acts_at_each_onset():
    clipped = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    rows = [{CLIP: c, FMT: 10.0} for c in clipped]
    callback = CollapseWarningCallback(action="save")
    controls, logged = replay(callback, rows)
    # EMA 1, 1, 0.7, 0.49, 0.343, 0.5401, 0.67807, 0.774649: on at 1-3 (patience 2 reached at step 2), again at 7-8.
    assert [row["monitor/collapse_warning"] for row in logged] == [0, 1, 1, 0, 0, 0, 1, 1]
    assert callback.monitor.episodes == [[2, 4], [7, None]]
    assert [s for s, c in enumerate(controls, start=1) if c.should_save] == [2, 7]


def test_default_run_entropy_spike_does_not_warn_but_the_paper_signal_did():
    # The offline default run in bf16 (docs/measurements/make-train-20261125-2325/metrics.jsonl), steps 1-6:
    # entropy 0.55, 1.74, 0.91, then down; the format climbing; no completion cut at the limit.
    entropy = [0.552, 1.743, 0.910, 0.717, 0.326, 0.392]
    fmt = [0.625, 1.5, 3.25, 4.375, 7.75, 3.125]
    rows = [{"entropy": h, FMT: f, CLIP: 0.0} for h, f in zip(entropy, fmt, strict=True)]
    _, shipped = replay(CollapseWarningCallback(), rows)
    assert not any(row["monitor/collapse_warning"] for row in shipped)
    # The old default (entropy signal): EMA 0.552, 0.909 (0.357 above the floor) and 0.909 at step 3: on at step 3.
    _, paper = replay(CollapseWarningCallback(rule=PAPER_RULE), rows)
    assert [row["monitor/collapse_warning"] for row in paper][:3] == [0, 0, 1]


def test_the_committed_default_runs_stay_quiet_at_every_step():
    """The offline default run's committed logs (bf16 on two CPUs, float32, the GRPO twin): no step warns."""
    import json

    root = Path(__file__).parents[2] / "docs" / "measurements"
    for name in ("make-train-20261125-2325", "make-train-20261126-amx", "make-train-float32-20261126"):
        monitor = CollapseMonitor()
        rows = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
        steps = [monitor.update(row, step=row["step"]) for row in rows if "entropy" in row]
        assert len(steps) == 40 and not monitor.fired, name
        # and the recorded flag of the old rule was on from step 3 in the bf16 runs: the change is the rule's
        assert any(row.get("monitor/collapse_warning") == 1 for row in rows) == ("float32" not in name), name
