"""The layers of docs/architecture.md, read from the source with ``ast`` (imports inside functions count).

src/gtpo holds one package per layer; a package imports only from packages on lower floors, so the package graph
has no cycle. Checked here, with no list of exceptions: the floors, no cycle (between packages, and between modules
inside one), `core` importing no other gtpo package, nothing but `cli` importing `cli`, no private name taken from
another package, no module over 400 lines, and a one-line docstring on every package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "gtpo"
# Floor of each layer (docs/architecture.md): a layer may import only from lower floors. The root package `gtpo`
# (the `from gtpo import GTPOTrainer` facade) is on top; `version` at the bottom.
FLOORS = {
    "version": 0,
    "lazy": 0,
    "errors": 0,
    "models": 1,
    "decoding": 1,  # the decode loop (sampling) and its fixed-shape CUDA-graph form (graph)
    "core": 1,
    "grading": 1,
    "tasks": 2,
    "runs": 2,
    "forward": 2,  # the policy's forward over completions: core's math and TRL's fused head, no trainer
    "trainer": 3,
    "eval": 3,
    "compare": 3,
    "inspection": 4,
    "cli": 5,
    "gtpo": 6,
}
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> str:
    """The layer a module belongs to: its package under gtpo (``gtpo.core.checks`` -> ``core``), the top-level
    module's own name (``gtpo.models`` -> ``models``), or ``gtpo`` for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gtpo"


def _imports(name: str, path: Path, known: set[str]) -> dict[str, set[str]]:
    """The gtpo modules ``name`` imports anywhere in its file, each with the names it takes from it.
    ``from gtpo import x`` counts as gtpo.x when gtpo.x is a module, else as gtpo (the package root)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, set[str]] = {}
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.setdefault(a.name, set())
                if a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    found.setdefault(full, set())
                    aliases[alias.asname or alias.name] = full
                else:
                    found.setdefault(base, set()).add(alias.name)
    for node in ast.walk(tree):  # `module._private` through an imported module's name
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.setdefault(aliases[node.value.id], set()).add(node.attr)
    return {m: names for m, names in found.items() if m in known and m != name}


def _graph() -> dict[str, dict[str, set[str]]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components with more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.add(frozenset(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return components


def _layer_edges() -> set[tuple[str, str, str]]:
    """(importing module, its layer, imported layer) for every import that crosses layers."""
    return {
        (name, layer(name), layer(dep)) for name, deps in _graph().items() for dep in deps if layer(dep) != layer(name)
    }


def test_the_graph_sees_real_imports():
    # Guards the tests below against passing on an empty graph: known imports are seen, private names too.
    graph = _graph()
    assert "gtpo.core.checks" in graph["gtpo.core.loss"]
    assert "gtpo.cli.run_setup" in graph["gtpo.cli.train"]
    assert "_cached_verify" not in graph["gtpo.grading.equivalence"].get("gtpo.grading.pool", set())
    assert "get_pool" in graph["gtpo.grading.equivalence"]["gtpo.grading.pool"]


def test_every_module_belongs_to_a_layer_with_a_floor():
    assert {layer(m) for m in _modules()} <= FLOORS.keys()


def test_layers_import_only_from_lower_floors():
    upward = sorted((name, dep) for name, own, dep in _layer_edges() if FLOORS[dep] >= FLOORS[own])
    assert upward == [], "a layer may import only from layers on lower floors (docs/architecture.md)"


def test_core_imports_no_other_gtpo_package():
    assert {dep for name, own, dep in _layer_edges() if own == "core"} == set()


def test_only_cli_imports_cli():
    assert sorted(name for name, own, dep in _layer_edges() if dep == "cli") == []


def test_no_private_name_is_taken_from_another_package():
    offenders = sorted(
        (name, dep, n)
        for name, deps in _graph().items()
        for dep, names in deps.items()
        for n in names
        if layer(dep) != layer(name) and n.startswith("_") and not n.startswith("__")
    )
    assert offenders == []


def test_cycle_finder_finds_a_hand_made_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == {frozenset({"a", "b", "c"})}


def test_no_import_cycle_between_packages_or_modules():
    graph = _graph()
    packages: dict[str, set[str]] = {}
    for name, deps in graph.items():
        packages.setdefault(layer(name), set()).update(layer(d) for d in deps if layer(d) != layer(name))
    assert _cycles(packages) == set()
    modules = {name: set(deps) for name, deps in graph.items()}
    # A package's __init__ re-exports its modules, and a module may import a sibling through the package name
    # (`from gtpo import core`), so the edges into and out of __init__ files are left out here.
    inits = {name for name, path in _modules().items() if path.name == "__init__.py"}
    modules = {n: {d for d in deps if d not in inits} for n, deps in modules.items() if n not in inits}
    assert [sorted(c) for c in _cycles(modules)] == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_every_layer_is_a_package_with_a_docstring():
    packages = [p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    assert {p.name for p in packages} == {
        "core",
        "decoding",
        "forward",
        "grading",
        "tasks",
        "trainer",
        "runs",
        "eval",
        "compare",
        "inspection",
        "cli",
    }
    for p in packages:
        doc = ast.get_docstring(ast.parse((p / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, f"{p.name}/__init__.py needs a docstring saying what it is"
