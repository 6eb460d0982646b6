"""Two versions of one package in one process, for a benchmark that runs another commit's code beside this tree's
(issue 47, item 3: a regression between two commits shows as a ratio measured on one device in one process).

A version is the set of ``sys.modules`` entries of the package (``gtpo`` and ``gtpo.*``) that one import of it
made. :meth:`CodeVersion.active` puts that set into ``sys.modules`` for the duration of a block and puts the
previous one back after, so every import the version's code makes while it runs, lazy ones inside functions
included, resolves to its own modules; a module it imports for the first time inside the block is kept in its
set. Objects made under a version (a trainer, its bound methods) keep their own module globals either way.

    base = CodeVersion.load("gtpo", extract_commit("ca8ead9", "src"), "ca8ead9")
    with base.active():
        from gtpo import GTPOTrainer      # ca8ead9's
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _in_package(package: str, name: str) -> bool:
    return name == package or name.startswith(package + ".")


class CodeVersion:
    """One version of ``package``: its modules, swapped into ``sys.modules`` by :meth:`active`.

    Args:
        package: the top-level package's name ("gtpo").
        modules: module name -> module of this version (may start empty: imports inside :meth:`active` fill it).
        label: how the version is printed (a commit, a folder).
    """

    def __init__(self, package: str, modules: dict, label: str, ambient: bool = False):
        self.package, self.modules, self.label, self.ambient = package, modules, label, ambient

    def origin(self) -> str:
        """The folder the version's package was imported from (printed beside its figures)."""
        return str(Path(self.modules[self.package].__file__).resolve().parent)

    @classmethod
    def current(cls, package: str, label: str = "this tree") -> CodeVersion:
        """The version already imported (``import package`` is done first if it was not): the ambient one, which
        ``sys.modules`` holds outside any other version's :meth:`active` block (so its modules stay whatever that
        holds, those imported later included)."""
        importlib.import_module(package)
        return cls(package, sys.modules, label, ambient=True)

    @classmethod
    def load(cls, package: str, source_root: str | Path, label: str) -> CodeVersion:
        """Import ``package`` from ``source_root`` (the folder holding ``package/``) as a version of its own,
        leaving the version in ``sys.modules`` before the call in place.

        Raises:
            SystemExit: when ``source_root`` holds no ``package/`` or the import came from elsewhere.
        """
        root = Path(source_root).resolve()
        if not (root / package / "__init__.py").is_file():
            raise SystemExit(f"{root} holds no {package}/__init__.py: pass the folder that holds the package (src)")
        version = cls(package, {}, label)
        with version.active():
            sys.path.insert(0, str(root))
            try:
                module = importlib.import_module(package)
            finally:
                sys.path.remove(str(root))
            if not Path(module.__file__).resolve().is_relative_to(root):
                raise SystemExit(f"{package} was imported from {module.__file__}, not from {root}")
        return version

    @contextmanager
    def active(self):
        """Within the block ``sys.modules`` holds this version's modules of the package, and only those. The
        ambient version's block changes nothing (call it outside the other versions' blocks)."""
        if self.ambient:
            yield self
            return
        saved = {k: sys.modules.pop(k) for k in list(sys.modules) if _in_package(self.package, k)}
        sys.modules.update(self.modules)
        try:
            yield self
        finally:
            for name in [k for k in sys.modules if _in_package(self.package, k)]:
                self.modules[name] = sys.modules.pop(name)
            sys.modules.update(saved)


def extract_commit(commit: str, path: str = "src", repository: str | Path = ".") -> Path:
    """``path`` of ``commit`` extracted into a new temporary folder (``git archive``: no work tree, no change to
    the repository). Returns that folder's ``path``.

    Raises:
        SystemExit: when git cannot read the commit (not a clone, or a commit this clone does not have).
    """
    done = subprocess.run(["git", "archive", "--format=tar", commit, path], cwd=repository, capture_output=True)
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(
            f"git archive {commit} {path} failed ({message[0]}): name a commit this clone has, or pass "
            "--baseline-src with a folder holding that commit's gtpo package"
        )
    target = Path(tempfile.mkdtemp(prefix=f"gtpo-{commit[:12]}-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)  # the process imported from it until its end
    with tempfile.TemporaryFile() as archive:
        archive.write(done.stdout)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            # the "data" filter (no absolute paths, no links out) where this Python has it (3.10.12+, 3.11.4+)
            tar.extractall(target, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return target / path
