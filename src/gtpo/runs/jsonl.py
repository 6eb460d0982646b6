"""One reader for the JSON-lines files gtpo appends to (a run's metrics.jsonl, an evaluation's samples.jsonl).

Appending is the only way these files grow, so the only damage an interruption can leave is a torn last line.
:func:`read_jsonl` drops that line (and with ``repair=True`` cuts it from the file, or adds the missing newline
of a complete one, so that appending continues cleanly); a bad line anywhere else is damage, reported as an error
naming the file and line.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from gtpo.errors import InvalidInput

logger = logging.getLogger(__name__)


def read_jsonl(
    path: str | Path,
    validate: Callable[[object], str | None] | None = None,
    *,
    what: str = "JSON line",
    repair: bool = False,
) -> list:
    """The rows of ``path``, a file of one JSON value per line, in order.

    Args:
        path: the file.
        validate: returns why a parsed row is unacceptable (a phrase), or None; such a row counts as a bad line.
        what: the noun errors use for a line ("JSON line", "metrics row", "record").
        repair: cut a torn last line from the file (or add the newline a complete last row lacks), in place.

    Returns:
        The parsed rows; a torn last line is left out.

    Raises:
        ValueError: ``{path}:{line}: ...`` for a bad line that is not the last one.
    """
    path = Path(path)
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the file ends with a newline, as it should
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        problem = None
        try:
            row = json.loads(line.decode("utf-8-sig" if number == 1 else "utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            problem = f"not a {what} ({err})"
        else:
            problem = validate(row) if validate is not None else None
        if problem is None:
            rows.append(row)
            continue
        if number != len(lines):
            raise InvalidInput(f"{path}:{number}: {problem}; the file is damaged: move it away to start over")
        keep = len(data) - len(line) - (1 if data.endswith(b"\n") else 0)
        logger.warning(
            "%s:%d: %s an unfinished last line (%d bytes) left by an interrupted write",
            path,
            number,
            "cutting" if repair else "ignoring",
            len(data) - keep,
        )
        if repair:
            with open(path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
        return rows
    if repair and data and not data.endswith(b"\n"):
        logger.warning("%s: the last row was complete but lacked its newline; adding it", path)
        with open(path, "ab") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
    return rows
