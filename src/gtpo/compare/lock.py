"""OUT/compare.lock, held while a ``gtpo compare`` runs a study, so that a second one on the same folder (which
would resume the same run twice) is refused; a lock whose process is gone is taken over."""

from __future__ import annotations

import os
import socket
from pathlib import Path

LOCK_FILE = "compare.lock"


class StudyLock:
    """OUT/compare.lock while a `gtpo compare` runs a study: a second one would resume the same run twice."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK_FILE
        self.mine = f"{socket.gethostname()} {os.getpid()}"

    def __enter__(self):
        if self.path.is_file():
            host, _, pid = self.path.read_text().strip().partition(" ")
            alive = host != socket.gethostname() or _pid_alive(int(pid or 0))
            if alive:
                raise ValueError(
                    f"another gtpo compare (host {host}, pid {pid}) is running the study in "
                    f"{self.path.parent}; wait for it, or delete {self.path} if it is gone"
                )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.mine + "\n")
        return self

    def __exit__(self, *exc):
        if self.path.is_file() and self.path.read_text().strip() == self.mine:
            self.path.unlink()


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
