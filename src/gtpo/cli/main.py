"""The ``gtpo`` command: ``gtpo train | sft | eval | eval-plot | plot``.

``gtpo train`` with no arguments is the offline default run (SmolLM2-135M-Instruct, synthetic arithmetic,
GTPO, a few minutes on a laptop CPU). With ``--config RECIPE.yaml`` it runs a recipe; any recipe key can
be overridden on the command line (``--learning_rate 1e-5``), TRL's ``TrlParser`` style.

Errors in what the user typed (an unknown recipe key, task, reward or model, a bad value) end in one line,
``gtpo: error: ...``, and exit status 2; ``gtpo --debug ...`` (or ``GTPO_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import sys
import traceback

from gtpo.errors import UsageError

COMMAND_HELP = {
    "train": "train with GTPO or GRPO from a YAML recipe (no arguments: the offline default run)",
    "sft": "supervised fine-tuning on gold solutions in the tag format (the paper's SFT baseline)",
    "eval": "pass@k / maj@k of a model on a task",
    "eval-plot": "plot pass@k and maj@k against k from eval results",
    "plot": "training-curve figures from one or more run folders",
    "compare": "run arms (e.g. GTPO vs GRPO) over seeds, resumably, and compare them with 95% intervals",
    "inspect": "one group through GTPO's eyes: conflict spans, λ, entropy and δ (docs/inspect.md)",
}


# ---------------------------------------------------------------------------------------------- commands


def _lazy_command(module: str, function: str):
    """A subcommand whose module (and its heavy imports) loads only when that subcommand runs."""

    def run(argv: list[str]) -> int:
        return getattr(importlib.import_module(module), function)(argv)

    return run


# What each command's arguments parse into, without running anything (`parse_command`).
PARSERS = {
    "train": ("gtpo.cli.train", "parse_train_args"),
    "sft": ("gtpo.cli.sft", "parse_sft_args"),
    "eval": ("gtpo.cli.eval", "parse_eval_args"),
    "eval-plot": ("gtpo.cli.eval", "parse_eval_plot_args"),
    "plot": ("gtpo.cli.plot", "parse_plot_args"),
    "compare": ("gtpo.cli.compare", "parse_compare_args"),
    "inspect": ("gtpo.cli.inspect", "parse_inspect_args"),
}


def parse_command(argv: list[str]):
    """A ``gtpo`` command line (without the leading ``gtpo``), parsed as its command would and not run: the
    command's argument dataclasses. Raises :class:`UsageError` for what the command would refuse."""
    if not argv or argv[0] not in PARSERS:
        raise UsageError(f"gtpo: unknown command {argv[:1]}; choose one of {list(PARSERS)}")
    module, function = PARSERS[argv[0]]
    return getattr(importlib.import_module(module), function)(list(argv[1:]))


COMMANDS = {
    "train": _lazy_command("gtpo.cli.train", "run_train"),
    "sft": _lazy_command("gtpo.cli.sft", "run_sft"),
    "eval": _lazy_command("gtpo.cli.eval", "run_eval"),
    "eval-plot": _lazy_command("gtpo.cli.eval", "run_eval_plot"),
    "plot": _lazy_command("gtpo.cli.plot", "run_plot"),
    "compare": _lazy_command("gtpo.cli.compare", "run_compare"),
    "inspect": _lazy_command("gtpo.cli.inspect", "run_inspect"),
}


# ---------------------------------------------------------------------------------------------- main


def _top_help() -> str:
    lines = [
        "usage: gtpo [--debug] [--version] COMMAND [ARGS]",
        "",
        "GTPO (arXiv 2508.03772) on Hugging Face TRL: train, evaluate and plot.",
        "",
        "commands:",
        *(f"  {name:<10} {text}" for name, text in COMMAND_HELP.items()),
        "",
        "options:",
        "  -h, --help  show this message; `gtpo COMMAND --help` shows a command's flags",
        "  --version   print the version",
        "  --debug     show the full traceback on errors (also: GTPO_DEBUG=1)",
        "",
        "examples:",
        "  gtpo train                                            # offline default run, ~10 min on a CPU",
        "  gtpo train --config recipes/qwen2.5-3b/gsm8k/gtpo-g8.yaml --learning_rate 2e-6",
        "  gtpo plot runs/A runs/B --labels GTPO GRPO",
        "  gtpo eval --model runs/A/model --task gsm8k -n 8 --limit 50",
    ]
    return "\n".join(lines)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "what you asked for is wrong": reported in one line, without a traceback. ValueErrors
    and KeyErrors count where the user's input is read (`gtpo.errors.user_input`), which makes them UsageErrors."""
    errors = (UsageError, FileNotFoundError, NotADirectoryError)
    data = sys.modules.get("gtpo.tasks")  # imported before any data loads, so its error can be raised
    return errors + ((data.TaskSourceError,) if data is not None else ())


BUG_LINE = "this is a bug in gtpo; please report it with {record} and the traceback above"


def _run_record(argv: list[str]) -> str:
    """Where the failed command's run record is, for the bug report (the run folder's run.json)."""
    from pathlib import Path

    for flag in ("--output_dir", "--output-dir", "--out"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            return str(Path(argv[argv.index(flag) + 1]) / "run.json")
    return "RUN/run.json (RUN: the run folder it printed)"


def main(argv: list[str] | None = None) -> int:
    """The `gtpo` command: its exit status (0 done, 2 the user's input, 1 a bug, 130 interrupted, 141 stdout closed)."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not in the interpreter's flush at exit
        return status
    except BrokenPipeError:
        # The reader of stdout went away (`gtpo inspect ... | head`): not an error of gtpo's. Point stdout at
        # /dev/null so that Python's own flush at exit does not raise again, and exit as `head`'s writers do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    # Before torch loads OpenMP: its threads spin while they wait, which on a small or shared machine
    # makes CPU training many times slower (SmolLM2 generating 8 x 48 tokens with 2 threads on 2 cores:
    # 27-81 s with the default policy, 3.4-5 s with PASSIVE, load averages 0.8-5). A user's setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("GTPO_DEBUG", "") not in ("", "0")
    while argv and argv[0] in ("--debug", "--version", "-h", "--help"):
        flag = argv.pop(0)
        if flag == "--debug":
            debug = True
        elif flag == "--version":
            from gtpo.version import __version__

            print(f"gtpo {__version__}")
            return 0
        else:
            print(_top_help())
            return 0
    if not argv:
        print(_top_help())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"gtpo: error: unknown command {command!r}{hint}; choose one of {list(COMMANDS)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[command](rest) or 0
    except Exception as err:
        from gtpo.errors import message_of, os_error_message

        user = isinstance(err, _user_errors())
        message = message_of(err) if user else isinstance(err, OSError) and os_error_message(err)  # full disk, ...
        if debug:
            raise
        if not message:  # not the user's input: a bug, reported with everything needed to fix it
            traceback.print_exc()
            print(f"gtpo: error: {BUG_LINE.format(record=_run_record(rest))}", file=sys.stderr)
            return 1
        print(f"gtpo: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gtpo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
