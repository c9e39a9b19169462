"""The api's layers: routes hold HTTP only and share their work through serving/, never through each
other.

Read from the source with `ast`, so it holds for every module, not only the ones a test happens to
import.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[2] / "services"
API = SERVICES / "api"
ROUTES = "services.api.routes"


def imported(path: Path, package: str) -> set[str]:
    """Every dotted name `path` imports anywhere (module level, in a function, under TYPE_CHECKING);
    `from a import b` counts as `a.b`, relative imports are resolved from `package`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def route_imports(routes_dir: Path, routes: str) -> dict[str, set[str]]:
    """Route module -> the route modules (or the routes package) it imports."""
    found = {}
    for path in sorted(routes_dir.glob("*.py")):
        if path.name == "__init__.py":  # the package gathers the routers: that is its job
            continue
        own = f"{routes}.{path.stem}"
        hits = {n for n in imported(path, routes) if (n == routes or n.startswith(f"{routes}.")) and n != own}
        found[path.stem] = hits
    return found


def test_no_route_module_imports_another():
    found = route_imports(API / "routes", ROUTES)
    assert len(found) >= 8  # the scan really reads the routes
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_the_route_scan_sees_absolute_relative_and_nested_imports(tmp_path):
    routes = tmp_path / "routes"
    routes.mkdir()
    (routes / "__init__.py").write_text("from pkg.routes import a, b\n")
    (routes / "a.py").write_text("from pkg.routes.b import helper\n")
    (routes / "b.py").write_text("def f():\n    from . import c\n")
    (routes / "c.py").write_text("import pkg.routes\nfrom pkg.serving import helper\n")
    (routes / "d.py").write_text("from pkg.serving import helper\n")
    found = route_imports(routes, "pkg.routes")
    assert found["a"] == {"pkg.routes.b", "pkg.routes.b.helper"}
    assert found["b"] == {"pkg.routes", "pkg.routes.c"}
    assert found["c"] == {"pkg.routes"}
    assert found["d"] == set() and "__init__" not in found


def test_serving_holds_no_http():
    http = ("fastapi", "starlette", ROUTES, "services.api.deps")
    modules = sorted((API / "serving").glob("*.py"))
    assert len(modules) >= 4
    offenders = {
        f"{path.name}: {name}"
        for path in modules
        for name in imported(path, "services.api.serving")
        if any(name == layer or name.startswith(f"{layer}.") for layer in http)
    }
    assert offenders == set()
