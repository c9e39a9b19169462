"""The house's arrows point one way: research -> services -> openbook; within services, the HTTP layer
(api) -> the engine -> the bus, and the trainer -> the engine's task spec and the bus. The shipped
packages (`shared/openbook`, `services`) import nothing from the laboratory (`research/`, which is not
installed with them).

Read from the source with `ast`, every import wherever it stands (module level, in a function, under
TYPE_CHECKING): a type-only import is still an arrow a reader follows.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.test_import_cycles import cycles, import_edges

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "openbook": ROOT / "shared" / "openbook",
    "services": ROOT / "services",
    "research": ROOT / "research",
}


def imports(path: Path) -> set[str]:
    """Every absolute module name `path` imports (`from a.b import c` counts as a.b and a.b.c)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def offenders(folders: list[Path], forbidden: tuple[str, ...], at_least: int = 1) -> list[str]:
    """'file: module' for each import under `folders` of a module in (or under) `forbidden`; the file is
    named from its folder's parent (`bus/jobs.py`)."""
    files = [(folder, path) for folder in folders for path in sorted(folder.rglob("*.py"))]
    assert len(files) >= at_least, f"too few modules to scan under {folders}"
    return [
        f"{path.relative_to(folder.parent)}: {name}"
        for folder, path in files
        for name in sorted(imports(path))
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package):
    edges = import_edges(PACKAGES[package])
    assert len(edges) > 20  # the scan really reads the package
    assert cycles(edges) == []


def test_no_shipped_module_imports_the_laboratory():
    shipped = [PACKAGES["openbook"], PACKAGES["services"]]
    assert offenders(shipped, ("research",), at_least=50) == []


def test_the_laboratory_is_not_installed_with_the_product():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["openbook*", "services*"]


def test_the_bus_is_transport_only():
    """Redis Streams and keys: nothing of HTTP, of the engine, of the trainer or of the methods."""
    forbidden = ("services.api", "services.engine", "services.trainer", "openbook.methods", "fastapi")
    assert offenders([ROOT / "services" / "bus"], forbidden, at_least=10) == []


def test_the_engine_knows_nothing_of_http():
    forbidden = ("services.api", "services.trainer", "services.cli", "fastapi", "starlette")
    assert offenders([ROOT / "services" / "engine"], forbidden, at_least=10) == []


def test_the_trainer_knows_nothing_of_http():
    forbidden = ("services.api", "services.cli", "fastapi", "starlette")
    assert offenders([ROOT / "services" / "trainer"], forbidden, at_least=2) == []


def test_the_scan_sees_imports_inside_functions_and_from_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("def f():\n    from services.api.app import create_app\n")
    (package / "b.py").write_text("import services.apiary\nimport os\nimport research\n")
    assert offenders([package], ("services.api",)) == [
        "pkg/a.py: services.api.app",
        "pkg/a.py: services.api.app.create_app",
    ]
    assert offenders([package], ("research",)) == ["pkg/b.py: research"]
