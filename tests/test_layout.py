"""The package layout is the architecture: imports point one way (docs/architecture.md).

commands → studies → run → collect; run, studies and collect may use analyze and report (run and
studies view too); everything may use the shared vocabulary at the root (records, errors, atomic,
rundir, safe_read, parent_death). analyze and report import neither torch nor pynvml nor any layer
above them.
Checked on the source, every import, including the ones inside functions (and the ones only a
type checker follows), so a lazy import cannot hide a wrong arrow. Inside the layers: no import
circle between modules (two modules that import each other are one idea, or a third is missing),
and no folder with more than ``MAX_MODULES`` modules (a shared file-name prefix is a folder
asking to exist).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mgprof"

SHARED = {"records", "errors", "atomic", "rundir", "safe_read", "parent_death"}
# layer -> the layers (and the common modules at the root) its modules may import
S = {"common"}
ALLOWED: dict[str, set[str]] = {
    "common": S,
    "analyze": S | {"analyze"},
    "report": S | {"analyze", "report"},
    "view": S | {"view"},
    # collect's rank 0 writes the report files when no launcher does: analyze and report are
    # pure layers below it that never import collect, so the arrow still points one way
    "collect": S | {"collect", "analyze", "report"},
    "run": S | {"run", "collect", "analyze", "report", "view"},
    "studies": S | {"studies", "run", "collect", "analyze", "report", "view"},
    "commands": S | {"commands", "studies", "run", "collect", "analyze", "report", "view"},
    "cli": S | {"commands"},
    "testing": S | {"collect"},
    # framework callbacks on the public API (``import mgprof``): the only place the frameworks
    # are imported
    "integrations": S | {"integrations"},
    "package": {"package"},  # mgprof/__init__.py maps public names lazily, by string
    "main": {"cli"},
}
PURE = {"analyze", "report"}
MAX_MODULES = 15
"""Modules a folder may hold (``__init__.py`` not counted), as HTA keeps its folders."""


def _layer(module: str) -> str:
    """``mgprof.collect.session.session`` -> ``collect``; root modules are their own layer."""
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    head = parts[1]
    if head in SHARED:
        return "common"
    if head == "__main__":
        return "main"
    return head


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append((".".join(parts), path))
    return found


def _imports(path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            if stem == "mgprof":
                names.extend(f"mgprof.{alias.name}" for alias in node.names)
            else:
                names.append(stem)
    return names


MODULES = _modules()


def test_every_module_has_a_known_layer() -> None:
    unknown = {m for m, _ in MODULES if _layer(m) not in ALLOWED}
    assert not unknown, f"modules outside the documented layout: {sorted(unknown)}"


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_one_way(module: str, path: Path) -> None:
    layer = _layer(module)
    wrong = []
    for name in _imports(path, module):
        top = name.split(".")[0]
        if layer in PURE and top in {"torch", "pynvml"}:
            wrong.append(name)
        if top != "mgprof" or name == "mgprof":
            continue
        if name == "mgprof.__version__":
            continue
        target = _layer(name)
        if target not in ALLOWED[layer] and target != layer:
            wrong.append(name)
    assert not wrong, f"{module} ({layer}) imports {wrong}; allowed: {sorted(ALLOWED[layer])}"


def test_the_checker_sees_a_wrong_arrow(tmp_path: Path) -> None:
    """The rule fires on a real violation, including a lazy import inside a function."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from mgprof.run.launcher import launch\n    import torch\n")
    names = _imports(bad, "mgprof.collect.bad")
    assert "mgprof.run.launcher" in names and "torch" in names
    assert _layer("mgprof.run.launcher") not in ALLOWED["collect"]


def test_no_module_is_loose_at_the_root() -> None:
    root = {p.stem for p in PACKAGE.glob("*.py")}
    assert root == {"__init__", "__main__", "cli", "testing"} | SHARED


def _module_edges(path: Path, module: str, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports: ``from pkg import mod`` is an edge to
    ``pkg.mod``, ``from mod import name`` an edge to ``mod``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            found.add(stem)
            found.update(f"{stem}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != module}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circle() -> None:
    known = {m for m, _ in MODULES}
    graph = {m: _module_edges(path, m, known) for m, path in MODULES}
    circles = _circles(graph)
    assert not circles, f"modules that import each other (directly or round a circle): {circles}"


def test_the_circle_finder_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_folder_is_crowded() -> None:
    crowded = {
        str(folder.relative_to(PACKAGE.parent)): n
        for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if (n := len([f for f in folder.glob("*.py") if f.name != "__init__.py"])) > MAX_MODULES
    }
    assert not crowded, f"folders past {MAX_MODULES} modules: {crowded}"
