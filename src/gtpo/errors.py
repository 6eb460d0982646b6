"""The one exception every layer may raise for a mistake in what the user typed, and where the user's input ends.

`gtpo.cli.main` reports a `UsageError` as one line, ``gtpo: error: ...``, exit status 2. Any other exception is a
bug in gtpo (or in something it calls) and is reported with its traceback. The ValueErrors and KeyErrors that
mean "what you asked for is wrong" (ours, GRPOConfig's, transformers') are raised while arguments are parsed,
configs and data are built and models are loaded: `user_input()` marks those stretches and turns such errors into
UsageErrors there, so they stay one line.
"""

import contextlib
import errno
import os


class UsageError(Exception):
    """Something the user typed is wrong; reported as one line, never with a traceback."""


class UserFunctionError(UsageError, ValueError):
    """A function the user gave (a reward function) failed or returned something unusable; one line, naming it.

    A ValueError too, so that library callers catch it as before."""


class InvalidInput(UsageError, ValueError):
    """A ValueError or KeyError raised while the user's input was read (`user_input`): one line, and still a
    ValueError for callers that catch one."""


class InvalidKey(UsageError, KeyError):
    """An unknown name in the user's input (a task, a column, a reward): one line, and still a KeyError."""


def message_of(err: BaseException) -> str:
    """The text of an exception, without the quotes str(KeyError) adds."""
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        return err.args[0]
    return str(err)


@contextlib.contextmanager
def user_input():
    """Within the block (parsing arguments, building configs, reading data, loading models), a ValueError or KeyError
    means the user's input is wrong: it is raised again as a UsageError (one line), chained to the original."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, KeyError) as err:
        raise InvalidInput(message_of(err)) from err


def os_error_message(err: OSError) -> str | None:
    """One line for the OSErrors a user can fix (full disk, no permission); None for any other."""
    where = f" writing {err.filename}" if err.filename else ""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device{where}: free some space, or give an --output_dir on another disk"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{os.strerror(err.errno).lower()}{where}: give a folder you can write to"
    return None
