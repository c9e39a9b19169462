"""Keep child processes running, Kubernetes-style: restart with backoff, give up on a crash loop.

A child that dies is restarted after a delay that starts at `backoff_s` and
doubles with each of its deaths in the last `window_s` (at most 30 s). One
child dying `limit` times within `window_s` is a crash loop, not a crash: the
supervisor then stops every child and returns 1. Each death is logged with
its cause (exit code or signal) and handed to the child's `on_death`, which
cleans up after it (e.g. queues a dead worker's jobs again at once).

A child started in a session of its own leads a process group, and what it starts (uvicorn's api
workers) joins it: the supervisor signals the group, not the child alone, so nothing it started
outlives it. When a child dies, what is left of its group is killed, so that an orphan cannot hold
the port its restart needs. Stopping is bounded: SIGTERM, then SIGKILL after the child's
`stop_timeout_s` (a forward in the middle of a request, or a training job, does not hold it up).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

BACKOFF_CAP_S = 30.0


@dataclass(frozen=True)
class RestartPolicy:
    limit: int = 5  # deaths of one child within window_s that end the supervision
    window_s: float = 60.0
    backoff_s: float = 0.5  # the first restart's delay

    def __post_init__(self) -> None:
        if self.limit < 1 or self.window_s <= 0 or self.backoff_s < 0:
            raise ValueError(f"{self}: limit >= 1, window_s > 0 and backoff_s >= 0 are needed")

    def delay(self, recent_deaths: int) -> float:
        return min(self.backoff_s * 2 ** (recent_deaths - 1), BACKOFF_CAP_S)


@dataclass
class Child:
    name: str
    start: Callable[[], subprocess.Popen]  # raising counts as a death: a start that failed
    on_death: Callable[[str], None] = lambda cause: None
    last_words: Callable[[], str] = lambda: ""  # what it said about its death, e.g. in its log
    stop_timeout_s: float = 5.0  # after SIGTERM, before SIGKILL
    process: subprocess.Popen | None = None
    group: int | None = None  # the process group it leads; None: it shares another's, signalled alone
    deaths: deque[float] = field(default_factory=deque)  # monotonic times, within the policy's window
    restart_at: float | None = None


def cause_of_death(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class Supervisor:
    def __init__(
        self,
        children: Sequence[Child],
        policy: RestartPolicy,
        *,
        log: Callable[[str], None] = print,
        poll_s: float = 0.2,
    ) -> None:
        self.children = list(children)
        self.policy = policy
        self.log = log
        self.poll_s = poll_s
        self.gave_up: str | None = None  # why, once it has

    def run(self, stopping: threading.Event) -> int:
        """Start the children in order and keep them alive until `stopping` is set (0) or a crash loop (1).

        The first child (the server the others talk to) is stopped last, once the others are gone; the
        others are stopped together, so a stop takes at most the largest of their `stop_timeout_s` plus
        the first's.
        """
        try:
            for child in self.children:
                if stopping.is_set() or self.gave_up:
                    break
                self._start(child)
            while not (stopping.is_set() or self.gave_up):
                for child in self.children:
                    if child.process is not None and child.process.poll() is not None:
                        self._died(child, cause_of_death(child.process.returncode))
                    elif child.process is None and (child.restart_at or float("inf")) <= time.monotonic():
                        self._start(child)
                    if self.gave_up:
                        break
                stopping.wait(self.poll_s)
        finally:
            self._stop(self.children[1:])
            self._stop(self.children[:1])
        return 1 if self.gave_up else 0

    def _start(self, child: Child) -> None:
        child.group = None
        try:
            child.process = child.start()
        except Exception as error:
            child.process = None
            self._died(child, f"failed to start: {error}")
            return
        child.restart_at = None
        child.group = _group_led_by(child.process.pid)
        self.log(f"{child.name} started (pid {child.process.pid})")

    def _died(self, child: Child, cause: str) -> None:
        child.process = None
        _sweep_group(child)  # what it started and left behind
        now = time.monotonic()
        child.deaths.append(now)
        while now - child.deaths[0] > self.policy.window_s:
            child.deaths.popleft()
        words = child.last_words()
        self.log(f"{child.name} {cause}" + (f"; its log says: {words}" if words else ""))
        try:
            child.on_death(cause)
        except Exception as error:  # cleaning up after it must not stop the supervision
            self.log(f"{child.name}: cleaning up after its death failed: {type(error).__name__}: {error}")
        recent = len(child.deaths)
        if recent >= self.policy.limit:
            self.gave_up = (
                f"giving up: {child.name} died {recent} times in {now - child.deaths[0]:.0f} s "
                f"(the limit is {self.policy.limit} within {self.policy.window_s:g} s); last: {cause}"
            )
            self.log(self.gave_up)
            return
        delay = self.policy.delay(recent)
        child.restart_at = now + delay
        window = self.policy.window_s
        self.log(f"restarting {child.name} in {delay:g} s ({recent} death(s) in the last {window:g} s)")

    def _stop(self, children: Sequence[Child]) -> None:
        """SIGTERM to each child's group, SIGKILL to those not gone within their `stop_timeout_s`; then
        SIGKILL to whatever the children started and left behind."""
        running = [(child, child.process) for child in children if child.process is not None]
        for child, process in running:
            child.process = None
            if process.poll() is None:
                _signal(child, process, signal.SIGTERM)
        start = time.monotonic()
        for child, process in running:
            try:
                process.wait(max(0.0, start + child.stop_timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(
                    f"{child.name} did not stop within {child.stop_timeout_s:g} s of SIGTERM: killing it"
                )
                _signal(child, process, signal.SIGKILL)
                process.wait()
            _sweep_group(child)


def _group_led_by(pid: int) -> int | None:
    """`pid`'s process group if it leads one (started in a session of its own), else None."""
    try:
        return pid if os.getpgid(pid) == pid else None
    except ProcessLookupError:  # already gone: there is nothing of it to signal
        return None


def _signal(child: Child, process: subprocess.Popen, signum: int) -> None:
    """`signum` to the child's process group, or to the child alone when it leads none."""
    if child.group is None:
        process.send_signal(signum)
    else:
        _signal_group(child, signum)


def _signal_group(child: Child, signum: int) -> None:
    if child.group is not None:
        with contextlib.suppress(ProcessLookupError):  # the group is empty
            os.killpg(child.group, signum)


def _sweep_group(child: Child) -> None:
    """SIGKILL what is left of a dead child's group, and forget the group (its number may be reused)."""
    _signal_group(child, signal.SIGKILL)
    child.group = None
