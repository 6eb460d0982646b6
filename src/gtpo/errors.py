"""The one exception every layer may raise for a mistake in what the user typed.

`gtpo.cli.main` reports it (like ValueError) as one line, ``gtpo: error: ...``, exit status 2.
"""

import errno
import os


class UsageError(Exception):
    """Something the user typed is wrong; reported as one line, never with a traceback."""


def os_error_message(err: OSError) -> str | None:
    """One line for the OSErrors a user can fix (full disk, no permission); None for any other."""
    where = f" writing {err.filename}" if err.filename else ""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device{where}: free some space, or give an --output_dir on another disk"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{os.strerror(err.errno).lower()}{where}: give a folder you can write to"
    return None
