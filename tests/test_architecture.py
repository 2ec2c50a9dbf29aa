"""The architecture keeps its shape: imports run one way, no cycles, the linter passes.

Layers, highest first (docs/ARCHITECTURE.md): a module imports only from its own package or
from layers below it; packages sharing a layer do not import each other.

    pages / app.py > ui > lab.figures > lab.scenarios > lab.vllm > lab.serving | lab.model
    > lab.sizing > lab.memory > kernels

The import graph is read from the source (every `import`, at any depth, TYPE_CHECKING ones
included), so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS: list[tuple[str, ...]] = [
    ("pages", "app"),
    ("ui",),
    ("lab.figures",),
    ("lab.scenarios",),
    ("lab.vllm",),
    ("lab.serving", "lab.model"),
    ("lab.sizing",),
    ("lab.memory",),
    ("kernels",),
]
PACKAGES = [name for layer in LAYERS for name in layer]
OWN = ("lab", "kernels", "ui", "pages", "app")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def sources() -> dict[str, Path]:
    """Every module of the app (not tests or benchmarks), by dotted name."""
    files = [ROOT / "app.py", *ROOT.glob("pages/*.py")]
    for top in ("lab", "kernels", "ui"):
        files += (ROOT / top).rglob("*.py")
    return {module_name(f): f for f in files}


@cache
def import_graph() -> dict[str, set[str]]:
    """module -> the app's own modules it imports."""
    known = sources()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets.add(node.module)
                # `from lab.memory import block_pool` imports the module lab.memory.block_pool
                targets.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {_resolve(t, known) for t in targets if t.split(".")[0] in OWN} - {None}
    return graph


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def package_of(module: str) -> str:
    """The layer package a module belongs to ("lab" itself sits with the scenarios' users)."""
    for name in sorted(PACKAGES, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    if module == "lab":
        return "lab"
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_module_has_a_layer() -> None:
    for module in sources():
        if module != "lab":
            package_of(module)


def test_imports_run_one_way() -> None:
    wrong = []
    for module, targets in import_graph().items():
        if module == "lab":
            assert not targets, "lab/__init__.py is documentation only"
            continue
        source = package_of(module)
        for target in targets:
            dest = package_of(target)
            if dest == "lab":
                continue
            if dest != source and layer_of(dest) <= layer_of(source):
                wrong.append(f"{module} ({source}) imports {target} ({dest})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_files() -> None:
    graph = {m: t - {m} for m, t in import_graph().items()}
    assert not _cycles(graph)


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in import_graph().items():
        source = package_of(module)
        packages[source] |= {package_of(t) for t in targets} - {source}
    assert not _cycles(dict(packages))


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("library, allowed", [("streamlit", ("ui", "pages", "app")),
                                              ("plotly", ("ui", "pages", "app", "lab.figures"))])
def test_the_engine_imports_no_ui_library(library: str, allowed: tuple[str, ...]) -> None:
    offenders = []
    for module, path in sources().items():
        if package_of(module) in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == library or n.startswith(library + ".") for n in names):
                offenders.append(module)
    assert not offenders, f"{library} imported by {sorted(set(offenders))}"


def test_lab_holds_packages() -> None:
    top_level = sorted(p.name for p in (ROOT / "lab").glob("*.py"))
    assert top_level == ["__init__.py"], top_level
    assert {p.name for p in (ROOT / "lab").iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == {"memory", "serving", "model", "sizing", "scenarios", "vllm", "figures"}


def test_ruff_passes_on_the_whole_tree() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
