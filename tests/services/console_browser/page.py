"""What the console's browser tests share: the stack they drive, the page and its helpers.

The tests run Debian's Chromium through Playwright against `openbook up` (`conftest.py` starts both).
Screenshots of each panel go to test-artifacts/console/ (or $OPENBOOK_TEST_ARTIFACTS/console).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
KEY = "console-test-key"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium phones home, and a closed network refuses its connections.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000
TRAINING_WAIT_MS = 120_000


def chromium() -> str:
    found = (
        os.environ.get("OPENBOOK_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not found:
        pytest.skip(
            "Chromium is not installed, so the console's browser tests cannot run: "
            "`apt-get install chromium` (make test tries it when run as root), or set OPENBOOK_CHROMIUM"
        )
    return found


@dataclass
class Stack:
    base: str
    http: httpx.Client  # with the key: what the test checks through the api, not the page

    def examples(self, task: str) -> list[dict]:
        return self.http.get(f"/v1/tasks/{task}/examples", params={"limit": 1000}).json()["examples"]


@dataclass
class Console:
    page: object
    base: str
    shots: Path
    requests: list[str] = field(default_factory=list)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name).click()

    def foreign_requests(self) -> list[str]:
        origin = urlsplit(self.base)[:2]
        return [url for url in self.requests if urlsplit(url)[:2] != origin]


@contextlib.contextmanager
def console_on(browser, base: str) -> Iterator[Console]:
    shots = Path(os.environ.get("OPENBOOK_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "console"
    shots.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 800})  # a fresh sessionStorage
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    opened = Console(page, base, shots)
    context.on("request", lambda request: opened.requests.append(request.url))
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def open_console(console: Console) -> None:
    console.page.goto(f"{console.base}/")
    console.page.wait_for_selector("body[data-ready=true]")


def open_on_task(console: Console, stack: Stack, task: dict) -> None:
    """Create `task` through the api, then open the console on it with the write key given."""
    assert stack.http.post("/v1/tasks", json=task).status_code == 201
    console.page.add_init_script(f"sessionStorage.setItem('openbook.apiKey', {json.dumps(KEY)});")
    console.page.add_init_script(f"sessionStorage.setItem('openbook.task', {json.dumps(task['name'])});")
    open_console(console)


def csv_file(name: str, rows: list[tuple]) -> dict:
    lines = ["text,label,id"] + [
        ",".join(f'"{c}"' if isinstance(c, str) else str(c) for c in row) for row in rows
    ]
    return {"name": name, "mimeType": "text/csv", "buffer": "\n".join(lines).encode()}
