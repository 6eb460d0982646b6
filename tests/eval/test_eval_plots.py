"""pass@k / maj@k figures from results files alone, and the eval command line."""

import json
from pathlib import Path

import pytest

from gtpo import cli
from gtpo.cli import eval as eval_cli
from gtpo.errors import UsageError
from gtpo.eval.backends import Completion
from gtpo.eval.plots import plot_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_results(path: Path, label: str, task: str, n: int, accuracy: float) -> Path:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n]
    path.mkdir(parents=True, exist_ok=True)
    results = {
        "model": f"/ckpt/{label}",
        "label": label,
        "task": task,
        "split": "test",
        "ks": ks,
        "pass@k": {str(k): 1 - (1 - accuracy) ** k for k in ks},
        "maj@k": {str(k): min(1.0, accuracy * (1 + 0.05 * k)) for k in ks},
    }
    (path / "results.json").write_text(json.dumps(results))
    return path / "results.json"


def test_figure_is_drawn_from_results_files_alone(tmp_path):
    # Only results.json files exist: no samples, no model.
    write_results(tmp_path / "gtpo" / "gsm8k", "gtpo", "gsm8k", 32, 0.6)
    write_results(tmp_path / "grpo" / "gsm8k", "grpo", "gsm8k", 32, 0.5)
    write_results(tmp_path / "gtpo" / "aime24", "gtpo", "aime24", 64, 0.05)
    output = plot_results([tmp_path], tmp_path / "figs" / "pass_maj.png", title="GSM8K and AIME24")
    assert output.read_bytes().startswith(PNG_MAGIC)
    assert output.stat().st_size > 10_000


def test_pass_only_figure_with_explicit_labels(tmp_path):
    a = write_results(tmp_path / "a", "x", "aime24", 64, 0.05)
    b = write_results(tmp_path / "b", "x", "aime24", 64, 0.03)
    output = plot_results([a, b], tmp_path / "aime.png", labels=["GTPO", "SFT"], metrics=["pass@k"])
    assert output.read_bytes().startswith(PNG_MAGIC)


def test_bad_plot_inputs_name_what_is_valid(tmp_path):
    a = write_results(tmp_path / "a", "x", "gsm8k", 4, 0.5)
    with pytest.raises(ValueError, match="does not exist"):
        plot_results([tmp_path / "nope"], tmp_path / "f.png")
    with pytest.raises(ValueError, match="2 labels for 1 results files"):
        plot_results([a], tmp_path / "f.png", labels=["a", "b"])
    with pytest.raises(ValueError, match=r"valid: \['pass@k', 'maj@k'\]"):
        plot_results([a], tmp_path / "f.png", metrics=["acc@k"])
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a gtpo eval results file"):
        plot_results([tmp_path / "other.json"], tmp_path / "f.png")


def test_help_documents_every_eval_flag_in_both_spellings():
    """Every flag of `gtpo eval` is in --help, snake_case (TRL's style) with its hyphenated alias, and both
    spellings parse to the same value; defaults are the paper's evaluation settings."""
    text = eval_cli.eval_parser().parser.format_help()
    for flag in (
        "model",
        "task",
        "split",
        "source",
        "few_shot",
        "limit",
        "num_samples",
        "temperature",
        "top_p",
        "top_k",
        "max_new_tokens",
        "seed",
        "output_dir",
        "backend",
        "batch_size",
        "dtype",
        "column_map",
    ):
        assert f"--{flag}" in text, flag
        if "_" in flag:
            assert f"--{flag.replace('_', '-')}" in text, flag
    args = eval_cli.parse_eval_args(["--model", "tiny"])
    assert (args.temperature, args.top_p, args.num_samples, args.backend, args.progress) == (1.0, 1.0, 32, "auto", True)
    flags = ["--max_new_tokens", "7", "--output_dir", "o", "--no_progress"]
    snake = eval_cli.parse_eval_args(["--model", "tiny", *flags])
    hyphen = eval_cli.parse_eval_args(["--model", "tiny", *[f.replace("_", "-") for f in flags]])
    assert snake == hyphen and (snake.max_new_tokens, snake.output_dir, snake.progress) == (7, "o", False)


def test_eval_config_file_gives_defaults_that_flags_override(tmp_path):
    """`gtpo eval --config FILE.yaml`: the file's keys are the flags' names; a flag typed after it wins, and a
    misspelt key is refused naming the right one."""
    config = tmp_path / "eval.yaml"
    config.write_text("model: tiny\ntask: [synthetic, gsm8k]\nnum_samples: 4\nmax_new_tokens: 64\n")
    args = eval_cli.parse_eval_args(["--config", str(config), "--num_samples", "8"])
    assert (args.model, args.task, args.num_samples, args.max_new_tokens) == ("tiny", ["synthetic", "gsm8k"], 8, 64)
    config.write_text("model: tiny\nnum_sample: 4\n")
    with pytest.raises(UsageError, match="did you mean 'num_samples'"):
        eval_cli.parse_eval_args(["--config", str(config)])


class RightAnswers:
    name = "scripted"

    def generate(self, prompts, seeds, sampling):
        return [Completion("<answer>18</answer>", 4, False) for _ in prompts]


def test_cli_eval_then_plot(tmp_path, shared_data, monkeypatch, capsys):
    monkeypatch.setattr("gtpo.eval.runner.make_backend", lambda *args: RightAnswers())
    source = str(shared_data / "gsm8k" / "test.jsonl")
    out = tmp_path / "eval"
    assert (
        cli.main(
            [
                "eval",
                "--model",
                "tiny",
                "--task",
                "gsm8k",
                "--source",
                source,
                "-n",
                "2",
                "--limit",
                "2",
                "--output-dir",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    results = json.loads((out / "gsm8k" / "results.json").read_text())
    assert results["pass@k"]["1"] == pytest.approx(0.5)  # "18" is right for Janet's ducks only
    assert "pass@k" in capsys.readouterr().out
    figure = tmp_path / "fig.png"
    assert cli.main(["eval-plot", str(out), "-o", str(figure)]) == 0
    assert figure.read_bytes().startswith(PNG_MAGIC)


def _exit_status(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as stop:  # argparse's own refusals
        return stop.code


def test_cli_bad_input_exits_with_a_message(tmp_path, capsys):
    assert _exit_status(["eval", "--model", str(tmp_path / "missing"), "--output-dir", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert _exit_status(["eval", "--model", "tiny", "--task", "gsm8k", "math500", "--source", "x.jsonl"]) == 2
    assert "give one --task" in capsys.readouterr().err
