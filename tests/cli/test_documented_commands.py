"""Every `gtpo` command line that README.md and docs/ show parses as its command would parse it (nothing runs).

Invariant: a user who copies a command from the documentation never meets "unknown flag" or a bad value; if a
flag is renamed, the documentation that still shows the old one fails here. Commands are collected from fenced
code blocks (with `\\` continuations joined and `#` comments dropped) and from inline code spans that start with
`gtpo VERB` and show a flag; each is parsed by :func:`gtpo.cli.main.parse_command`, the same parsers the
commands run. A command that elides part of itself with `...`, or is mentioned inline in prose, must still use
only valid flags and values; only what the elided part would give may be missing. A usage synopsis
(`[--KEY VALUE ...]`) is not a command. Shell variables take the value the document gives them
(`R=recipes/...`, the first value of a `for x in ...` loop); a variable the document never sets fails the test.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gtpo.cli.main import PARSERS, parse_command
from gtpo.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "studies").glob("*.md")),
]
PREFIXES = ("gtpo ", ".venv/bin/gtpo ", "python -m gtpo.cli ", ".venv/bin/python -m gtpo.cli ")
FENCE = re.compile(r"^```")
INLINE = re.compile(r"`((?:\.venv/bin/)?gtpo (?:" + "|".join(map(re.escape, PARSERS)) + r")\b[^`]* --?\w[^`]*)`")
ASSIGNMENT = re.compile(r"`?\b([A-Za-z_]\w*)=([^\s`$]+)`?")
LOOP = re.compile(r"^\s*for (\w+) in (\S+)")
BASENAME = re.compile(r"\$\(basename ([^)]+)\)")
VARIABLE = re.compile(r"\$\{?(\w+)\}?")


def _expand(line: str, variables: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        if match.group(1) not in variables:
            raise AssertionError(f"${match.group(1)} is used but never set in this document: {line!r}")
        return variables[match.group(1)]

    line = BASENAME.sub(lambda m: Path(VARIABLE.sub(value, m.group(1))).name, line)
    return VARIABLE.sub(value, line)


def _command_argv(line: str, variables: dict[str, str]) -> list[str] | None:
    line = line.strip().removeprefix("$ ")
    for prefix in PREFIXES:
        if line.startswith(prefix):
            return shlex.split(_expand(line[len(prefix) :], variables), comments=True)
    return None


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every gtpo command line in README.md, docs/*.md and docs/studies/*.md."""
    found = []
    for doc in DOCUMENTS:
        lines = doc.read_text().splitlines()
        variables = {m.group(1): m.group(2) for line in lines for m in ASSIGNMENT.finditer(line)}
        in_code, pending, start = False, "", 0
        for number, line in enumerate(lines, 1):
            if FENCE.match(line.strip()):
                in_code, pending = not in_code, ""
                continue
            if in_code:
                if not pending:
                    start = number
                pending += line.rstrip()
                if pending.endswith("\\"):
                    pending = pending[:-1] + " "
                    continue
                loop = LOOP.match(pending)
                if loop:
                    variables[loop.group(1)] = loop.group(2)
                argv = _command_argv(pending, variables)
                pending = ""
                if argv and argv[0] in PARSERS:
                    found.append((f"{doc.relative_to(ROOT)}:{start}", argv))
            else:
                for match in INLINE.finditer(line):
                    argv = _command_argv(match.group(1), variables)
                    if argv and not any(token.startswith("[") for token in argv):
                        found.append((f"{doc.relative_to(ROOT)}:{number} (inline)", argv))
    return found


COMMANDS = documented_commands()


def test_the_documentation_shows_commands_of_every_verb():
    """Guards the collector itself: if it found nothing (a changed fence style), every test below would vanish."""
    assert len(COMMANDS) >= 40, len(COMMANDS)
    assert {argv[0] for _, argv in COMMANDS} >= {"train", "eval", "compare", "inspect", "plot", "eval-plot"}


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_parses(where, argv, monkeypatch):
    monkeypatch.chdir(ROOT)  # the documentation's paths are relative to the repository root
    if "--help" in argv or "-h" in argv:
        with pytest.raises(SystemExit) as exit_:
            parse_command(argv)
        assert exit_.value.code == 0
        return
    elided = "..." in argv or where.endswith("(inline)")  # prose names a mode, e.g. `gtpo compare --aggregate_only`
    if elided:
        argv = [token for token in argv if token != "..."]
        try:
            parsed = parse_command(argv)
        except UsageError as err:  # what `...` stands for may be missing: a required flag, the folders
            assert re.search(r"arguments are required|give the study folder|give at least one", str(err)), err
            return
    else:
        parsed = parse_command(argv)
    if argv[0] == "compare":  # its arms' flags and the common ones are `gtpo train` flags: parse them too
        (args,) = [parsed]
        for variant in args.variant:
            parse_command(["train", *shlex.split(variant.partition(":")[2]), *args.train_args])


def test_a_wrong_flag_in_a_documented_command_would_fail():
    """The check can fail: a documented eval command with one flag misspelt is refused, naming the right one."""
    where, argv = next((w, a) for w, a in COMMANDS if a[0] == "eval" and "--max_new_tokens" in a)
    wrong = [token.replace("--max_new_tokens", "--max_new_token") for token in argv]
    with pytest.raises(UsageError, match="did you mean '--max_new_tokens'"):
        parse_command(wrong)
