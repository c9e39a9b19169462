"""The stack as processes: embedded Redis, `openbook serve` and `openbook worker`, driven over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.bus.server import EmbeddedRedis, free_port
from services.client import wait_ready as client_wait_ready

TASK = {"name": "reviews", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}


def start(command: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "services.cli", command], env=env)


def wait_ready(base: str, process: subprocess.Popen[bytes]) -> None:
    assert client_wait_ready(base, timeout=60, alive=lambda: process.poll() is None), (
        "the api did not get ready"
    )


@pytest.fixture()
def stack(tmp_path: Path, causal_dir: Path):
    with EmbeddedRedis(tmp_path / "redis") as server:
        port = free_port()
        env = {
            **os.environ,
            "OPENBOOK_REDIS_URL": server.url,
            "OPENBOOK_DEFAULT_BACKBONE": str(causal_dir),
            "OPENBOOK_MAX_LENGTH": "48",
            "OPENBOOK_PORT": str(port),
            "OPENBOOK_DATA_DIR": str(tmp_path / "data"),
            # the walk-through's point is a crash: its job is served whatever the first gate would say
            "OPENBOOK_UNTRAINED_GATE": "false",
        }
        processes: list[subprocess.Popen[bytes]] = []
        yield env, f"http://127.0.0.1:{port}", processes
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)


def test_walkthrough_with_a_crash(stack) -> None:
    env, base, processes = stack
    processes.append(api := start("serve", env))
    wait_ready(base, api)
    assert httpx.post(f"{base}/v1/tasks", json=TASK, timeout=30).status_code == 201

    acknowledged = []
    for i in range(12):
        example = {
            "text": f"a good film number {i}" if i % 2 else f"a bad film number {i}",
            "label": str(i % 2),
            "id": i,
        }
        response = httpx.post(f"{base}/v1/tasks/reviews/examples", json={"examples": [example]}, timeout=30)
        assert response.status_code == 201
        acknowledged.append(i)
    neighbours = httpx.post(
        f"{base}/v1/tasks/reviews/classify", json={"texts": ["a good film"], "neighbours": True}, timeout=30
    ).json()["predictions"][0]["neighbours"]
    assert {n["id"] for n in neighbours} <= set(acknowledged) and neighbours

    api.send_signal(signal.SIGKILL)  # a crash: nothing is flushed on the way out
    api.wait()
    processes.append(api := start("serve", env))
    wait_ready(base, api)
    page = httpx.get(f"{base}/v1/tasks/reviews/examples", params={"limit": 1000}, timeout=30).json()
    assert [e["id"] for e in page["examples"]] == acknowledged  # every acknowledged example survived

    processes.append(start("worker", env))
    job = httpx.post(
        f"{base}/v1/tasks/reviews/train",
        json={"method": "prompt-ft", "steps": 4, "batch_size": 4, "lr": 1e-3, "eval_every": 2},
        timeout=30,
    ).json()
    deadline = time.monotonic() + 120
    while (record := httpx.get(f"{base}/v1/jobs/{job['id']}", timeout=10).json())["state"] not in (
        "succeeded",
        "failed",
    ):
        assert time.monotonic() < deadline, record
        time.sleep(0.3)
    assert record["state"] == "succeeded", record
    version = record["published"]["version"]
    while (
        served := httpx.post(f"{base}/v1/tasks/reviews/classify", json={"texts": ["fine"]}, timeout=30).json()
    )["model_version"] != version:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert served["predictions"][0]["label"] in {"0", "1"}
