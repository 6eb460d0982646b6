"""Training-curve figures and the metrics log they are drawn from, on synthetic logs."""

from __future__ import annotations

import json
import math

import pytest

from gtpo.runs.metrics_log import MetricsLogger, first_last_means, read_metrics, series
from gtpo.runs.plots import PANELS, moving_average, panel_keys, plot_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(directory, steps: int = 30, gtpo: bool = True, kl: bool = False) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "metrics.jsonl").open("w") as f:
        for step in range(1, steps + 1):
            row = {
                "step": step,
                "rewards/format_reward/mean": 10 * (1 - math.exp(-step / 8)),
                "rewards/accuracy_reward/mean": 6 * (1 - math.exp(-step / 15)),
                "entropy": 0.9 * math.exp(-step / 20),
            }
            row["reward"] = row["rewards/format_reward/mean"] + row["rewards/accuracy_reward/mean"]
            if kl:
                row["kl"] = 1e-3 * step
            if gtpo:
                row.update({"gtpo/mean_entropy": 0.8, "gtpo/conflict_token_frac": 0.3, "gtpo/filtered_frac": 0.1})
            f.write(json.dumps(row) + "\n")
        f.write(json.dumps({"step": steps, "train_runtime": 123.0}) + "\n")  # the trainer's closing summary


@pytest.mark.slow
def test_two_runs_give_every_figure_as_png(tmp_path):
    write_run(tmp_path / "gtpo")
    write_run(tmp_path / "grpo", gtpo=False, kl=True)
    written = plot_runs([tmp_path / "gtpo", tmp_path / "grpo"], tmp_path / "fig", labels=["GTPO", "GRPO"])
    assert {p.name for p in written} == {"training_curves.png"} | {f"{panel.name}.png" for panel in PANELS}
    for path in written:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_a_metric_no_run_logged_has_no_file_but_the_overview_is_written(tmp_path):
    write_run(tmp_path / "grpo", gtpo=False)
    names = {p.name for p in plot_runs([tmp_path / "grpo"], tmp_path / "fig")}
    assert "conflict.png" not in names and "filtered.png" not in names and "kl.png" not in names
    assert {"training_curves.png", "accuracy.png", "format.png", "entropy.png"} <= names


def test_runs_are_compared_on_one_entropy_definition(tmp_path):
    write_run(tmp_path / "gtpo")
    write_run(tmp_path / "grpo", gtpo=False)
    runs = [(name, read_metrics(tmp_path / name)) for name in ("gtpo", "grpo")]
    entropy = next(p for p in PANELS if p.name == "entropy")
    assert panel_keys(entropy, runs) == ["entropy", "entropy"]  # TRL's, which both logged
    assert panel_keys(entropy, runs[:1]) == ["gtpo/mean_entropy"]  # GTPO's ⟨H⟩ when alone


def test_rewards_are_plotted_as_percent_of_ten():
    accuracy = next(p for p in PANELS if p.name == "accuracy")
    assert accuracy.key_for([{"rewards/accuracy_reward/mean": 5.0}]) == "rewards/accuracy_reward/mean"
    assert accuracy.scale * 5.0 == pytest.approx(50.0)


def test_moving_average_is_a_trailing_mean():
    assert moving_average([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert moving_average([1, 2, 3], 1) == [1, 2, 3]


def test_bad_plot_input_is_a_clear_error(tmp_path):
    write_run(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot_runs([tmp_path / "missing"], tmp_path / "fig")
    with pytest.raises(ValueError, match="one label per run"):
        plot_runs([tmp_path / "a"], tmp_path / "fig", labels=["x", "y"])


def test_log_keeps_every_dict_and_survives_a_torn_last_line(tmp_path):
    class State:
        is_world_process_zero = True
        global_step = 0

    logger, state = MetricsLogger(tmp_path), State()
    logger.on_train_begin(None, state, None)
    for step, reward in ((1, 2.0), (2, float("nan")), (3, 6.0)):
        state.global_step = step
        logger.on_log(None, state, None, logs={"reward": reward, "note": "x"})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rew')  # killed mid-write
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["reward"] is None  # NaN stored as null
    assert series(rows, "reward") == ([1, 3], [2.0, 6.0])
    assert first_last_means(rows, "reward", n=1) == (2.0, 6.0)
    assert first_last_means(rows, "missing") is None


def test_only_the_main_process_writes(tmp_path):
    class State:
        is_world_process_zero = False
        global_step = 1

    MetricsLogger(tmp_path).on_log(None, State(), None, logs={"reward": 1.0})
    assert not (tmp_path / "metrics.jsonl").exists()


def test_conflict_curve_leaves_out_steps_where_no_completion_had_an_advantage():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gtpo.runs.plots import _draw

    rows = [
        {"step": 1, "gtpo/conflict_token_frac": 0.4, "frac_reward_zero_std": 0.0},
        {"step": 2, "gtpo/conflict_token_frac": 0.0, "frac_reward_zero_std": 1.0},  # 0/0 logged as 0
        {"step": 3, "gtpo/conflict_token_frac": 0.6, "frac_reward_zero_std": 0.0},
    ]
    conflict = next(p for p in PANELS if p.name == "conflict")
    fig, ax = plt.subplots()
    assert _draw(ax, conflict, [("run", rows)], smooth=1)
    assert list(ax.lines[0].get_xdata()) == [1, 3]
    plt.close(fig)


def test_metrics_with_a_utf8_bom_read_like_without(tmp_path):
    text = '{"step": 1, "reward": 2.0}\n{"step": 2, "reward": 3.0}\n'
    (tmp_path / "metrics.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_metrics(tmp_path) == [{"step": 1, "reward": 2.0}, {"step": 2, "reward": 3.0}]


def test_a_resumed_logger_continues_the_time_of_the_checkpoints_row(tmp_path):
    """Resuming at step 2 (Trainer restored global_step=2 before on_train_begin): step 3's row, torn and
    logged past the checkpoint, is replaced, and the new rows' time starts from step 2's."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 4.0}\n{"step": 2, "time": 9.0}\n{"step": 3, "time": 1')

    class State:
        is_world_process_zero = True
        global_step = 2

    logger, state = MetricsLogger(tmp_path), State()
    logger.on_train_begin(None, state, None)
    state.global_step = 3
    logger.on_log(None, state, None, logs={"reward": 1.0})
    rows = read_metrics(tmp_path)
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert 9.0 <= rows[2]["time"] < 9.0 + 60  # seconds since the resumed on_train_begin, on top of 9.0
