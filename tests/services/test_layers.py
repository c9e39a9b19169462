"""The api's layers: routes hold HTTP only and share their work through serving/, never through each
other; a task's runtime changes only through its own methods (services/engine/runtime.py).

Both are read from the source with `ast`, so they hold for every module, not only the ones a test
happens to import.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from services.engine.runtime import TaskRuntime

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


RUNTIME_FIELDS = frozenset(f.name for f in dataclasses.fields(TaskRuntime))


def _is_a_runtime(node: ast.expr) -> bool:
    """`runtime`, `self.runtime`, `old_runtime`...: how the services name a TaskRuntime."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("runtime")


def runtime_field_writes(source: str) -> list[str]:
    """Each `runtime.<field> = ...` (augmented, annotated, in a tuple, or into the field's item) in
    `source`, as `line: runtime.<field>`."""
    writes = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets += target.elts
            elif isinstance(target, ast.Starred | ast.Subscript):
                targets.append(target.value)
            elif (
                isinstance(target, ast.Attribute)
                and target.attr in RUNTIME_FIELDS
                and _is_a_runtime(target.value)
            ):
                writes.append(f"{node.lineno}: {ast.unparse(target)}")
    return writes


def test_only_runtime_py_writes_a_task_runtimes_fields():
    modules = sorted(p for p in SERVICES.rglob("*.py") if p != API / "runtime.py")
    assert len(modules) > 50 and {"task", "classifier", "spec", "swap_error"} <= RUNTIME_FIELDS
    offenders = [
        f"{p.relative_to(SERVICES)}:{w}" for p in modules for w in runtime_field_writes(p.read_text())
    ]
    assert offenders == []


def test_the_field_scan_sees_every_kind_of_write():
    source = "\n".join(
        [
            "runtime.task = task",
            "self.runtime.spec: bytes = raw",
            "old_runtime.offset += '1'",
            "runtime.classifier, runtime.model_version = c, v",
            "runtime.texts[3] = 'x'",
            "batch.texts += 2",  # not a runtime
            "runtime.unknown = 1",  # not a field
            "self.task = task",
        ]
    )
    assert runtime_field_writes(source) == [
        "1: runtime.task",
        "2: self.runtime.spec",
        "3: old_runtime.offset",
        "4: runtime.model_version",
        "4: runtime.classifier",
        "5: runtime.texts",
    ]
