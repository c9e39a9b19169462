"""The import scan behind tests/test_layering.py's cycle checks: every module can be read, tested and
moved after what it imports.

An edge is any import of another module of the same package, wherever it stands: at module level, inside a
function, or under `TYPE_CHECKING` (a cycle through type hints is still two modules that cannot be
understood apart). Importing a submodule (`openbook.methods.base`) is an edge to that submodule
only, not to the package's `__init__`.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at `root` (a package is its __init__)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_edges(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source."""
    modules = module_names(root)
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, `level - 1` packages up
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import sub` imports the submodule `pkg.sub` when there is one
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:  # `import openbook.a.b` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_scan_finds_cycles_through_functions_type_hints_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (package / "a.py").write_text("def f():\n    from pkg.sub.b import g\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n"
    )
    (package / "c.py").write_text("import pkg.sub.b\n")
    (package / "d.py").write_text("from pkg import c\n")
    edges = import_edges(package)
    assert edges["pkg.a"] == {"pkg.sub.b"} and edges["pkg.sub.b"] == {"pkg.a"}
    assert edges["pkg.d"] == {"pkg.c"} and edges["pkg.sub"] == {"pkg.sub.b"}
    assert cycles(edges) == [["pkg.a", "pkg.sub.b"]]
