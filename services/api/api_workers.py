"""Several api processes behind one port (`OPENBOOK_API_WORKERS`): what the workers share.

Each worker is a full replica: its own backbone, micro-batchers and checkpoint follower, converging
with the others through the Redis streams exactly as separate replicas do, so a hot swap, an added
label or a deleted task reaches each worker the way it reaches any replica. `openbook serve` binds
the port once and runs the workers under uvicorn (services/cli/serve.py). What they share is one
directory, made fresh for each run of `serve` and named in the environment they inherit:

    metrics/   prometheus-client's multiprocess files (PROMETHEUS_MULTIPROC_DIR), so `/metrics` on
               any worker sums the counters and histograms of every worker the run has had
    ready/     one file per live worker, `<pid>.json` with its pid and whether it has loaded every
               task and replayed its log; `/readyz` on any worker reads them all

A file is written by its worker and removed when it stops; a reader drops the file of a process that
is gone (killed, or restarted by uvicorn under another pid), so a dead worker never counts as ready.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

POOL_DIR_ENV = "OPENBOOK_API_POOL_DIR"  # set by `openbook serve` for its workers
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own: it reads it when imported


def open_worker_set(directory: Path) -> dict[str, str]:
    """Lay out a fresh directory for a set of api workers; returns the environment its workers need."""
    (directory / "metrics").mkdir(parents=True)
    (directory / "ready").mkdir()
    return {POOL_DIR_ENV: str(directory), METRICS_DIR_ENV: str(directory / "metrics")}


@dataclass(frozen=True)
class ApiWorkerSet:
    """One worker's view of its set: the shared directory and how many workers there should be."""

    directory: Path
    size: int

    @classmethod
    def from_environment(cls, size: int) -> ApiWorkerSet:
        return cls(Path(os.environ[POOL_DIR_ENV]), size)

    @property
    def _ready_dir(self) -> Path:
        return self.directory / "ready"

    def announce(self, ready: bool) -> None:
        """Say whether this worker is ready; readers see the old file or the new one, never half of one."""
        path = self._ready_dir / f"{os.getpid()}.json"
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps({"pid": os.getpid(), "ready": ready}))
        os.replace(scratch, path)

    def leave(self) -> None:
        (self._ready_dir / f"{os.getpid()}.json").unlink(missing_ok=True)

    def members(self, own_ready: bool) -> list[dict]:
        """The live workers by pid, each `{"pid", "ready"}`; this one's readiness is `own_ready`."""
        found = {os.getpid(): {"pid": os.getpid(), "ready": own_ready}}
        for path in self._ready_dir.glob("*.json"):
            try:
                member = json.loads(path.read_text())
            except FileNotFoundError:
                continue  # its worker stopped meanwhile
            if member["pid"] not in found:
                if _alive(member["pid"]):
                    found[member["pid"]] = member
                else:
                    path.unlink(missing_ok=True)
        return [found[pid] for pid in sorted(found)]


def _alive(pid: int) -> bool:
    """Whether process `pid` runs; a zombie (dead, not yet reaped by uvicorn) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (not Linux), or it ended this instant: the next reader drops it
