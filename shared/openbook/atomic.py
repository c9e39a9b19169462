"""Publish a directory atomically: build it beside its target, fsync it, rename it into place.

Readers see the old directory or the new one, never a half-written one: every
file is on disk before the rename publishes it, and an existing target is
moved aside first (and put back if the final rename fails).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def staged_directory(target: Path) -> Iterator[Path]:
    """Yield an empty staging directory; on a clean exit it replaces `target`, on an error it is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # Same parent as the target, so the renames stay on one filesystem and are atomic.
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        yield staging
        for entry in staging.rglob("*"):
            fsync_path(entry)
        fsync_path(staging)
        if target.exists():
            aside = target.parent / f".{target.name}.old-{uuid.uuid4().hex}"
            os.rename(target, aside)
            try:
                os.rename(staging, target)
            except BaseException:
                os.rename(aside, target)  # put the old one back rather than leave none
                raise
            shutil.rmtree(aside)
        else:
            os.rename(staging, target)
        fsync_path(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only still there if something failed
