"""What the api tests share: task specs, settings on the tiny backbone, the app under a real uvicorn."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from services.api.settings import Settings
from services.bus.server import free_port

TASK = {"name": "reviews", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}
# Eight short reviews, four per label of TASK: enough for a job on the tiny backbone to train and publish.
TRAINING_EXAMPLES = [
    ("the movie was great and fun", "1"),
    ("a good film with a great cast", "1"),
    ("great fun", "1"),
    ("a good film", "1"),
    ("it was terrible and boring", "0"),
    ("a bad film , it was awful", "0"),
    ("boring and bad", "0"),
    ("a terrible film", "0"),
]
# A task whose store alone judges (k=3, T=0.01, lambda=1), and examples in two clusters that the tiny random
# model tells apart (one sentence each, behind different first words), with one example of the first
# labelled as the second: leave-one-out, its neighbours all say "a", so it is the report's top suspect.
CLUSTERS_TASK = {
    "name": "clusters",
    "template": "{text} It was {mask}",
    "labels": {"a": "good", "b": "bad"},
    "knn": {"k": 3, "temperature": 0.01, "lam": 1.0},
}
MISLABELLED = 42
_WORDS = ("yes", "no", "so", "it", "a")
CLUSTER_EXAMPLES = [
    *({"text": f"{w} the movie was great and fun", "label": "a", "id": i} for i, w in enumerate(_WORDS)),
    *(
        {"text": f"{w} who wrote the book about the river", "label": "b", "id": 10 + i}
        for i, w in enumerate(_WORDS)
    ),
    {"text": "the movie was great and fun", "label": "b", "id": MISLABELLED},
]
PAIR_TASK = {
    "name": "pairs",
    "template": "{text_a} ? {text_b} Answer: {mask}",
    "labels": {"yes": "good", "no": "bad"},
}


def api_settings(redis_url: str, backbone: Path, **overrides) -> Settings:
    return Settings(redis_url=redis_url, default_backbone=str(backbone), max_length=48, **overrides)


@contextmanager
def serving(app: FastAPI, *, timeout: float = 30.0) -> Iterator[str]:
    """Run `app` under uvicorn on a free loopback port in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


def wait_for(condition, timeout: float = 30.0):
    """`condition()`'s first truthy value, polled every 50 ms; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")
