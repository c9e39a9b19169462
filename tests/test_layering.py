"""Arrows point down only: research -> services -> openbook. The shipped packages (`shared/openbook`,
`services`) import nothing from the laboratory (`research/`, which is not installed with them)."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = (ROOT / "shared" / "openbook", ROOT / "services")


def imported_names(path: Path) -> list[str]:
    """Every module an `import` or absolute `from ... import` of the file names, wherever it stands."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_no_shipped_module_imports_the_laboratory():
    modules = sorted(path for package in SHIPPED for path in package.rglob("*.py"))
    assert len(modules) > 50  # the scan really reads both packages
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in modules
        for name in imported_names(path)
        if name.split(".")[0] == "research"
    ]
    assert offenders == []


def test_the_scan_sees_imports_inside_functions_and_from_imports(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from research.cli import main\n    import research\n")
    assert imported_names(module) == ["os", "research.cli", "research"]


def test_the_laboratory_is_not_installed_with_the_product():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["openbook*", "services*"]
