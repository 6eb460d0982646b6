"""One flag style for every verb (issue 20): HfArgumentParser over dataclasses, snake_case flags as `gtpo train`
(TRL) has them, the hyphenated spelling as an alias with the same meaning, and `--config FILE.yaml`.

Each test compares what a verb parses with what the user wrote by hand, in both spellings; nothing runs."""

from __future__ import annotations

import re

import pytest

from gtpo.cli.main import PARSERS, parse_command
from gtpo.errors import UsageError


@pytest.mark.parametrize("verb", sorted(PARSERS))
def test_every_verb_prints_snake_case_flags_with_their_hyphenated_alias(verb, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_command([verb, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    options = "\n".join(line for line in text.splitlines() if line.startswith("  -"))  # the flags' own lines
    snake = set(re.findall(r"--[a-z0-9]+(?:_[a-z0-9]+)+", options))
    assert snake or verb == "eval-plot", verb  # eval-plot's flags are single words
    for flag in snake:
        assert flag.replace("_", "-") in options, f"{verb}: {flag} has no hyphenated alias"


def test_compare_repeated_arms_extend_and_the_common_train_flags_follow_the_double_dash():
    argv = ["compare", "--recipe", "a.yaml", "--recipe", "b=b.yaml", "--variant", "gtpo:"]
    args = parse_command([*argv, "--variant", "grpo:--algorithm grpo", "--seeds", "0", "1", "--output-dir", "s"])
    assert args.recipe == ["a.yaml", "b=b.yaml"] and args.variant == ["gtpo:", "grpo:--algorithm grpo"]
    assert args.seeds == [0, 1] and args.output_dir == "s" and args.train_args == []
    args = parse_command(["compare", "-o", "s", "--eval", "--eval-n", "8", "--", "--max_steps", "40"])
    assert (args.eval, args.eval_n, args.train_args) == (True, 8, ["--max_steps", "40"])
    with pytest.raises(UsageError, match="--output_dir OUT"):
        parse_command(["compare", "--aggregate_only"])


def test_compare_config_file_holds_the_whole_study(tmp_path):
    config = tmp_path / "study.yaml"
    config.write_text(
        "recipe: [recipes/smollm2/synthetic/gtpo.yaml]\nvariant: ['gtpo:', 'grpo:--algorithm grpo']\n"
        "seeds: [0, 1, 2]\noutput_dir: studies/x\neval: true\neval_limit: 100\ntrain_args: [--max_steps, '40']\n"
    )
    args = parse_command(["compare", "--config", str(config), "--", "--dtype", "float32"])
    assert args.variant == ["gtpo:", "grpo:--algorithm grpo"] and args.seeds == [0, 1, 2]
    assert (args.output_dir, args.eval, args.eval_limit) == ("studies/x", True, 100)
    assert args.train_args == ["--max_steps", "40", "--dtype", "float32"]  # the file's, then the command line's


def test_inspect_config_reads_a_training_recipe_but_not_its_run_settings(tmp_path):
    """A training recipe's model, task and GTPO keys configure the inspection (renamed: conflict_positive_weight
    -> positive_weight); its output_dir and seed are the training run's and are left alone."""
    from gtpo.cli.inspect import settings_from

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model_name_or_path: tiny\ntask: synthetic\nnum_generations: 4\nconflict_positive_weight: 3.0\n"
        "output_dir: runs/train-here\nseed: 7\nlearning_rate: 1.0e-5\n"
    )
    args = parse_command(["inspect", "--config", str(recipe), "--num-generations", "6"])
    settings = settings_from(args)
    assert (settings["model"], settings["num_generations"], settings["positive_weight"]) == ("tiny", 6, 3.0)
    assert (args.output_dir, args.seed) == ("inspect", 0)
    recipe.write_text("model_name_or_path: tiny\nnum_generation: 4\n")
    with pytest.raises(UsageError, match="did you mean 'num_generations'"):
        parse_command(["inspect", "--config", str(recipe)])


def test_plot_and_eval_plot_take_their_inputs_positionally_or_as_a_flag():
    args = parse_command(["plot", "runs/a", "runs/b", "--labels", "A", "B", "-o", "figs"])
    assert (args.run_dirs, args.labels, args.output_dir) == (["runs/a", "runs/b"], ["A", "B"], "figs")
    assert parse_command(["plot", "--run-dirs", "runs/a"]).run_dirs == ["runs/a"]
    args = parse_command(["eval-plot", "outputs/eval", "--metrics", "pass@k", "-o", "f.png"])
    assert (args.results, args.metrics, args.output) == (["outputs/eval"], ["pass@k"], "f.png")
    with pytest.raises(UsageError, match="invalid choice"):
        parse_command(["eval-plot", "outputs/eval", "--metrics", "pass@x"])


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["eval", "--model", "tiny", "--max-new-token", "8"], "did you mean '--max-new-tokens'"),
        (["eval", "--model", "tiny", "--output", "o"], "did you mean '--output_dir'"),
        (["inspect", "--num_generation", "4"], "did you mean '--num_generations'"),
    ],
)
def test_a_misspelt_flag_is_one_line_naming_the_nearest_spellings(argv, hint):
    with pytest.raises(UsageError, match=hint) as error:
        parse_command(argv)
    assert "\n" not in str(error.value)
