"""The console's files as the api serves them: no Redis, no model, no browser."""

from __future__ import annotations

import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.console import STATIC_DIR
from services.api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# A URL the page could fetch; SVG's namespace name is an identifier that nothing fetches.
ABSOLUTE_URL = re.compile(r"https?://(?!www\.w3\.org/2000/svg\b)", re.IGNORECASE)
MODULE_IMPORT = re.compile(r"""^import\s.*?from\s+["'](\./[^"']+)["']""", re.MULTILINE)


class _References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.references: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "action") and value:
                self.references.append(value)


@pytest.fixture(scope="module")
def client() -> TestClient:
    # Not entered as a context manager: the lifespan (Redis, tasks) never starts, and static files
    # need none of it.
    return TestClient(create_app(Settings(redis_url="redis://127.0.0.1:1/0")))


def test_the_page_its_modules_and_styles_are_served_with_their_types(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not ABSOLUTE_URL.search(page.text), "the page must work offline, from its own origin"
    parser = _References()
    parser.feed(page.text)
    assert "/console/console.css" in parser.references and "/console/js/app.js" in parser.references

    expected = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
    pending, seen = [r for r in parser.references if r.startswith("/console/")], set()
    while pending:  # every module the entry point imports, transitively
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].split(";")[0] == expected[Path(path).suffix], path
        if path.endswith(".js"):
            assert not ABSOLUTE_URL.search(response.text), path
            base = path.rsplit("/", 1)[0]
            pending += [f"{base}/{name.removeprefix('./')}" for name in MODULE_IMPORT.findall(response.text)]
    served = {f"/console/{p.relative_to(STATIC_DIR).as_posix()}" for p in STATIC_DIR.rglob("*.js")}
    assert served <= seen, f"modules never imported: {served - seen}"


def test_the_api_keeps_its_routes_and_json_errors(client: TestClient) -> None:
    assert client.get("/docs").headers["content-type"].startswith("text/html")
    schema = client.get("/openapi.json").json()
    assert "/" not in schema["paths"] and not any(p.startswith("/console") for p in schema["paths"])
    missing = client.get("/v1/no-such-route")
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    assert client.get("/console/js/no-such-module.js").status_code == 404


def test_every_static_file_is_installed_with_the_package() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "services.api"
    ]
    # globbed from the package's folder, as setuptools does
    installed = {path for pattern in patterns for path in STATIC_DIR.parent.glob(pattern)}
    files = {path for path in STATIC_DIR.rglob("*") if path.is_file()}
    assert files and files <= installed, f"not in package-data: {sorted(map(str, files - installed))}"
