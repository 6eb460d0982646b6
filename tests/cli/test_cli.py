"""The `gtpo` command: a real train + plot run in a subprocess, help for every command, and bad input
that ends in one clear line (exit status 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import run_gtpo, tiny_train_args
from gtpo import cli
from gtpo.cli import arguments, run_setup
from gtpo.cli.main import COMMANDS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_train_then_plot_writes_every_promised_file(tmp_path, tiny_model_path):
    run_dir = tmp_path / "run"
    train = run_gtpo(tiny_train_args(tiny_model_path) + ["--output_dir", str(run_dir)], cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "gtpo train: done" in train.stdout

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "reward" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for key in ("rewards/format_reward/mean", "rewards/accuracy_reward/mean", "gtpo/conflict_token_frac",
                "gtpo/filtered_frac", "gtpo/mean_entropy", "gtpo/initial_entropy"):  # fmt: skip
        assert all(key in row for row in steps), key
    record = json.loads((run_dir / "run.json").read_text())
    assert record["command"][:2] == ["gtpo", "train"]
    assert record["args"]["GTPOConfig"]["algorithm"] == "gtpo"
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
        assert (run_dir / "model" / name).stat().st_size > 0, name
    figures = {p.name for p in (run_dir / "figures").glob("*.png")}
    # conflict.png needs a step where some completion had A != 0; the random tiny model scores 0 everywhere.
    assert {"training_curves.png", "accuracy.png", "format.png", "reward.png", "entropy.png", "filtered.png"} <= figures

    out = tmp_path / "replot"
    plot = run_gtpo(["plot", str(run_dir), "-o", str(out)], cwd=tmp_path)
    assert plot.returncode == 0, plot.stderr[-3000:]
    written = [Path(line) for line in plot.stdout.split()]
    assert {p.name for p in written} == figures
    for path in written:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 1000, path


def test_bad_task_name_is_one_line_without_traceback(tmp_path):
    result = run_gtpo(["train", "--task", "gsm8", "--output_dir", str(tmp_path / "run")], cwd=tmp_path, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "gtpo: error: unknown task 'gsm8'" in result.stderr
    assert "'gsm8k'" in result.stderr and "'synthetic'" in result.stderr  # the valid choices are named
    assert not (tmp_path / "run").exists()  # nothing is created for a run that cannot start


# ------------------------------------------------------------------ in-process: fast checks of main()


def error_of(capsys, argv: list[str]) -> str:
    """Run `gtpo ARGV` in-process; assert it failed as a user error; return its one-line message."""
    status = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, err
    assert err and err[-1].startswith("gtpo: error: "), err
    return err[-1]


@pytest.mark.parametrize("command", ["train", "sft", "eval", "eval-plot", "plot"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"gtpo {command}" in capsys.readouterr().out


def test_top_level_help_lists_the_commands(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


def test_unknown_recipe_key_names_the_close_match(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: tiny\nlearnig_rate: 1.0e-6\n")
    message = error_of(capsys, ["train", "--config", str(recipe)])
    assert "unknown recipe key 'learnig_rate'" in message and "did you mean 'learning_rate'" in message


def test_unknown_command_line_flag_names_the_close_match(capsys):
    message = error_of(capsys, ["train", "--num_generation", "4"])
    assert "unknown command-line flag '--num_generation'" in message and "'--num_generations'" in message


def test_misspelled_reward_names_the_valid_ones(capsys):
    message = error_of(capsys, ["train", "--reward_funcs", "format", "acuracy"])
    assert "acuracy" in message and "accuracy" in message and "format" in message


def test_missing_model_path_names_the_offline_choices(tmp_path, capsys):
    message = error_of(capsys, ["train", "--model_name_or_path", str(tmp_path / "no-such-model")])
    assert "does not exist" in message and "smollm2" in message and "tiny" in message


def test_invalid_choice_is_one_line(capsys):
    message = error_of(capsys, ["train", "--algorithm", "gtp"])
    assert "invalid choice: 'gtp'" in message and "gtpo" in message and "grpo" in message


def test_invalid_config_value_is_one_line(capsys):
    message = error_of(capsys, ["train", "--algorithm", "gtpo", "--entropy_coef", "0.01"])
    assert "entropy_coef=0.01 with algorithm='gtpo'" in message and "entropy_gamma" in message


def test_missing_recipe_file(tmp_path, capsys):
    message = error_of(capsys, ["train", "--config", str(tmp_path / "nope.yaml")])
    assert "not found" in message


def test_unknown_command_suggests_the_right_one(capsys):
    assert cli.main(["trian"]) == 2
    assert "did you mean 'train'" in capsys.readouterr().err


def test_debug_flag_shows_the_traceback():
    with pytest.raises(ValueError, match="entropy_coef"):
        cli.main(["--debug", "train", "--entropy_coef", "0.01"])


def test_no_arguments_runs_the_offline_default_recipe():
    (script_args, training_args, model_args), recipe = arguments.train_parser().parse(
        [], arguments.DEFAULT_TRAIN_RECIPE
    )
    assert recipe == arguments.DEFAULT_TRAIN_RECIPE
    assert model_args.model_name_or_path == "smollm2" and model_args.dtype == "auto"
    assert (model_args.use_peft, model_args.lora_r) == (True, 16)
    assert script_args.task == "synthetic" and script_args.few_shot == 1
    assert script_args.reward_funcs == ["format", "accuracy"]
    assert training_args.algorithm == "gtpo" and training_args.learning_rate == 2e-4
    assert training_args.num_generations == 8 and training_args.generation_batch_size == 8  # one prompt a step
    assert training_args.max_completion_length == 96 and training_args.max_steps == 40
    assert training_args.logging_steps == 1


def test_command_line_overrides_the_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model_name_or_path: tiny\nlearning_rate: 1.0e-6\nnum_generations: 4\nper_device_train_batch_size: 4\n"
    )
    (_, training_args, model_args), _ = arguments.train_parser().parse(
        ["--config", str(recipe), "--learning_rate", "3e-6"], arguments.DEFAULT_TRAIN_RECIPE
    )
    assert training_args.learning_rate == 3e-6 and training_args.num_generations == 4
    assert model_args.model_name_or_path == "tiny"
    assert training_args.max_steps == -1  # the default run's settings do not leak into a recipe


def test_default_run_dir_is_timestamped_under_runs():
    path = run_setup.default_run_dir("smollm2-synthetic-gtpo", None)
    assert path.parent == Path("runs") and path.name.endswith("-smollm2-synthetic-gtpo")


def test_readme_python_example_runs(tmp_path, tiny_model_path, monkeypatch):
    """The README's one-line-swap example, with the tiny local model for the hub id and 2 steps."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Use it from Python", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    for old, new in (
        ('"Qwen/Qwen2.5-0.5B-Instruct"', repr(tiny_model_path)),
        ('"runs/swap"', repr(str(tmp_path / "swap"))),
        ("max_steps=10", "max_steps=2"),
    ):
        assert old in code, old
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 2


@pytest.mark.parametrize("error", [ValueError("shape mismatch in a tensor"), KeyError("rows"), RuntimeError("boom")])
def test_an_error_outside_the_users_input_is_a_bug_with_its_traceback(monkeypatch, capsys, error):
    """A ValueError or KeyError raised past the reading of the user's input (here: inside a command's work) is
    gtpo's bug: its traceback, then one line asking for a report with the run record; exit status 1."""

    def failing(argv):
        raise error

    monkeypatch.setitem(COMMANDS, "plot", failing)
    assert cli.main(["plot", "--output_dir", "runs/x"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and type(error).__name__ in err
    assert err.strip().splitlines()[-1] == (
        "gtpo: error: this is a bug in gtpo; please report it with runs/x/run.json and the traceback above"
    )


def test_refused_values_and_what_the_user_typed_stay_one_line(capsys):
    """GTPOConfig's refusal (a ValueError raised while the arguments are parsed) and an unknown flag: one line each,
    exit status 2, no traceback."""
    assert cli.main(["train", "--entropy_coef", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "entropy_coef" in err
    assert cli.main(["train", "--no_such_flag", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_reader_that_closes_the_pipe_is_not_reported_as_a_bug(tmp_path):
    """`gtpo ... | head`: when stdout's reader goes away the command ends quietly (exit 141, as `head`'s writers do),
    not with a traceback and a bug-report line. A real pipe whose reader closes after the first line."""
    import subprocess

    from cli_helpers import gtpo_command

    process = subprocess.Popen(
        [*gtpo_command(), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, bufsize=0
    )
    process.stdout.read(1)
    process.stdout.close()  # the reader goes away while gtpo still has lines to write
    stderr = process.stderr.read().decode()
    process.wait(timeout=120)
    assert "bug in gtpo" not in stderr and "Traceback" not in stderr


def test_read_recipe_lives_with_the_cli_and_keeps_its_public_name(tmp_path):
    """`read_recipe` moved to its reader, gtpo.cli.recipe (issue 40); `from gtpo.trainer import read_recipe` still
    gives the same function."""
    from gtpo.cli.recipe import read_recipe
    from gtpo.trainer import read_recipe as public

    assert public is read_recipe
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 0.001\nmax_steps: 3\n")
    assert read_recipe(recipe) == {"learning_rate": 0.001, "max_steps": 3}
