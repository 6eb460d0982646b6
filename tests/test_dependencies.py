"""Every third-party package that src/gtpo imports is declared in pyproject.toml (issue 20): in `dependencies`, or
in an optional extra and then imported only inside functions (so `import gtpo...` never needs it)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gtpo"
# Import names of packages that may be absent here (optional extras), with their distribution names.
NOT_INSTALLED = {"vllm": "vllm"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {extra: {_name(r) for r in reqs} for extra, reqs in project.get("optional-dependencies", {}).items()}
    return {_name(r) for r in project["dependencies"]}, extras


def imports() -> dict[str, set[str]]:
    """Top-level third-party import name -> {"module" if imported at module level anywhere, "function"}."""
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root != "gtpo" and root not in sys.stdlib_module_names:
                    found.setdefault(root, set()).add("module" if id(node) in top else "function")
    return found


def distribution(import_name: str) -> str:
    if import_name in NOT_INSTALLED:
        return NOT_INSTALLED[import_name]
    dists = packages_distributions().get(import_name)
    assert dists, f"{import_name} is imported by src/gtpo but no installed distribution provides it"
    return dists[0].lower().replace("_", "-")


def test_the_import_scan_sees_real_imports():
    found = imports()
    assert {"torch", "transformers", "trl", "yaml", "vllm"} <= found.keys()
    assert found["vllm"] == {"function"}


def gaps(required: set[str], extras: dict[str, set[str]]) -> tuple[list[str], list[str]]:
    """(undeclared imports, optional extras imported at module level)."""
    optional = set().union(*extras.values())
    undeclared, eager_optional = [], []
    for name, where in sorted(imports().items()):
        dist = distribution(name)
        if dist in required:
            continue
        if dist in optional:
            if "module" in where:
                eager_optional.append(name)
            continue
        undeclared.append(f"{name} (distribution {dist})")
    return undeclared, eager_optional


def test_every_imported_package_is_declared():
    undeclared, eager_optional = gaps(*declared())
    assert undeclared == [], "declare them in pyproject.toml [project] dependencies"
    assert eager_optional == [], "an optional extra must be imported inside the function that needs it"


def test_the_checker_catches_a_gap():
    # The control: numpy left out of the declarations is reported; vllm moved to the required list is not.
    required, extras = declared()
    assert gaps(required - {"numpy"}, extras)[0] == ["numpy (distribution numpy)"]
    assert gaps(required, {"vllm": set()})[0] == ["vllm (distribution vllm)"]
