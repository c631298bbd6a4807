"""The shape of the code, kept by tests (docs/architecture.md states the rules):

- no import cycles among ``core`` modules, imports under ``TYPE_CHECKING`` and inside
  functions included;
- ``core`` imports no plugin, backend or hardware module;
- a plugin or backend package imports another package only through its public
  ``__init__`` (never its modules), and nobody imports another package's private names;
- the project has one percentile function;
- no source file over ~800 lines without a reason written at its top.

Imports are read from the source (``ast``), not by importing it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("core", "plugins", "backends", "hardware")
LONG_FILE_LINES = 850
LONG_FILE_MARK = "Why this file is long:"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "shuniu." + ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for top in TOPS for p in (ROOT / top).rglob("*.py")}


SOURCES = _sources()


def _imports(path: Path) -> Iterator[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` of every shuniu import in ``path``,
    wherever it stands (top level, ``TYPE_CHECKING``, inside a function)."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("shuniu."):
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shuniu"):
            for alias in node.names:
                yield node.module, alias.name, node.lineno


def _targets(module: str, name: str | None) -> list[str]:
    """The source modules an import loads: the module, or the submodule it names."""
    if name is not None and f"{module}.{name}" in SOURCES:
        return [f"{module}.{name}"]
    return [module] if module in SOURCES else []


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_core_has_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for module, path in SOURCES.items():
        if not module.startswith("shuniu.core"):
            continue
        edges = graph.setdefault(module, set())
        for imported, name, _line in _imports(path):
            for target in _targets(imported, name):
                # A package's own __init__ is loaded before its modules: not a cycle.
                if target.startswith("shuniu.core") and target != module and target not in _ancestors(module):
                    edges.add(target)
    # Tarjan's strongly connected components: every component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles in core: {cycles}"


def _package_of(module: str) -> str:
    """The unit that owns ``module``: ``shuniu.core``, ``shuniu.hardware``, a backend
    (``shuniu.backends.vllm``), a plugin package (``shuniu.plugins.balancers``) or a tool
    (``shuniu.plugins.tools.simulate``)."""
    parts = module.split(".")
    if parts[1] in ("core", "hardware") or len(parts) < 3:
        return ".".join(parts[:2])
    if parts[1] == "plugins" and parts[2] == "tools" and len(parts) > 3:
        return ".".join(parts[:4])
    return ".".join(parts[:3])


def _violations() -> Iterator[str]:
    for module, path in sorted(SOURCES.items()):
        own = _package_of(module)
        where = path.relative_to(ROOT)
        for imported, name, line in _imports(path):
            target = _package_of(imported)
            if own == "shuniu.core" and target != "shuniu.core":
                yield f"{where}:{line}: core imports {imported} (core never imports a plugin)"
                continue
            if target in (own, "shuniu.core"):
                continue
            if imported != target:
                yield f"{where}:{line}: {imported} is a module of {target}; use {target}'s public API"
            elif name is not None and name.startswith("_"):
                yield f"{where}:{line}: {name} is private to {target}"


def test_packages_use_only_each_others_public_api() -> None:
    assert sorted(set(_violations())) == []


def test_the_project_has_one_percentile_function() -> None:
    found = []
    for path in [*ROOT.glob("*/**/*.py")]:
        if ".venv" in path.parts or "build" in path.parts:
            continue
        tree = ast.parse(path.read_text("utf-8"), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name.lstrip("_") == "percentile"
            ):
                found.append(str(path.relative_to(ROOT)))
    assert found == ["core/stats.py"]


@pytest.mark.parametrize(
    "folder", ["core", "plugins", "backends", "hardware", "tests", "benchmarks", "examples"]
)
def test_long_files_say_why(folder: str) -> None:
    unexplained = []
    for path in (ROOT / folder).rglob("*.py"):
        lines = path.read_text("utf-8").splitlines()
        if len(lines) > LONG_FILE_LINES and not any(LONG_FILE_MARK in line for line in lines[:40]):
            unexplained.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert unexplained == [], f"split these, or say at the top ({LONG_FILE_MARK!r}) why they are one file"
