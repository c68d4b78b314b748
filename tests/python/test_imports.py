"""No import cycles among python/gradswitch's modules.

Every import statement of every module (at the top or inside a function: a lazy import that dodges a
cycle at import time is still a cycle between the modules) is read with ast, without importing
anything; imports under `if TYPE_CHECKING:` do not run and do not count. `from pkg import name`
counts as an import of pkg.name when that is a module, else of pkg; importing a module's parent
package implicitly (as Python does first) does not count. The compiled extension `_core` is a module
through its stub, _core.pyi.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "gradswitch"


def modules(package: Path) -> dict[str, tuple[Path | None, bool]]:
    """Module name -> (source file or None for a stub-only extension, whether it is a package)."""
    found: dict[str, tuple[Path | None, bool]] = {}
    for path in sorted(package.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        if path.suffix == ".py":
            found[name] = (path, is_package)
        else:
            found.setdefault(name, (None, False))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import and ImportFrom node that runs, skipping the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line of the first such import}, within the package."""
    mods = modules(package)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {name: {} for name in mods}
    for name, (path, is_package) in mods.items():
        if path is None:
            continue
        here = name.split(".") if is_package else name.split(".")[:-1]
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for a in node.names:
                    sub = f"{module}.{a.name}"
                    targets.append(sub if sub in mods else module)
            for t in targets:
                t = known(t)
                if t and t != name:
                    graph[name][t] = min(graph[name].get(t, node.lineno), node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    inside = set(component)
    lines = [" <-> ".join(component)]
    for v in component:
        for w, line in sorted(graph[v].items()):
            if w in inside:
                lines.append(f"    {v} imports {w} (line {line})")
    return "\n".join(lines)


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "gradswitch.testbed.core" in graph and "gradswitch._core" in graph  # the walk found them
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(graph, c) for c in found)


def test_the_check_finds_a_cycle_of_lazy_imports_and_skips_type_checking(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (pkg / "sub" / "b.py").write_text("from pkg.sub import a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import x\n"
    )
    (pkg / "d.py").write_text("from . import c\n")
    graph = import_graph(pkg)
    assert graph["pkg.sub.b"] == {"pkg.sub.a": 1}  # `from pkg.sub import a` names the module a
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b"]]
