"""The one exception every layer may raise for a mistake in what the user typed.

`gtpo.cli.main` reports it (like ValueError) as one line, ``gtpo: error: ...``, exit status 2.
"""


class UsageError(Exception):
    """Something the user typed is wrong; reported as one line, never with a traceback."""
