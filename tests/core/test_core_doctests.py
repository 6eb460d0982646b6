"""The examples in `gtpo.core`'s docstrings run and print what they show (they are the first thing a reader of
docs/core.md copies). Each module's doctests, collected by the standard library's `doctest`."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import gtpo.core

MODULES = sorted(m.name for m in pkgutil.iter_modules(gtpo.core.__path__, "gtpo.core."))


@pytest.mark.parametrize("name", MODULES)
def test_core_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples of {name} failed"


def test_the_doctests_are_there():
    """The control: core's modules do carry examples (a module list that found none would pass vacuously)."""
    attempted = 0
    for name in MODULES:
        finder = doctest.DocTestFinder()
        attempted += sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
    assert attempted >= 5
