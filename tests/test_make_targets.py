"""No test is left out of CI by the split of the suite: `make test` (the README's command, kept under about 8 minutes
on a 2-core CPU) runs every test not marked slow, `make test-slow` runs exactly the ones marked slow, and
`.ci/run` calls both (and `make test-vllm`). Read from the Makefile and `.ci/run` themselves, so a target that
drops its marker expression, or a CI script that drops a target, fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def recipe_lines(target: str) -> list[str]:
    """The shell lines of one Makefile target (the tab-indented lines under `target:`)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"^{re.escape(target)}:", line))
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return body


def pytest_marker_expression(target: str) -> str | None:
    """The `-m` expression of the target's pytest call (None when it has none: every test)."""
    calls = [shlex.split(line) for line in recipe_lines(target) if "pytest" in line]
    assert len(calls) == 1, f"make {target}: expected one pytest call, found {len(calls)}"
    argv = calls[0][calls[0].index("pytest") + 1 :]  # past `python -m pytest`
    return argv[argv.index("-m") + 1] if "-m" in argv else None


def test_make_test_and_make_test_slow_split_the_suite_by_the_slow_marker():
    assert pytest_marker_expression("test") == "not slow"
    assert pytest_marker_expression("test-slow") == "slow"
    # The marker is declared (pytest runs with --strict-markers, so a typo in a test fails at collection).
    assert re.search(r'"slow: .*make test-slow', (ROOT / "pyproject.toml").read_text())


def test_ci_runs_every_target_of_the_suite():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in ci if line and not line.startswith("#")]
    for target in ("make test", "make test-slow", "make test-vllm"):
        assert target in commands, f".ci/run does not call `{target}`"
