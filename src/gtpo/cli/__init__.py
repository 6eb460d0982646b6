"""The `gtpo` command: one module per verb (train, sft, eval, plot, compare, inspect), argument parsing only.

Nothing outside this package imports it; `python -m gtpo.cli` runs it (the launcher of `gtpo compare`).
"""

from gtpo.cli.main import main

__all__ = ["main"]
