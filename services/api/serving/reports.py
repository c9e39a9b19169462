"""Reports computed off the request, so that a client can show how far one has got.

An untrained task's report scores every labelled example leave-one-out: over 1,500 examples of 150
labels that is a minute and more on a CPU. `GET /v1/tasks/{task}/report?wait=false` answers 202 with the
examples scored so far while the pass runs, and the report (200) once it is done; without `wait=false`
the request waits for it, as before.

One computation per task runtime and version at a time: a request, waiting or not, joins the one under
way. It runs in a read thread and goes on when the request that started it stops waiting; once done, its
report is kept for the next request to collect (for KEEP_S: a client polls well within that), and the
task's runtime keeps its scores (`TaskRuntime.leave_one_out`), so even a report collected late is
computed again from them, without a second pass. On shutdown each stops at its next chunk (`close`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.api import schemas
from services.api.report import task_report
from services.engine.runtime import TaskRuntime
from services.engine.threads import ReadWriteThreads

CLOSE_WAIT_S = 10.0  # how long shutdown waits for the passes under way to stop at a chunk's end
KEEP_S = 30.0  # how long a report done while nobody waited is kept for the next request


class ReportsClosed(Exception):
    """The api is shutting down: the pass under way stops here."""


@dataclass
class Underway:
    """A report being computed, and how far its leave-one-out pass has got (0 of 0 until it starts, and
    throughout for a report that needs none: a version's, read from its checkpoint)."""

    job: asyncio.Future[schemas.ReportOut]
    started: float = field(default_factory=time.monotonic)
    scored: int = 0
    examples: int = 0
    finished: float | None = None  # when the job ended (time.monotonic)

    def stale(self, now: float) -> bool:
        """Done too long ago for its report to answer a request now."""
        return self.finished is not None and now - self.finished > KEEP_S

    def pending(self, task: str) -> schemas.ReportPending:
        return schemas.ReportPending(
            task=task,
            stage="leave-one-out" if self.examples else "starting",
            scored=self.scored,
            examples=self.examples,
            progress=round(self.scored / self.examples, 4) if self.examples else 0.0,
            elapsed_s=round(time.monotonic() - self.started, 1),
        )


class Reports:
    def __init__(self) -> None:
        self._underway: dict[tuple[int, str | None], Underway] = {}
        self._closing = threading.Event()

    async def report(
        self,
        runtime: TaskRuntime,
        artifacts: Path,
        version: str | None,
        threads: ReadWriteThreads,
        patience: float | None,
    ) -> schemas.ReportOut | Underway:
        """The report, if it is ready within `patience` seconds (None: however long it takes), else what
        is under way. Raises what `task_report` raises (NoReport, StaleRuntime, ...)."""
        key = (id(runtime), version)
        underway = self._underway.get(key)
        if underway is None or underway.stale(time.monotonic()):
            underway = self._start(key, runtime, artifacts, version, threads)
        done, _ = await asyncio.wait({underway.job}, timeout=patience)
        if not done:
            return underway
        if self._underway.get(key) is underway:  # collected: the next request computes it anew
            del self._underway[key]
        return underway.job.result()

    def _start(
        self,
        key: tuple[int, str | None],
        runtime: TaskRuntime,
        artifacts: Path,
        version: str | None,
        threads: ReadWriteThreads,
    ) -> Underway:
        def on_chunk(scored: int, examples: int) -> None:  # in the read thread
            if self._closing.is_set():
                raise ReportsClosed(runtime.task.name)
            underway.scored, underway.examples = scored, examples

        now = time.monotonic()
        for old in [k for k, kept in self._underway.items() if kept.stale(now)]:  # never collected
            del self._underway[old]
        compute = functools.partial(task_report, runtime, artifacts, version, on_chunk)
        underway = Underway(asyncio.ensure_future(threads.read(compute)))
        self._underway[key] = underway
        underway.job.add_done_callback(functools.partial(self._finished, underway))
        return underway

    @staticmethod
    def _finished(underway: Underway, job: asyncio.Future) -> None:
        underway.finished = time.monotonic()
        if not job.cancelled():
            job.exception()  # retrieved: a request that collects it raises it; none may

    async def close(self) -> None:
        """Stop the passes under way at their next chunk, waiting up to CLOSE_WAIT_S for them."""
        self._closing.set()
        jobs = [underway.job for underway in self._underway.values() if not underway.job.done()]
        if jobs:
            await asyncio.wait(jobs, timeout=CLOSE_WAIT_S)
