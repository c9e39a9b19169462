"""The browser (launched once for these tests) and an `openbook up` stack per test module.

The stack runs as `python -m services.cli up` on the tiny random causal model (a module may override
`stack_backbone`), with a write key, so the console has to ask for it. Each module gets a fresh one:
the walkthrough starts from no task.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from services.api.console import mount_console
from services.bus.server import free_port
from tests.chaos.stack import UpStack
from tests.services.console_browser.page import (
    CHROMIUM_FLAGS,
    KEY,
    WAIT_MS,
    Console,
    Stack,
    chromium,
    console_on,
)


@pytest.fixture(scope="package")
def browser():
    executable = chromium()
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (requirements-dev.txt)")
    expect.set_options(timeout=WAIT_MS)  # a task's creation loads its backbone: seconds on 2 busy cores
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def stack_backbone(causal_dir: Path) -> Path:
    """The stack's default backbone; a module overrides this fixture to run on another."""
    return causal_dir


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, stack_backbone: Path) -> Iterator[Stack]:
    chromium()  # no stack to start when there is no browser to drive it
    up = UpStack(tmp_path_factory.mktemp("console"), stack_backbone, api_key=KEY)
    # The console's walk-through serves the version its two training steps make, whatever the first gate
    # would say of them against the untrained task (the gate's own tests: tests/services/test_versions.py).
    up.env["OPENBOOK_UNTRAINED_GATE"] = "false"
    up.start()
    try:
        up.wait_ready()  # a failure carries the tail of up's log
        with httpx.Client(base_url=up.base, headers={"X-API-Key": KEY}, timeout=30) as http:
            yield Stack(up.base, http)
    finally:
        code = up.stop()  # SIGTERM: `up` stops the api, the worker and Redis
    assert code == 0, up.log()[-3000:]


@pytest.fixture()
def console(browser, stack: Stack) -> Iterator[Console]:
    with console_on(browser, stack.base) as opened:
        yield opened


@pytest.fixture()
def static_console(browser) -> Iterator[Console]:
    """The console's files alone, on an app with no task, Redis or model: for the page's own code."""
    app = FastAPI()
    mount_console(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the static server did not start"
        time.sleep(0.05)
    try:
        with console_on(browser, f"http://127.0.0.1:{server.config.port}") as opened:
            yield opened
    finally:
        server.should_exit = True
        thread.join(timeout=10)
