"""Staging directories on the artifacts volume: who is writing one, and what a crash left behind.

A checkpoint is put together in a staging directory beside its target and
renamed into place; `openbook.atomic.staged_directory` names it
`.<target>.tmp-<uuid hex>` and moves a replaced target aside, for a moment, as
`.<target>.old-<uuid hex>`. A writer killed on the way leaves these behind,
hundreds of MB each. Writers of a task's checkpoints hold a shared lock on
`<artifacts>/.locks/<task>.lock`; a sweep takes it exclusively and without
waiting, so it only touches tasks nobody is writing to, where every staging
directory is a leftover. The kernel drops a dead process's flock: a crashed
writer holds nothing.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCKS_DIR = ".locks"
_STAGING = re.compile(r"^\.(?P<target>.+)\.(?P<kind>tmp|old)-[0-9a-f]{32}$")


@contextmanager
def _flock(artifacts_dir: Path, task: str, mode: int) -> Iterator[bool]:
    """Hold the task's writers' lock in `mode`; yields False when LOCK_NB was given and it is taken."""
    path = artifacts_dir / LOCKS_DIR / f"{task}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, mode)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def writing(artifacts_dir: str | Path, task: str) -> Iterator[None]:
    """Held while a checkpoint of `task` may be written; writers share it, sweeps wait for none of them."""
    with _flock(Path(artifacts_dir), task, fcntl.LOCK_SH):
        yield


def sweep_staging(artifacts_dir: str | Path) -> list[Path]:
    """Remove the staging directories of writers that died, in tasks nobody writes to now."""
    root = Path(artifacts_dir)
    if not root.is_dir():
        return []
    removed = []
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        leftovers = [p for p in sorted(task_dir.iterdir()) if p.is_dir() and _STAGING.match(p.name)]
        if not leftovers:
            continue
        with _flock(root, task_dir.name, fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
            if not free:
                continue  # a live writer: its staging directory is work in progress
            for path in leftovers:
                match = _STAGING.match(path.name)
                assert match is not None
                target = task_dir / match["target"]
                if match["kind"] == "old" and not target.exists():
                    os.rename(path, target)  # the writer died between its two renames: put the old one back
                    continue
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed
