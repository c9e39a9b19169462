"""The browser (launched once for these tests) and an `openbook up` stack per test module.

The stack runs as `python -m services.cli up` on the tiny random causal model (a module may override
`stack_backbone`), with a write key, so the console has to ask for it. Each module gets a fresh one:
the walkthrough starts from no task.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
from services.client import wait_ready
from tests.services.console_browser.page import (
    CHROMIUM_FLAGS,
    KEY,
    ROOT,
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
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBOOK_REDIS_URL", "REDIS_URL")}
    env |= {
        "OPENBOOK_DATA_DIR": str(tmp_path_factory.mktemp("console-data")),
        "OPENBOOK_PORT": str(port),
        "OPENBOOK_DEFAULT_BACKBONE": str(stack_backbone),
        "OPENBOOK_MAX_LENGTH": "48",
        "OPENBOOK_API_KEY": KEY,
        "OPENBOOK_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT), env.get("PYTHONPATH", "")]),
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up"], env=env, cwd=ROOT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(base, timeout=90, alive=lambda: up.poll() is None), "openbook up did not get ready"
        with httpx.Client(base_url=base, headers={"X-API-Key": KEY}, timeout=30) as http:
            yield Stack(base, http)
    finally:
        up.send_signal(signal.SIGTERM)  # `up` stops the api, the worker and Redis
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)


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
