"""Every third-party package that src/gtpo imports is declared in pyproject.toml (issue 20): in `dependencies`, or
in an optional extra and then imported only inside functions (so `import gtpo...` never needs it)."""

from __future__ import annotations

import ast
import functools
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


@functools.cache  # the source does not change during a run; each scan parses every file
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


@functools.cache  # reads every installed distribution's metadata: once a run, not once an import name
def _packages_distributions() -> dict[str, list[str]]:
    return packages_distributions()


def distribution(import_name: str) -> str:
    if import_name in NOT_INSTALLED:
        return NOT_INSTALLED[import_name]
    dists = _packages_distributions().get(import_name)
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


# ------------------------------------------------------------------------------------------- the lock (issue 31)

LOCK = ROOT / "requirements" / "lock-cpu.txt"
# What a CUDA torch brings beside itself on a GPU machine; the lock is CPU's.
GPU_ONLY = re.compile(r"^(nvidia-|triton|cuda-)")


def pins(lines: list[str]) -> dict[str, str]:
    """{normalised name: version} of the ``name==version`` lines (comments and the editable gtpo skipped)."""
    found = {}
    for line in lines:
        line = line.strip()
        if line and not line.startswith(("#", "-e")) and "==" in line:
            name, version = line.split("==", 1)
            found[_name(name)] = version
    return found


def test_the_lock_pins_every_package_of_this_environment():
    """`make test` on a fresh clone must install what this environment was tested with: every package `pip freeze`
    shows here (gtpo aside) is in the lock at the same version, and the lock holds nothing else. torch is compared
    without its local build tag (+cpu here, none for the GPU build)."""
    import subprocess

    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    here = {k: v for k, v in pins(freeze).items() if not GPU_ONLY.match(k) and k != "gtpo"}
    locked = pins(LOCK.read_text().splitlines())
    here["torch"] = here["torch"].split("+")[0]
    locked["torch"] = locked["torch"].split("+")[0]
    assert here == locked, "refresh the lock (bash scripts/lock.sh) or the environment (bash scripts/setup.sh)"


def test_the_lock_satisfies_pyproject_and_names_its_command():
    """Each of pyproject.toml's requirements (and the dev extra's) is pinned in the lock at a version inside its
    range, and the lock's header names the committed command that regenerates it."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = pins(LOCK.read_text().splitlines())
    for text in project["dependencies"] + project["optional-dependencies"]["dev"]:
        requirement = Requirement(text)
        version = locked.get(_name(requirement.name))
        assert version is not None, f"{requirement.name} is not in the lock"
        assert requirement.specifier.contains(version, prereleases=True), f"{requirement} vs the lock's {version}"
    assert "Generated by: bash scripts/lock.sh" in LOCK.read_text()
    assert "requirements/lock-cpu.txt" in (ROOT / "scripts" / "lock.sh").read_text()


def test_setup_installs_the_lock(tmp_path):
    """scripts/setup.sh installs every package of the lock at its version, torch aside (installed before it as the
    same version's CPU or CUDA build), with --no-deps, and then gtpo itself: run here with a stand-in python that
    only logs what pip is asked."""
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "requirements").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    shutil.copy(LOCK, repo / "requirements" / "lock-cpu.txt")
    venv = repo / ".venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    fake = venv / "bin" / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 0\n')  # `python -c "import torch"` succeeds too
    fake.chmod(0o755)
    subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], check=True, capture_output=True, timeout=60)
    calls = log.read_text().splitlines()
    installs = [c for c in calls if c.startswith("-m pip install") and "--upgrade pip" not in c]
    assert installs == [
        "-m pip install -q --no-deps -r .venv/.lock-without-torch.txt",
        "-m pip install -q --no-deps -e .",
    ]
    installed = pins((venv / ".lock-without-torch.txt").read_text().splitlines())
    assert installed == {k: v for k, v in pins(LOCK.read_text().splitlines()).items() if k != "torch"}
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert f"TORCH_VERSION={pins(LOCK.read_text().splitlines())['torch'].split('+')[0]} " in setup
