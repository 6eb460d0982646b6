"""Lazy exports for package ``__init__`` files: a name is imported from its module on first use, so importing a
package stays cheap (TRL, transformers and matplotlib load only when a name that needs them is used)."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` for ``package`` that serves ``exports`` (name -> module holding it)."""

    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
