"""`openbook up` as a subprocess on a tiny backbone, with its children found by the pids it logs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from services.bus.server import free_port

ROLES = {"serve": "api"}  # `services.cli serve` is the api
TASK = {"name": "reviews", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}


def wait_until(condition: Callable[[], object], timeout: float, what: str, poll: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll)


class UpStack:
    """One `openbook up` with embedded Redis under `root`; its output goes to `root/up.log`."""

    def __init__(self, root: Path, backbone: Path, **settings: str) -> None:
        self.root = root
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "up.log"
        self.env = {
            **os.environ,
            "OPENBOOK_DATA_DIR": str(root / "data"),
            "OPENBOOK_DEFAULT_BACKBONE": str(backbone),
            "OPENBOOK_MAX_LENGTH": "48",
            "OPENBOOK_PORT": str(self.port),
            "OPENBOOK_THREADS": "1",
            **{f"OPENBOOK_{name.upper()}": value for name, value in settings.items()},
        }
        for name in ("OPENBOOK_REDIS_URL", "REDIS_URL"):  # the embedded server, not one from outside
            self.env.pop(name, None)
        self.process: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.base, timeout=30)

    def start(self) -> UpStack:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pids(self) -> dict[str, int]:
        """The live children of `up` by role (api, worker, valkey), found in /proc."""
        assert self.process is not None
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except OSError:
                continue  # gone meanwhile
            if int(stat[1]) != self.process.pid or stat[0] == "Z":  # not its child, or dead and unreaped
                continue
            role = "valkey" if b"valkey-server" in command[0] else command[-1].decode()
            found[ROLES.get(role, role)] = int(entry.name)
        return found

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> dict | None:
        """The /readyz body when the api is ready and a trainer worker is alive, else None."""
        try:
            response = self.http.get("/readyz", timeout=2)
        except httpx.TransportError:
            return None
        body = response.json() if response.status_code == 200 else {}
        return body if body.get("workers") else None

    def wait_ready(self, timeout: float = 120) -> dict:
        """Until the api is ready and a worker alive; a failure carries the tail of `up`'s log."""

        def ready() -> dict | None:
            assert self.alive(), f"openbook up exited:\n{self.log()[-3000:]}"
            return self.ready()

        try:
            return wait_until(ready, timeout, "the stack ready")  # type: ignore[return-value]
        except AssertionError as error:
            if not self.alive():
                raise
            raise AssertionError(f"{error}; openbook up said:\n{self.log()[-3000:]}") from None

    def kill(self, child: str) -> int:
        """SIGKILL one child, as a crash would; returns its pid."""
        pid = self.pids()[child]
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_restarted(self, child: str, old_pid: int, timeout: float = 60) -> int:
        def restarted() -> int | None:
            assert self.alive(), f"openbook up exited:\n{self.log()[-3000:]}"
            pid = self.pids().get(child)
            return pid if pid not in (None, old_pid) else None

        return wait_until(restarted, timeout, f"{child} restarted")  # type: ignore[return-value]

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM `up` (it stops its children) and return its exit code."""
        self.http.close()
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
