"""Fixtures for the api tests: a real embedded Redis per test, and the app on the tiny causal backbone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.bus.server import EmbeddedRedis
from tests.services.harness import api_settings


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path / "redis") as running:
        yield running


@pytest.fixture()
def make_client(server: EmbeddedRedis, causal_dir: Path) -> Callable[..., TestClient]:
    """`make_client(**settings)`: a TestClient (enter it to run the lifespan) on this test's Redis."""

    def make(**overrides) -> TestClient:
        overrides.setdefault("redis_url", server.url)
        return TestClient(create_app(api_settings(backbone=causal_dir, **overrides)))

    return make
