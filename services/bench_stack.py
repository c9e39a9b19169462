"""What the benchmarks run on: an api in-process, N api workers in a process of their own, and a small
random-weight stand-in for a backbone (`openbook bench api`, services/bench.py); the whole stack in
this process with a client of it (`openbook bench job`, the lab's learning curve)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import redis
import uvicorn
from openbook.backbone import BackboneConfig
from openbook.config_fields import default_of
from openbook.models import save_random_model

from services.api.app import create_app
from services.api.settings import Settings
from services.bench_client import BenchClient
from services.bus.server import EmbeddedRedis, free_port
from services.client import wait_ready
from services.trainer.worker import Worker


class Served:
    """An api under uvicorn in a background thread."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        self.server = uvicorn.Server(uvicorn.Config(self.app, port=settings.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{settings.port}"
        while not self.server.started:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class ServedWorkers:
    """`openbook serve` with `workers` api processes behind one port, in a process of its own; with
    `fronts` > 0, that many front processes on the port before them (services/api/front.py)."""

    def __init__(self, settings: Settings, workers: int, log: Path, fronts: int = 0) -> None:
        environment = {
            "OPENBOOK_FRONT_WORKERS": str(fronts),
            "OPENBOOK_REDIS_URL": settings.redis_url,
            "OPENBOOK_DEFAULT_BACKBONE": settings.default_backbone,
            "OPENBOOK_MAX_LENGTH": str(settings.max_length),
            "OPENBOOK_PORT": str(settings.port),
            "OPENBOOK_API_WORKERS": str(workers),
        }
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve"],
                env={**os.environ, **environment},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.base = f"http://127.0.0.1:{settings.port}"
        if not wait_ready(self.base, timeout=900, alive=lambda: self.process.poll() is None):
            self.stop()
            raise RuntimeError(f"{workers} api workers did not get ready: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def make_stand_in(backbone: str, directory: Path) -> str:
    """A random-weight model in `directory`: `backbone`'s tokenizer and layer types, 2 layers of width 64.

    Its forward of a micro-batch takes milliseconds on a CPU, about what a GPU takes for the real model,
    so the service's own per-request costs weigh as they do there (docs/benchmarks.md).
    """
    small = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16}
    small |= {"num_attention_heads": 4, "num_key_value_heads": 2}
    return str(save_random_model(backbone, directory, shape=small))


@contextlib.contextmanager
def service_stack(
    directory: Path,
    *,
    backbone: str,
    max_length: int = BackboneConfig.max_length,
    device: str | None = None,
    untrained_gate: bool = True,
) -> Iterator[BenchClient]:
    """The embedded Redis, the api on a local port and a worker thread; a client of the api. The device
    and the gate are the service's defaults unless given."""
    device = default_of(BackboneConfig, "device") if device is None else device
    with EmbeddedRedis(directory / "redis") as bus:
        settings = Settings(
            redis_url=bus.url,
            data_dir=directory,
            default_backbone=backbone,
            max_length=max_length,
            device=device,
            port=free_port(),
        )
        served = Served(settings)
        worker = Worker(
            redis.Redis.from_url(bus.url),
            settings.artifacts,
            device=device,
            max_length=max_length,
            untrained_gate=untrained_gate,
        )
        stop = threading.Event()
        training = threading.Thread(target=worker.run_forever, args=(stop,), daemon=True)
        training.start()
        client = BenchClient(served.base, max_batch=settings.max_batch)
        try:
            yield client
        finally:
            client.close()
            stop.set()
            training.join(timeout=120)
            served.stop()
